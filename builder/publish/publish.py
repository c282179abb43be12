"""Publish: gated, verified pushes of versioned tags, then aliases, then a record.

Order of events, so that a failure anywhere leaves the registry consistent:
1. the gate: every image must have a passing self-test report for its exact image ID, and the
   registry must answer and accept the credentials, before anything is pushed;
2. each versioned tag is pushed by the engine and its digest read back from the registry;
3. the SBOM and the self-test report are pushed beside the image as OCI artifacts;
4. only then do aliases move, each by putting the verified manifest under the alias; if one
   fails, the aliases already moved are put back where they were;
5. a publish record is written and the README's table of published tags regenerated.
An image whose tags and aliases already point at its digest is left alone.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
from securesystemslib.signer import CryptoSigner

from builder import confined, jsonread, times, verdict
from builder.assemble import smoke
from builder.assemble.build import BUILD_ID_LABEL, local_reference
from builder.config import platform as platforms
from builder.config import vex
from builder.engine import ids
from builder.errors import UserError
from builder.lock import audit
from builder.lock import requirements as lock
from builder.oci.registry import Manifest, Registry
from builder.plan.cell import Cell
from builder.plan.matrix import Matrix
from builder.publish import attachments, multiarch, provenance, recompress, reports, sbom, soci
from builder.publish.publication import Publication
from builder.publish.publisher import Publisher, Records
from builder.steps import Report
from builder.terminal import code_text, markdown_text

TABLE_START, TABLE_END = "<!-- published-tags:start -->", "<!-- published-tags:end -->"


def gate(engine: docker.DockerClient, grid: Matrix, cells: list[Cell]) -> list[Publication]:
    """Every image must exist and have passed its self-test for exactly this image ID; and what
    publish.soci needs must be here, before anything is sent."""
    if grid.spec.publish.soci:
        soci.tools(engine)
    ready, refused, want_gpu, unbuilt = [], [], [], []
    for cell in cells:
        reference = local_reference(grid, cell)
        try:
            image_id = ids.config_digest(engine, reference)
        except docker.errors.ImageNotFound:
            unbuilt.append(cell.name)  # said once for all of them, below
            continue
        report = smoke.passing_report(image_id)
        if report is None:
            refused.append(
                f"{cell.name}: no passing self-test for image {image_id[7:19]}; "
                f"run `python -m builder smoke {cell.name}`"
            )
            continue
        gated = reports.gate([report], image_id, cell.gpu_gate)
        if isinstance(gated, reports.GpuMissing):
            want_gpu.append(cell.name)  # said once for all of them, below
            continue
        if isinstance(gated, str):
            refused.append(f"{cell.name}: {gated}")
            continue
        labels = engine.images.get(reference).labels or {}
        build_id = labels.get(BUILD_ID_LABEL, "")
        ready.append(
            Publication(
                cell, image_id, gated.report, build_id, image_tag=multiarch.image_tag(grid, cell),
                gpu_report=gated.gpu_report,
            )
        )  # fmt: skip
    if unbuilt:
        refused.append(_not_built(unbuilt))
    if want_gpu:  # a machine without a GPU refuses every CUDA cell for one reason: said once
        refused.append(
            f"{len(want_gpu)} CUDA cell{'s' if len(want_gpu) > 1 else ''} ({', '.join(want_gpu)}) need a passing GPU "
            "self-test, which this machine cannot give: publish them from CI (`publish stage`, then the GPU stage, "
            "`publish gpu-test`, on a GPU runner), run `build` on a GPU machine, or list them under ci.gpu_optional"
        )
    if refused:
        raise UserError("refused, nothing pushed: " + " | ".join(refused))
    return ready


NAMED_AT_MOST = 3  # cells a refusal names before it counts the rest


def _not_built(cells: list[str]) -> str:
    """One clause for every cell with no image here, naming a few: `--all` on a fresh machine
    would otherwise print a line per cell of the matrix."""
    named = ", ".join(cells[:NAMED_AT_MOST]) + (
        f" and {len(cells) - NAMED_AT_MOST} more" if len(cells) > NAMED_AT_MOST else ""
    )
    if len(cells) == 1:
        return f"{named}: not built; run `python -m builder build {named}`"
    return f"{len(cells)} cells not built ({named}); run `python -m builder build CELL...` or `build --all`"


PUSH_PROGRESS_S = 10.0  # how often a layer's upload says how far it got


def _engine_push(
    engine: docker.DockerClient, repository: str, tag: str, auth: dict[str, str] | None, report: Report = print
) -> str:
    """Push one tag through the engine; returns the digest the engine reports. Each layer says
    when it is done (or already there), and a long upload how far it got every 10 seconds."""
    digest, error, said = "", "", 0.0
    for chunk in engine.api.push(repository, tag=tag, stream=True, decode=True, auth_config=auth):
        if "error" in chunk:
            error = chunk["error"]
        if "aux" in chunk and "Digest" in chunk["aux"]:
            digest = chunk["aux"]["Digest"]
        status, layer = str(chunk.get("status", "")), str(chunk.get("id", ""))[:12]
        if status in ("Pushed", "Layer already exists", "Mounted from"):
            report(f"layer {layer}: {status.lower()}")
        elif status == "Pushing" and time.monotonic() - said > PUSH_PROGRESS_S:
            detail = chunk.get("progressDetail") or {}
            current, total = detail.get("current"), detail.get("total")
            if isinstance(current, int) and isinstance(total, int) and total > 0:
                report(f"layer {layer}: {current / 1e6:.0f} of {total / 1e6:.0f} MB")
                said = time.monotonic()
    if error:
        if re.search(r"unauthorized|authentication required|denied", error, re.I):
            raise UserError(f"registry refused the credentials while pushing {repository}:{tag}: {error}")
        raise UserError(f"push of {repository}:{tag} failed: {error}")
    return digest


def push_image(publisher: Publisher, item: Publication) -> None:
    """Push the image under its tag, unless the tag already holds this image (its config). When
    what is pushed will be signed, the tag's manifest is not taken on trust (anyone who can push
    could have put this config over other layers there): the engine pushes, sending only the
    layers the registry lacks, and the manifest it pushes is the one signed."""
    engine, registry, grid, report = publisher.images, publisher.registry, publisher.grid, publisher.report
    tag = item.target
    current = registry.manifest(grid.spec.repository, tag)
    # The same config is the same image.
    if not publisher.signing and current and _config_digest(current) == item.image_id:
        item.digest, item.unchanged = current.digest, True
        return
    in_engine = ids.engine_id(engine, item.image_id)
    item.digest = push_engine_image(engine, registry, grid.spec.repository, in_engine, tag, report)
    item.unchanged = current is not None and current.digest == item.digest


def push_engine_image(
    engine: docker.DockerClient, registry: Registry, name: str, in_engine: str, tag: str, report: Report
) -> str:
    """Push the engine's image `in_engine` under `tag` in the registry's repository `name`;
    returns the digest the registry then serves under the tag (checked against what the engine
    pushed)."""
    repository = f"{registry.host}/{name}"
    if not ids.engine_names_by_config(engine.api.inspect_image(in_engine)):
        # The containerd image store pushes layers as they were loaded, uncompressed: the builder
        # compresses and uploads them itself.
        report(f"pushing {repository}:{tag} (gzip, compressed by the builder)")
        manifest = recompress.push_gzip_form(engine, registry, name, in_engine, report)
        registry.put_manifest(name, tag, manifest)
        return manifest.digest
    found = registry.credentials
    auth = {"username": found.username, "password": found.password} if found else None
    report(f"pushing {repository}:{tag}")
    pushed = ""
    with _named_for_the_push(engine, in_engine, repository, tag):
        for attempt in range(3):  # the engine retries layers itself; this covers a dropped connection
            try:
                pushed = _engine_push(engine, repository, tag, auth, report)
                break
            except UserError as error:
                if "credentials" in error.message or attempt == 2:
                    raise
                report(f"push interrupted ({error.message}); retrying")
    verified = registry.manifest(name, tag)
    if verified is None or (pushed and verified.digest != pushed):
        raise UserError(
            f"{repository}:{tag}: the registry holds {verified.digest if verified else 'nothing'}, "
            f"the engine pushed {pushed}; aliases left where they were"
        )
    return verified.digest


@contextlib.contextmanager
def _named_for_the_push(engine: docker.DockerClient, in_engine: str, repository: str, tag: str) -> Iterator[None]:
    """The engine pushes by name: the image is named `repository:tag` for the push, and the name
    goes again however the push ends (finished, failed or interrupted), or goes back to the image
    it named before. A publish leaves the engine's names as it found them."""
    name = f"{repository}:{tag}"
    try:
        before: str | None = engine.images.get(name).id
    except docker.errors.ImageNotFound:
        before = None
    engine.images.get(in_engine).tag(repository, tag)
    try:
        yield
    finally:
        with contextlib.suppress(docker.errors.APIError):
            if before is None:
                engine.api.remove_image(name, noprune=True)
            else:
                engine.api.tag(before, repository, tag, force=True)


