"""Publishing across machines, as CI does it: each cell's job stages its image, and one job
promotes them all once every cell passed.

`publish stage --run ID`: the image is pushed under a staging tag (`<tag>.staging-<ID>`), its
SBOM and self-test report attached to its digest; no versioned tag or alias moves. A cell whose
build ID is already under its versioned tag (`build --skip-existing` did not build it) is staged
by naming that manifest, registry-side, without a local image.

`publish promote --run ID`: the gate reads the registry alone, so the machine that promotes
needs no engine and no image: every cell's staged image must have a passing self-test report
attached for exactly that image (its config digest) and an SBOM. Only then do the versioned tags
take the staged manifests (byte for byte: the same digests), and then the aliases move, last.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import docker

from builder import confined, jsonread, verdict
from builder.assemble import build, smoke
from builder.assemble.build import BUILD_ID_LABEL
from builder.config import grammar
from builder.engine import ids
from builder.errors import UserError
from builder.oci.registry import IMAGE_TYPES, Manifest, Registry
from builder.plan.cell import Cell
from builder.plan.matrix import Matrix
from builder.publish import existing, multiarch, publish, reports, soci, tags, trust
from builder.publish.publication import Publication, tag_suffix
from builder.publish.publish import ARTIFACT_TYPES
from builder.publish.publisher import Publisher, Records
from builder.steps import Report

RUN = grammar.Grammar(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,39}", "a run ID of letters, digits, '_' and '-' (CI's run number)")


def staging_tag(grid: Matrix, cell: Cell, run: str, compression: str = "gzip") -> str:
    return tags.exact(
        f"{multiarch.image_tag(grid, cell, compression)}.staging-{run}", "the staging tag", "give a shorter --run"
    )


STAGED_RECORD_BYTES = 64 << 10


def write_staged(publisher: Publisher, run: str, items: list[Publication], directory: Path) -> list[Path]:
    """What the stage job pushed, one file per staging tag (`<tag>.json`: the tag, the manifest
    digest, the cell, and the sha256 of the SBOM and report it attached), for CI to carry to the
    sign and promote jobs (an artifact): promote then moves only tags that still point at what was
    staged, and the sign job signs only documents with those bytes attached to that digest."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for item in items:
        tag = staging_tag(publisher.grid, item.cell, run, item.compression)
        record: dict[str, Any] = {"tag": tag, "digest": item.digest, "cell": item.cell.name}
        built_on = build.built_by(item.image_id)  # the engine and backend this machine's build recorded
        if built_on:
            record["built_on"] = built_on
        if item.report and publisher.images is not None:  # staged from this engine's image, not the registry's
            documents = publish.made_documents(publisher.images, item)
            record["attached"] = {
                kind: "sha256:" + hashlib.sha256(data).hexdigest() for kind, data in sorted(documents.items())
            }
        path = directory / f"{tag}.json"
        confined.write_text(path, json.dumps(record, sort_keys=True) + "\n")
        written.append(path)
    return written


def read_staged(directory: Path, tag: str) -> str:
    """The digest the stage job recorded for `tag`, or one line saying why there is none."""
    path = directory / f"{tag}.json"
    try:
        with path.open("rb") as handle:
            data = handle.read(STAGED_RECORD_BYTES + 1)
    except OSError:
        raise UserError(
            f"--staged-record {directory}: no {path.name}; the stage job records one per staged tag"
        ) from None
    try:
        record = jsonread.loads(data, str(path)) if len(data) <= STAGED_RECORD_BYTES else None
    except UserError:
        record = None
    digest = record.get("digest") if isinstance(record, dict) and record.get("tag") == tag else None
    if not isinstance(digest, str) or not Registry.is_digest(digest):
        raise UserError(f"{path}: not a staged record of {tag}; write what `publish stage --staged-record` wrote")
    return digest


def check_run(run: str) -> str:
    if not RUN.matches(run):
        raise UserError(f"--run {run!r} is not a run ID: write {RUN.hint}")
    return run