def _config_digest(manifest: Manifest) -> str | None:
    """An image manifest's config digest, which is the engine's image ID; None for an index."""
    config = json.loads(manifest.body).get("config") or {}
    digest: str | None = config.get("digest")
    return digest


ARTIFACT_TYPES = {"sbom": "application/vnd.cyclonedx+json", "selftest": reports.SELFTEST_TYPE}
MAX_LISTED = 256  # referrers of one type read for the builder's own artifact; more is someone's flood


def missing_artifacts(door: attachments.Door, item: Publication, documents: dict[str, bytes]) -> list[str]:
    """Which of the image's SBOM and self-test report (`documents`: the bytes the builder made
    for each kind) the registry lacks, attached to its digest: a publish is complete only when
    both are there. An artifact counts only when it proves to be these bytes attached to this
    digest: another party's SBOM listed first is not the image's SBOM."""
    return [
        kind
        for kind, media_type in ARTIFACT_TYPES.items()
        if not door.carries(item.digest, media_type, documents[kind], MAX_LISTED)
    ]


def made_documents(engine: docker.DockerClient, item: Publication) -> dict[str, bytes]:
    """The SBOM and self-test report the builder attaches to the item, as the bytes it pushes and
    signs: made here from the engine's image and the cell's locks, never read back from a registry."""
    key = (item.image_id, item.tag, item.cell.name)
    if key not in _made_sboms:  # one image's SBOM is made once a run (it runs dpkg-query in the image)
        locks = [p for p in (item.cell.directory / lock.STACK_LOCK, item.cell.directory / lock.FLAVOR_LOCK)
                 if p.exists()]  # fmt: skip
        document = sbom.build_sbom(engine, ids.engine_id(engine, item.image_id), item.cell, locks, item.tag)
        _made_sboms[key] = json.dumps(document, sort_keys=True).encode()
    return {"sbom": _made_sboms[key], "selftest": reports.document_bytes(item.report)}