def stage(publisher: Publisher, cells: list[Cell], run: str, dry_run: bool = False) -> list[Publication]:
    """Push each cell built here under its staging tag, its SBOM and report attached (signed
    where the publisher signs); a cell not built here whose build is published is staged by
    naming that manifest. With `dry_run`, say what would be pushed and push nothing."""
    check_run(run)  # one platform at a time is fine here: the index is made only at promotion
    engine, grid = publisher.images, publisher.grid
    local = [c for c in cells if _built_here(engine, grid, c)]
    gated = publish.gate(engine, grid, local)
    for item in gated:
        item.staging_tag = staging_tag(grid, item.cell, run)
    if dry_run:
        lines = publish.would_push(publisher, gated)
        lines[-1:-1] = [f"dry run: {c.name} is not built here: would stage its published build" for c in cells
                        if c not in local]  # fmt: skip
        for line in lines:
            publisher.report(line)
        return []
    # and the zstd forms, where asked (made again, not taken from the cache, when they will be signed)
    items = publish.push_forms(publisher, gated)
    for item in items:
        publish.attach_missing(publisher, item)
        if publisher.signing:
            publish.attach_attestations(publisher, item)
    for cell in (c for c in cells if c not in local):
        items += [_stage_published(publisher, cell, run, compression) for compression in publish.compressions(grid)]
    return items


def _built_here(engine: docker.DockerClient, grid: Matrix, cell: Cell) -> bool:
    try:
        engine.images.get(build.local_reference(grid, cell))
        return True
    except docker.errors.ImageNotFound:
        return False


def _stage_published(publisher: Publisher, cell: Cell, run: str, compression: str) -> Publication:
    """A cell not built here because its build is in the registry: stage that manifest. Its build
    ID is the one `build --skip-existing` found published in this job (kept in the cache), not
    computed again by bootstrapping the base."""
    registry, grid = publisher.registry, publisher.grid
    build_id = build.recorded_in_registry(cell)
    if build_id is None:
        raise UserError(
            f"{cell.name}: not built here, and no build found it in the registry; run `python -m builder build "
            f"--skip-existing {cell.name}` first"
        )
    if not existing.is_published(registry, grid, cell, build_id):
        raise UserError(
            f"{cell.name}: not built here and build ID {build_id[:12]} is not in {grid.spec.registry}; "
            f"run `python -m builder build {cell.name}`"
        )
    published = multiarch.image_tag(grid, cell, compression)
    manifest = registry.manifest(grid.spec.repository, published)
    if manifest is None:
        raise UserError(
            f"{cell.name}: {published} is not in {grid.spec.registry}; run `python -m builder build {cell.name}` "
            "(without --skip-existing) so that it can be made"
        )
    registry.put_manifest(grid.spec.repository, staging_tag(grid, cell, run, compression), manifest)
    publisher.report(
        f"{cell.name}: staged the published {published} ({manifest.digest[:19]}), build ID {build_id[:12]}"
    )
    return Publication(
        cell, "", {}, build_id=build_id, digest=manifest.digest, unchanged=True, image_tag=published,
        compression=compression,
    )  # fmt: skip