_made_sboms: dict[tuple[str, str, str], bytes] = {}


def _subject(publisher: Publisher, item: Publication) -> Manifest:
    """The manifest the item pushed, as the registry serves it now: what its attachments name."""
    subject = publisher.registry.manifest(publisher.repository, item.target)
    if subject is None or subject.digest != item.digest:
        raise UserError(f"{publisher.repository}:{item.target} changed while publishing; aliases left where they were")
    return subject


def attach_attestations(publisher: Publisher, item: Publication) -> None:
    """Signed provenance, a signed statement of each report the item carries, and its SBOM signed,
    for what the digest lacks (a rerun with a key signs an image published without one). What is
    signed is only what the builder made: the SBOM it makes from the image, the reports it holds.
    What the digest already has is what the key verifies about it, never what annotations say."""
    grid, door, signer, report = publisher.grid, publisher.door, publisher.signer, publisher.report
    if signer is None:
        raise UserError("attestations are signed with the team's key, and none was given")
    repository = grid.spec.repository
    have = door.verified_kinds(item.digest, item.image_id, signer.public_key)
    subject = _subject(publisher, item)
    about = provenance.Subject(f"{grid.spec.registry}/{repository}", item.digest, item.image_id, item.build_id)
    signed = []
    if provenance.PROVENANCE not in have:
        statement = provenance.provenance_statement(about, item.cell, provenance.builder_version())
        door.attach_statement(subject, f"{item.target}.provenance", statement, signer)
        signed.append("provenance")
    if provenance.SELFTEST not in have:
        for found in (item.report, item.gpu_report):
            if found:
                door.attach_signed_report(subject, item.target, about, found, signer)
                signed.append(f"{verdict.report_kind(found)} self-test")
    if provenance.CYCLONEDX not in have:  # the SBOM the builder made and attached
        cyclonedx = jsonread.loads(made_documents(publisher.images, item)["sbom"], "the SBOM")
        attach_signed_sbom(door, subject, item.target, about, cyclonedx, signer)
        signed.append("SBOM (CycloneDX, SPDX)")
    decisions = [d for d in vex.load(grid.path) if d.applies_to(item.cell.name)]
    if decisions and provenance.OPENVEX not in have:
        python_packages = set(audit.locked_wheels(item.cell))
        epoch = grid.spec.source_date_epoch
        statement = provenance.openvex_statement(about, decisions, python_packages, item.cell, epoch)
        door.attach_statement(subject, f"{item.target}.vex.att", statement, signer)
        signed.append(f"VEX ({len(decisions)} not affected)")
    if signed:
        report(f"signed and attached {', '.join(signed)} to {item.target} ({item.digest[:19]})")
    else:
        report(f"signed nothing for {item.target} ({item.digest[:19]}): it carries every statement, each verified "
               "with the key")  # fmt: skip


def attach_signed_sbom(
    door: attachments.Door, subject: Manifest, target: str, about: provenance.Subject, cyclonedx: dict[str, Any],
    signer: CryptoSigner,
) -> None:  # fmt: skip
    """An image's SBOM signed twice: as CycloneDX, and as SPDX 2.3 made from it (`<target>.sbom.cdx.att`,
    `<target>.sbom.spdx.att`)."""
    namespace = f"https://torch-images.invalid/spdx/{subject.digest}"
    for predicate_type, document, name in (
        (provenance.CYCLONEDX, cyclonedx, "sbom.cdx"),
        (provenance.SPDX, sbom.spdx_of(cyclonedx, namespace), "sbom.spdx"),
    ):
        statement = provenance.sbom_statement(about, predicate_type, document)
        door.attach_statement(subject, f"{target}.{name}.att", statement, signer)


def _push_metadata(publisher: Publisher, item: Publication, kinds: list[str], documents: dict[str, bytes]) -> None:
    subject, door = _subject(publisher, item), publisher.door
    annotations = {"org.opencontainers.image.ref.name": item.tag, "io.torch-images.build-id": item.build_id}
    if "selftest" in kinds:
        door.attach_report(subject, item.target, item.report, item.build_id, item.tag)
    if "sbom" in kinds:
        door.attach(subject, f"{item.target}.sbom", documents["sbom"], ARTIFACT_TYPES["sbom"], annotations)