def gpu_test(
    publisher: Publisher, cells: list[Cell], run: str, staged_record: Path | None = None, attach: bool = False
) -> list[str | None]:
    """CI's GPU stage, on a runner with GPUs: pull each CUDA cell's staged image by digest and run
    its self-test with every GPU (host checks included). The report, whatever it says, goes to
    `staged_record` (`<tag>.gpu-report.json` per staged form) for the sign job, which attaches and
    signs it running no image; with `attach`, this job attaches it itself, unsigned (a team with
    no key). Returns, per cell, None for a GPU pass, else why not."""
    engine, grid, report, key = publisher.images, publisher.grid, publisher.report, publisher.key
    check_run(run)
    if staged_record is None and not attach:
        raise UserError("gpu-test keeps its report for the sign job (--staged-record DIR) or attaches it (--attach)")
    cpu = [cell.name for cell in cells if not cell.is_cuda]
    if cpu:
        raise UserError(f"{', '.join(cpu)}: a CPU image has no GPU stage; name CUDA cells")
    if not smoke.has_nvidia_runtime(engine):
        raise UserError(
            "the engine has no NVIDIA runtime, so no container sees a GPU: run this on a GPU runner with the "
            "NVIDIA container toolkit (nvidia-ctk runtime configure --runtime=docker)"
        )
    results: list[str | None] = []
    for cell in cells:
        forms = staged_forms(publisher, cell, run)
        manifest, image_id = forms[0][1], forms[0][2]
        if key is not None:  # a GPU report signed for an image someone swapped in would vouch for it
            evidence = trust.signed_evidence(publisher.door, manifest, image_id, cell, key)
            if evidence.provenance_problem is not None:
                raise UserError(f"{cell.name}: {forms[0][0]} ({manifest.digest[:19]}): "
                                f"{evidence.provenance_problem}; not tested, nothing attached")  # fmt: skip
            # A digest a merge did not change already carries the key's passing GPU report: testing
            # it again would only add one more report per run, up to the cap the gates refuse past.
            passed_on = [r for r in evidence.reports if verdict.why_not_a_gpu_pass(r, image_id) is None]
            if passed_on:
                report(f"{cell.name}: {manifest.digest[:19]} already carries a GPU pass signed by the key "
                       f"({passed_on[0].get('device')}); not tested again")  # fmt: skip
                results.append(None)
                continue
        if publisher.dry_run:
            then = [
                *([f"keep its report in {staged_record}"] if staged_record else []),
                *(["attach it"] if attach else []),
            ]
            report(f"dry run: would self-test {forms[0][0]} ({manifest.digest[:19]}) with every GPU here, then "
                   f"{' and '.join(then)}; nothing was run or written")  # fmt: skip
            results.append(None)
            continue
        result, build_id = _test_on_gpus(publisher, cell, manifest, image_id)
        if staged_record is not None:
            for tag, form, _ in forms:
                write_gpu_report(staged_record, tag, form.digest, result)
        if attach:
            for (tag, form, _), compression in zip(forms, publish.compressions(grid), strict=True):
                publisher.door.attach_report(form, tag, result, build_id, cell.tag + tag_suffix(compression))
        why = verdict.why_not_a_gpu_pass(result, image_id)
        judged = "pass" if why is None else f"not a pass: {why}"
        where = "attached to " + ", ".join(f[1].digest[:19] for f in forms) if attach else f"kept in {staged_record}"
        report(f"{cell.name}: GPU self-test {judged}, {where}")
        results.append(why)
    return results


def staged_forms(publisher: Publisher, cell: Cell, run: str) -> list[tuple[str, Any, str]]:
    """(staging tag, manifest, image ID) of each staged form of the cell (gzip first, and zstd where
    the matrix asks), each read from the registry, all of one image ID."""
    registry, grid = publisher.registry, publisher.grid
    forms: list[tuple[str, Any, str]] = []
    for compression in publish.compressions(grid):
        tag = staging_tag(grid, cell, run, compression)
        manifest = registry.manifest(grid.spec.repository, tag)
        if manifest is None or manifest.media_type not in IMAGE_TYPES:
            raise UserError(f"{cell.name}: {tag} is not one image in {grid.spec.registry}; stage it first")
        image_id = json.loads(manifest.body)["config"]["digest"]
        if forms and image_id != forms[0][2]:
            raise UserError(f"{cell.name}: {tag} is not image {forms[0][2][7:19]}, as {forms[0][0]} is; nothing tested")
        forms.append((tag, manifest, image_id))
    return forms