def _move_aliases(publisher: Publisher, items: list[Publication]) -> None:
    registry, repository, report = publisher.registry, publisher.repository, publisher.report
    previous: list[tuple[str, Manifest | None]] = []
    # The platforms of a multi-arch tag share its aliases (the plan checks it): moved once.
    by_tag = {item.tag: item for item in items}
    try:
        for tag, item in by_tag.items():
            target = registry.manifest(repository, tag)
            if target is None or target.digest != item.points_to:
                raise UserError(f"{repository}:{tag} changed while publishing; aliases left where they were")
            for alias in item.aliases:
                before = registry.manifest(repository, alias)
                if before and before.digest == item.points_to:
                    continue
                registry.put_manifest(repository, alias, target)
                previous.append((alias, before))  # only aliases that did move need putting back
                for sharing in (i for i in items if i.tag == tag):
                    sharing.moved_aliases.append(alias)
                report(f"moved {alias} -> {item.points_to[:19]}")
    except UserError:
        for alias, before in reversed(previous):
            if before is not None:
                with contextlib.suppress(UserError):  # put back as many as the registry takes
                    registry.put_manifest(repository, alias, before)
        raise


def zstd_form(grid: Matrix, item: Publication) -> Publication:
    """The same image as `item` (the gzip form the engine pushes), with zstd layers under tags of its own."""
    form = Publication(
        item.cell, item.image_id, item.report, item.build_id, gpu_report=item.gpu_report, compression="zstd"
    )
    form.image_tag = multiarch.image_tag(grid, item.cell, form.compression)
    if item.staging_tag:
        form.staging_tag = f"{form.image_tag}{item.staging_tag.removeprefix(item.image_tag)}"
    too_long = [tag for tag in (form.target, *form.aliases) if len(tag) > 128]
    if too_long:
        raise UserError(f"{too_long[0]}: a tag has at most 128 characters; shorten the tag template; nothing pushed")
    return form


def push_zstd(publisher: Publisher, source: Publication, form: Publication) -> None:
    """The zstd form of `source` (already in the registry) under `form.target`: compressed and
    uploaded by the builder (the engine here pushes gzip only), the config blob the same. When
    what is pushed will be signed, neither the zstd cache nor the tag's current manifest is taken
    on trust: the form is made here again, and is `unchanged` only if its digest is the tag's."""
    registry, grid, repository, signing = publisher.registry, publisher.grid, publisher.repository, publisher.signing
    current = registry.manifest(repository, form.target)
    if not signing and current is not None and recompress.is_zstd_form(current, form.image_id):
        form.digest, form.unchanged = current.digest, True
        return
    gzip_form = registry.manifest(repository, source.digest)
    if gzip_form is None:
        raise UserError(f"{repository}@{source.digest} is not in {registry.host}; its zstd form not pushed")
    level = grid.spec.publish.zstd_level
    publisher.report(f"pushing {grid.spec.registry}/{repository}:{form.target} (zstd level {level})")
    how = recompress.Recompression(level, publisher.report, trust_cache=not signing)
    manifest = recompress.push_zstd_form(publisher.images, registry, repository, gzip_form, how)
    if current is not None and current.digest == manifest.digest:
        form.digest, form.unchanged = current.digest, True
        return
    registry.put_manifest(repository, form.target, manifest)
    form.digest = manifest.digest


def compressions(grid: Matrix) -> list[str]:
    """The forms each image is published in: gzip always, zstd too where the matrix asks."""
    return ["gzip", "zstd"] if grid.spec.publish.compression == "zstd" else ["gzip"]


def push_forms(publisher: Publisher, items: list[Publication]) -> list[Publication]:
    """Each image through the engine (gzip), then, where the matrix asks for zstd, its zstd form;
    returns every form pushed, gzip first."""
    grid = publisher.grid
    forms = [zstd_form(grid, item) for item in items] if "zstd" in compressions(grid) else []
    for item in items:
        push_image(publisher, item)
    for item, form in zip(items, forms, strict=False):
        push_zstd(publisher, item, form)
    return [*items, *forms]


@dataclass(frozen=True)
class PublishOptions:
    """How `publish` reaches the registry (a CA file, or plain HTTP for a loopback one), where it
    writes its records, and the team's key to sign with (None: unsigned)."""

    records: Records = field(default_factory=Records)
    ca_file: Path | None = None
    insecure: bool = False
    signer: CryptoSigner | None = None
    dry_run: bool = False  # gate and read the registry, say what would be pushed, write nothing


def would_push(publisher: Publisher, items: list[Publication]) -> list[str]:
    """What pushing the gated `items` would do, read from the registry, in the order it would be
    done; nothing is written. A form whose tag already holds the image (its config) is pushed
    again only where it will be signed."""
    registry, repository, grid = publisher.registry, publisher.repository, publisher.grid
    forms = [*items, *([zstd_form(grid, item) for item in items] if "zstd" in compressions(grid) else [])]
    lines = []
    for form in forms:
        current = registry.manifest(repository, form.target)
        holds = current is not None and _config_digest(current) == form.image_id
        what = f"{form.target} ({form.compression}, image {form.image_id[:19]})"
        if holds and not publisher.signing:
            lines.append(f"dry run: {what} already holds this image; would attach what its digest lacks")
        else:
            was = f"from {current.digest[:19]}" if current is not None else "new"
            lines.append(f"dry run: would push {what}, {was}, then attach its SBOM and self-test report")
        if grid.spec.publish.soci and form.compression == "gzip":
            lines.append(f"dry run: would make its SOCI index ({grid.spec.publish.soci_index})")
    for item in (form for form in forms if not form.staging_tag):
        if multiarch.is_multiarch(grid, item.cell):
            lines.append(f"dry run: would put the multi-arch index under {item.tag} once every platform is pushed")
        if item.aliases:
            lines.append(f"dry run: then would move {', '.join(item.aliases)} to {item.tag}")
    return [*lines, "dry run: nothing was pushed, attached or written"]


def publish(
    engine: docker.DockerClient,
    grid: Matrix,
    cells: list[Cell],
    report: Report = print,
    options: PublishOptions | None = None,
) -> list[Publication]:
    """Publish the cells; records go to published/ beside the matrix file, and the table of
    published tags into the README.md beside it (where that README has the table's markers).
    With a signer, each image also gets its signed provenance and self-test statements. With
    `publish.compression: zstd` each image also goes out with zstd layers, under `-zstd` tags."""
    options = options or PublishOptions()
    multiarch.check_complete(grid, cells)  # a multi-arch tag: every platform's image, or none
    gated = gate(engine, grid, cells)
    registry = Registry.reached(grid.spec.registry, options.ca_file, options.insecure)  # after the gate
    publisher = Publisher(registry, grid, report, engine, options.signer)
    if options.dry_run:
        for line in would_push(publisher, gated):
            report(line)
        return []
    items = push_forms(publisher, gated)
    for item in items:
        attach_missing(publisher, item)
        if publisher.signing:
            attach_attestations(publisher, item)
    multiarch.push_indexes(registry, grid, items, report)
    finish(publisher, items, options.records)
    return items


def attach_missing(publisher: Publisher, item: Publication) -> None:
    """Attach what the image's digest lacks; also for an image already there, so a publish cut
    short before its artifacts is finished by the next run."""
    documents = made_documents(publisher.images, item)
    missing = missing_artifacts(publisher.door, item, documents)
    if missing:
        publisher.report(f"attaching {', '.join(missing)} to {item.target} ({item.digest[:19]})")
        _push_metadata(publisher, item, missing, documents)
        item.attached = missing
    if publisher.grid.spec.publish.soci and item.compression == "gzip":
        _attach_soci(publisher, item)