def _test_on_gpus(publisher: Publisher, cell: Cell, manifest: Any, image_id: str) -> tuple[dict[str, Any], str]:
    """Pull the staged image by digest, check it is `image_id`, self-test it with every GPU;
    returns the report and the image's build ID label."""
    engine, registry, grid = publisher.images, publisher.registry, publisher.grid
    repository = grid.spec.repository
    reference = f"{grid.spec.registry}/{repository}@{manifest.digest}"
    publisher.report(f"{cell.name}: pulling {reference}")
    found = registry.credentials
    auth = {"username": found.username, "password": found.password} if found else None
    try:
        engine.images.pull(f"{grid.spec.registry}/{repository}", tag=manifest.digest, auth_config=auth)
        pulled = engine.images.get(reference)
    except docker.errors.APIError as error:
        raise UserError(f"{cell.name}: the engine could not pull {reference}: {error.explanation or error}") from None
    pulled_id = ids.config_digest(engine, reference)
    if pulled_id != image_id:
        raise UserError(f"{cell.name}: {reference} pulled as image {pulled_id[7:19]}, staged as {image_id[7:19]}")
    result = smoke.run(engine, reference, gpus=True)
    return result.report, str((pulled.labels or {}).get(BUILD_ID_LABEL, ""))


GPU_REPORT_RECORD_BYTES = verdict.MAX_REPORT_BYTES + (4 << 10)


def write_gpu_report(directory: Path, tag: str, digest: str, report: dict[str, Any]) -> Path:
    """The GPU stage's report for one staged form (`<tag>.gpu-report.json`), for the sign job."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{tag}.gpu-report.json"
    confined.write_text(path, json.dumps({"tag": tag, "digest": digest, "report": report}, sort_keys=True) + "\n")
    return path


def read_gpu_report(directory: Path, tag: str) -> dict[str, Any] | None:
    """The GPU report the GPU stage kept for `tag`, or None where it kept none; a record that is
    not the GPU stage's is refused in one line. What it says is the GPU runner's word: the sign
    job checks it is about the staged image before it signs it."""
    path = directory / f"{tag}.gpu-report.json"
    if not path.exists() and not path.is_symlink():
        return None
    record = jsonread.loads(confined.read_bytes(path, GPU_REPORT_RECORD_BYTES), str(path))
    report = record.get("report") if isinstance(record, dict) and record.get("tag") == tag else None
    if not isinstance(report, dict) or verdict.report_kind(report) != "gpu":
        raise UserError(f"{path}: not a GPU report of {tag}; write what `publish gpu-test --staged-record` wrote")
    return report


def gate_in_registry(
    publisher: Publisher, cells: list[Cell], run: str, staged_record: Path | None = None
) -> list[Publication]:
    """Every cell staged in this run, with a passing self-test of exactly that image and an SBOM
    attached to its digest; refuses them all, naming each one, otherwise. With `key`, the
    reports are those the key signed about that digest, and the signed provenance must hold."""
    check_run(run)
    grid = publisher.grid
    multiarch.check_complete(grid, cells, "promote")
    ready, refused = [], []
    for cell in cells:
        for compression in publish.compressions(grid):
            found = _staged(publisher, cell, run, compression, staged_record)
            if isinstance(found, str):
                refused.append(f"{cell.name}: {found}")
            else:
                ready.append(found)
    if refused:
        raise UserError("refused, nothing promoted: " + " | ".join(refused))
    return ready


def _staged(
    publisher: Publisher, cell: Cell, run: str, compression: str, staged_record: Path | None = None
) -> Publication | str:
    """The cell's staged form as a Publication when the gate lets it move, else why not."""
    registry, grid, door, key = publisher.registry, publisher.grid, publisher.door, publisher.key
    repository, tag = grid.spec.repository, staging_tag(grid, cell, run, compression)
    manifest = registry.manifest(repository, tag)
    if manifest is None:
        return f"not staged ({tag} is not in {grid.spec.registry})"
    if staged_record is not None:
        recorded = read_staged(staged_record, tag)
        if manifest.digest != recorded:
            return f"{tag} now points at {manifest.digest[:19]}, the stage job pushed {recorded[:19]}"
    if manifest.media_type not in IMAGE_TYPES:
        return f"{tag} is a {manifest.media_type}, not one image"
    image_id = json.loads(manifest.body)["config"]["digest"]
    # Without a key the gate reads the reports themselves below: their listing is not read twice.
    required = (("sbom", "SBOM"),) if key is None else (("sbom", "SBOM"), ("selftest", "self-test report"))
    for kind, what in required:
        listed = door.listed(manifest.digest, [ARTIFACT_TYPES[kind]])[: publish.MAX_LISTED]
        if not door.proven(manifest.digest, listed, [ARTIFACT_TYPES[kind]]):
            return f"no {what} attached to {manifest.digest[:19]}"
    # by digest: the label of the manifest gated here, even if the tag has moved since
    build_id = existing.published_build_id(registry, repository, manifest.digest) or ""
    if key is None:
        found_reports = door.reports(manifest.digest)
        if not found_reports:
            return f"no self-test report attached to {manifest.digest[:19]}"
    else:
        evidence = trust.signed_evidence(door, manifest, image_id, cell, key)
        if evidence.provenance_problem is not None:
            return f"{evidence.provenance_problem} on {manifest.digest[:19]}"
        needed = required_rebuilds(grid)
        if needed:
            agreed = trust.agreeing_rebuilds(door, manifest.digest, image_id, trust.rebuilders(grid, key))
            if len(agreed) < needed:
                return (
                    f"publish.require_rebuilds is {needed}; {manifest.digest[:19]} carries signed rebuilds that "
                    f"gave its image ID from {len(agreed)} rebuilder key(s): {trust.agreement_line(agreed)}"
                )
            publisher.report(
                f"{cell.name}: {image_id[7:19]} rebuilt to the same image ID by {trust.agreement_line(agreed)}, "
                "and staged on the stage's builder (its signed provenance)"
            )
        found_reports = evidence.reports
    gated = reports.gate(found_reports, image_id, cell.gpu_gate)
    if isinstance(gated, str):
        return gated if key is None else f"{gated} (signed reports only)"
    return Publication(
        cell, image_id, gated.report, build_id=build_id, digest=manifest.digest,
        image_tag=multiarch.image_tag(grid, cell, compression), gpu_report=gated.gpu_report, compression=compression,
    )  # fmt: skip