def _attach_soci(publisher: Publisher, item: Publication) -> None:
    """The SOCI forms `publish.soci_index` asks for that the image lacks: the v1 index attached
    to its digest (kept only where the team's key named it), and the v2 SOCI-enabled image under
    `<target>-soci` (kept where it proves to be this image's). One `soci create` serves both."""
    registry, repository, door = publisher.registry, publisher.repository, publisher.door
    kind = publisher.grid.spec.publish.soci_index
    key = publisher.signer.public_key if publisher.signer else None
    image = registry.manifest(repository, item.digest)
    if image is None:
        raise UserError(f"{repository}@{item.digest[:19]}: not in the registry as a gzip image manifest; no index made")
    enabled_tag = soci.enabled_tag(item.target)
    want_v1 = kind in ("v1", "both") and soci.attached(door, item, key) is None
    want_v2 = kind in ("v2", "both") and soci.enabled_ztocs(registry, repository, enabled_tag, image) is None
    if not (want_v1 or want_v2):
        return
    index, ztocs = soci.made_index(registry, repository, image, soci.tools(publisher.images), publisher.report)
    if want_v1:
        soci.attach_v1(door, item.digest, index, ztocs, publisher.report)
        item.attached = [*item.attached, "SOCI index"]
        if publisher.signer is not None:  # what a later publish keeps: only an index the key names
            about = provenance.Subject(f"{publisher.grid.spec.registry}/{publisher.repository}", item.digest,
                                       item.image_id, item.build_id)  # fmt: skip
            statement = provenance.soci_index_statement(about, index.digest)
            door.attach_statement(_subject(publisher, item), f"{item.target}.soci.att", statement, publisher.signer)
    if want_v2:
        platform = platforms.of(item.cell.platform).descriptor()
        enabled = soci.push_enabled(registry, repository, image, index, platform, enabled_tag)
        item.attached = [*item.attached, "SOCI-enabled image"]
        publisher.report(f"{enabled_tag} -> {enabled[:19]}: the SOCI-enabled image (v2 index, {len(ztocs)} zTOCs)")


def finish(publisher: Publisher, items: list[Publication], records: Records | None = None) -> None:
    """The last steps, once every image and its artifacts are in the registry: the aliases
    move, then the records and the README's table."""
    grid, records = publisher.grid, records or Records()
    _move_aliases(publisher, items)
    for item in items:
        # Also where nothing moved but the record does not name the digest: a publish cut after
        # its last move and before its record is finished by the next run.
        stale = _recorded_digest(records.folder(grid) / f"{item.record_name}.json") != item.points_to
        if not item.unchanged or item.moved_aliases or item.attached or stale:
            write_record(grid, item, records.folder(grid))
    update_readme_table(records.table(grid), records.folder(grid))


def _recorded_digest(path: Path) -> object:
    """The digest a publish record names; None where there is no record, or not one (read as
    update_readme_table reads records: at most 1 MiB, through jsonread's bounds)."""
    if not path.is_file() or path.is_symlink():
        return None
    try:
        record = jsonread.loads(path.read_bytes()[: 1 << 20], str(path))
    except (OSError, UserError):
        return None
    return record.get("digest") if isinstance(record, dict) else None


def write_record(grid: Matrix, item: Publication, records_dir: Path) -> Path:
    checks = item.report.get("checks", [])
    record = {
        "cell": item.cell.name,
        "repository": f"{grid.spec.registry}/{grid.spec.repository}",
        "tags": [item.tag, *item.aliases],
        "compression": item.compression,
        "digest": item.points_to,
        "platform": item.cell.platform,
        **({"image": {"tag": item.image_tag, "digest": item.digest}} if item.tag_digest else {}),
        "image_id": item.image_id,
        "build_id": item.build_id,
        "selftest": {
            "status": item.report.get("status"),
            "device": item.report.get("device"),
            "passed": sum(1 for c in checks if c["status"] == "pass"),
            "checks": len(checks),
        },
        "gpu": reports.record_entry(item.cell.gpu_gate, item.gpu_report),
        "sbom": f"{item.image_tag or item.tag}.sbom",
        "attached": {kind: ARTIFACT_TYPES[kind] for kind in ARTIFACT_TYPES},  # to the digest, as OCI referrers
        "published": times.iso_utc(time.time()),
    }
    records_dir.mkdir(parents=True, exist_ok=True)
    path = records_dir / f"{item.record_name}.json"
    confined.write_text(path, json.dumps(record, indent=1) + "\n")
    return path