def required_rebuilds(grid: Matrix) -> int:
    """Rebuilder keys whose signed rebuilds a tag waits for: publish.require_rebuilds, and at least
    the one the emitted CI's rebuild job makes where ci.rebuild_check is on."""
    return max(grid.spec.publish.require_rebuilds, 1 if grid.spec.ci.rebuild_check else 0)


def promote(
    publisher: Publisher,
    cells: list[Cell],
    run: str,
    records: Records | None = None,
    staged_record: Path | None = None,
    dry_run: bool = False,
) -> list[Publication]:
    """Move each cell's versioned tags to its staged image once the gate, read from the registry
    alone (signed evidence only, with the publisher's key), lets every one of them move. With
    `dry_run`, the gate runs as it would and the moves are said, and nothing is written."""
    registry, grid, report = publisher.registry, publisher.grid, publisher.report
    if publisher.key is None:
        report(
            "promote reads the reports as attached, unsigned: anyone who can push could have attached them; "
            f"give the team's public key (--key, or {trust.KEY_ENVIRONMENT}) to trust only what it signed"
        )
        if required_rebuilds(grid):
            raise UserError(
                "publish.require_rebuilds counts rebuilds only beside the team's signed provenance: give the "
                f"team's public key (--key, or {trust.KEY_ENVIRONMENT}); nothing promoted",
                grid.path,
            )
    items = gate_in_registry(publisher, cells, run, staged_record)
    repository = grid.spec.repository
    if dry_run:
        for line in _would_promote(publisher, items):
            report(line)
        return []
    enabled = _staged_enabled_images(publisher, items, run)  # before anything moves
    for item in items:
        # Each cell's versioned tag first, then what names it (its artifacts' tags, its SOCI form);
        # the aliases go last of all. A promote cut anywhere leaves no name ahead of its versioned
        # tag, and the same promote again finishes it: an unchanged tag's names are put again.
        staged_tag = staging_tag(grid, item.cell, run, item.compression)
        current = registry.manifest(repository, item.target)
        item.unchanged = current is not None and current.digest == item.digest
        if not item.unchanged:
            staged = registry.manifest(repository, staged_tag)
            if staged is None or staged.digest != item.digest:
                raise UserError(f"{repository}:{staged_tag} changed while promoting; nothing moved")
            registry.put_manifest(repository, item.target, staged)
            report(f"{item.target} -> {item.digest[:19]}")
        _name_artifacts(registry, repository, item, staged_tag)
        if item.target in enabled:
            _move(registry, repository, soci.enabled_tag(item.target), enabled[item.target], report)
    multiarch.push_indexes(registry, grid, items, report)
    publish.finish(publisher, items, records)
    return items