# What can open emphasis, a link, an image, code or a cell, mention someone or name an issue.
def _table_row(record: object) -> str | None:
    """One row of the published-tags table, or None for a record that is not what write_record writes."""
    if not isinstance(record, dict):
        return None
    tags, selftest = record.get("tags"), record.get("selftest")
    if not isinstance(tags, list) or not tags or not isinstance(selftest, dict):
        return None
    tag, *aliases = tags
    digest = record.get("digest")
    digest_text = digest[:19] if isinstance(digest, str) and DIGEST_TEXT.fullmatch(digest) else "?"
    platform = markdown_text(record.get("platform", platforms.DEFAULT))
    aliases_text = ", ".join(code_text(a) for a in aliases) or "-"
    selftest_text = (
        f"{markdown_text(selftest.get('status'))} ({markdown_text(selftest.get('passed'))}/"
        f"{markdown_text(selftest.get('checks'))} on {markdown_text(selftest.get('device'))})"
    )
    name = f"{record.get('repository')}:{tag}"
    gpu = _gpu_text(record.get("gpu"))
    return f"| {code_text(name)} | {platform} | {aliases_text} | `{digest_text}` | {selftest_text} | {gpu} |"


def _gpu_text(entry: object) -> str:
    """The GPU column: the device a CUDA tag was proven on and its figures, `GPU: not tested`
    where the matrix made its gate optional and no GPU ran it, `-` for a CPU image."""
    if not isinstance(entry, dict):
        return "-"
    if entry.get("status") != "pass":
        return "GPU: not tested"

    def number(key: str, form: str) -> str | None:
        value = entry.get(key)
        return form.format(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    figures = [
        f"bf16 matmul {number('matmul_bf16_fraction_of_peak', '{:.0%}')} of peak"
        if number("matmul_bf16_fraction_of_peak", "{}") else "not gated (no datasheet peak)",
        *(f"SDPA {name} {number(key, '{:.1f}')}x math" for name, key in (("flash", "sdpa_flash_vs_math"),
          ("cuDNN", "sdpa_cudnn_vs_math")) if number(key, "{}")),
        *([f"compile {number('compile_s', '{:.1f}')} s"] if number("compile_s", "{}") else []),
    ]  # fmt: skip
    device = f"{entry.get('device')} (sm {entry.get('capability')}, driver {entry.get('driver')})"
    return f"{markdown_text(device)}: {', '.join(markdown_text(figure) for figure in figures)}"


DIGEST_TEXT = re.compile(r"sha256:[0-9a-f]{64}")


def update_readme_table(readme: Path, records_dir: Path) -> None:
    if not readme.exists() or TABLE_START not in readme.read_text():
        return
    records = []
    for path in sorted(records_dir.glob("*.json")) if records_dir.is_dir() else []:
        try:
            records.append(jsonread.loads(path.read_bytes()[: 1 << 20], str(path)))
        except UserError:
            raise UserError("is not a record `publish` writes (not JSON); remove it or publish again", path) from None
    rows = [row for row in map(_table_row, records) if row is not None]
    if not rows:
        return
    rows = ["| tag | platform | aliases | digest | self-test | GPU |", "|---|---|---|---|---|---|", *rows]
    text = readme.read_text()
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    confined.write_text(readme, text[:start] + "\n" + "\n".join(rows) + "\n" + text[end:])