def _staged_enabled_images(publisher: Publisher, items: list[Publication], run: str) -> dict[str, Manifest]:
    """With `publish.soci` v2: each gzip item's SOCI-enabled image as staged (`<staging tag>-soci`),
    shown to be the staged image's; a missing or foreign one stops the promote before any move."""
    spec, registry, repository = publisher.grid.spec.publish, publisher.registry, publisher.repository
    if not spec.soci or spec.soci_index == "v1":
        return {}
    found = {}
    for item in (i for i in items if i.compression == "gzip"):
        staged_tag = soci.enabled_tag(staging_tag(publisher.grid, item.cell, run, item.compression))
        image = registry.manifest(repository, item.digest)
        enabled = registry.manifest(repository, staged_tag)
        if image is None or enabled is None or soci.enabled_ztocs(registry, repository, staged_tag, image) is None:
            raise UserError(
                f"{repository}:{staged_tag} is not the SOCI-enabled form of the staged image (publish.soci); run "
                "`publish stage` again; nothing moved"
            )
        found[item.target] = enabled
    return found


def _move(registry: Registry, repository: str, tag: str, manifest: Manifest, report: Report) -> None:
    current = registry.manifest(repository, tag)
    if current is None or current.digest != manifest.digest:
        registry.put_manifest(repository, tag, manifest)
        report(f"{tag} -> {manifest.digest[:19]}")


def _would_promote(publisher: Publisher, items: list[Publication]) -> list[str]:
    """What promote would move, in the order it would: the versioned tags, then the aliases."""
    registry, repository = publisher.registry, publisher.repository
    lines = []
    for item in items:
        current = registry.manifest(repository, item.target)
        was = current.digest[:19] if current else "nothing"
        same = current is not None and current.digest == item.digest
        lines.append(
            f"dry run: {item.target}: {'stays at' if same else f'would move from {was} to'} {item.digest[:19]}"
        )
    for tag, item in {item.tag: item for item in items}.items():
        points = "its multi-arch index" if multiarch.is_multiarch(publisher.grid, item.cell) else tag
        if item.aliases:
            lines.append(f"dry run: then {', '.join(item.aliases)} would point at {points}")
    return [*lines, "dry run: nothing was written"]


def _name_artifacts(registry: Registry, repository: str, item: Publication, staged: str) -> None:
    """The attached SBOM and reports also under the versioned tag's names (`<tag>.sbom`,
    `<tag>.selftest`, `<tag>.selftest-gpu-<model>`), for tools that find artifacts by tag rather
    than through the referrers API: each is what its staging name holds."""
    names = [(f"{staged}.sbom", f"{item.target}.sbom")]
    names += [
        (reports.artifact_tag(staged, r), reports.artifact_tag(item.target, r))
        for r in (item.report, item.gpu_report) if r
    ]  # fmt: skip
    for source, target in names:
        manifest = registry.manifest(repository, source)
        if manifest is not None:
            _move(registry, repository, target, manifest, lambda _: None)
