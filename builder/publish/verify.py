"""`python -m builder verify REF`: what a user runs before `FROM REF`, with no engine.

From the registry alone it reads the image (each platform's, for a multi-arch tag), its config's
labels, and every artifact attached to its digest, and says: is there an SBOM, which self-test
reports passed on which device, is the CUDA image proven on a GPU, and does the build ID label
match what the artifacts (and this repository's publish record, where there is one) say. Each
artifact is checked to name this digest as its subject, and each report to name this image.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from securesystemslib.signer import SSlibKey

from builder import jsonread, verdict
from builder.assemble.build import BUILD_ID_LABEL
from builder.config import grammar
from builder.errors import UserError
from builder.oci.registry import DIGEST, IMAGE_TYPES, INDEX_TYPES, Manifest, Registry, json_object
from builder.plan.matrix import Matrix
from builder.publish import attachments, provenance, reports, soci, trust
from builder.publish.publish import ARTIFACT_TYPES
from builder.terminal import quoted, without_password

CELL_LABEL, CUDA_LABEL = "io.torch-images.cell", "io.torch-images.cuda"
MAX_ARTIFACTS = 256  # SBOMs, reports and their signed statements: a few per machine that ran the self-test


@dataclass(frozen=True)
class Reference:
    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @property
    def reference(self) -> str:
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        return f"{self.registry}/{self.repository}" + (f"@{self.digest}" if self.digest else f":{self.reference}")


def parse_reference(text: str) -> Reference:
    """REGISTRY/REPOSITORY[:TAG][@DIGEST], each part against its grammar."""
    hint = "write REGISTRY/REPOSITORY:TAG or REGISTRY/REPOSITORY@sha256:<64 hex>, such as ghcr.io/acme/torch:latest"
    if without_password(text) != text:  # user:password@host: the password is never repeated back
        raise UserError(
            f"{without_password(text)[:200]!r} carries credentials; give them with `docker login` or the "
            f"environment, and {hint}"
        )
    rest, _, digest = text.partition("@")
    host, slash, path = rest.partition("/")
    repository, tag = path, None
    if ":" in path.rsplit("/", 1)[-1]:
        repository, tag = path.rsplit(":", 1)
    if not slash or not grammar.REGISTRY.matches(host) or not grammar.REPOSITORY.matches(repository):
        raise UserError(f"{text[:200]!r} is not an image reference: {hint}")
    if tag is not None and not grammar.TAG.matches(tag):
        raise UserError(f"{text[:200]!r}: the tag {tag[:130]!r} is not a tag ({grammar.TAG.hint})")
    if digest and not DIGEST.fullmatch(digest):
        raise UserError(f"{text[:200]!r}: {digest[:80]!r} is not a sha256 digest; {hint}")
    return Reference(host, repository, tag, digest or None)


@dataclass
class ImageFindings:
    """What verify found for one image manifest, and what is wrong with it."""

    digest: str
    platform: str
    image_id: str = ""
    cell: str = ""
    build_id: str = ""
    index: str = ""  # the multi-arch index this platform's image was found under, if any
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def verify(
    registry: Registry, reference: Reference, grid: Matrix | None, key: SSlibKey | None = None
) -> list[ImageFindings]:
    """Each image under `reference` (one, or one per platform of an index), with its findings;
    with a key, also its signed attestations."""
    manifest = registry.manifest(reference.repository, reference.reference)
    if manifest is None:
        raise UserError(f"{reference}: not in {registry.host}")
    if reference.digest and manifest.digest != reference.digest:
        raise UserError(f"{reference}: the registry answered {manifest.digest}, not the digest asked for")
    if manifest.media_type in INDEX_TYPES:
        entries = json.loads(manifest.body)["manifests"]
        images = []
        for entry in entries:
            platform = entry.get("platform", {})
            child = registry.manifest(reference.repository, str(entry["digest"]))
            if child is None:
                raise UserError(f"{reference}: its index lists {entry['digest']}, which the registry does not serve")
            name = f"{platform.get('os', '?')}/{platform.get('architecture', '?')}"
            found = _verify_image(registry, reference.repository, child, name, grid, key)
            found.index = manifest.digest
            images.append(found)
        return images
    return [_verify_image(registry, reference.repository, manifest, "", grid, key)]


def _verify_image(
    registry: Registry, repository: str, manifest: Manifest, platform: str, grid: Matrix | None, key: SSlibKey | None
) -> ImageFindings:
    if manifest.media_type not in IMAGE_TYPES:
        raise UserError(f"{manifest.digest[:19]} is a {manifest.media_type}, not an image")
    found = ImageFindings(manifest.digest, platform)
    found.image_id = json.loads(manifest.body)["config"]["digest"]
    config = json_object(registry.blob(repository, found.image_id), f"the image config of {manifest.digest[:19]}")
    labels = config.get("config", {}).get("Labels") if isinstance(config.get("config"), dict) else None
    labels = labels if isinstance(labels, dict) else {}
    found.build_id = _plain(labels.get(BUILD_ID_LABEL), grammar.BUILD_ID)
    found.cell = _plain(labels.get(CELL_LABEL), grammar.TAG)
    cuda = labels.get(CUDA_LABEL)
    artifacts = _artifacts(attachments.Door(registry, repository), manifest, found)
    _check_sbom(artifacts, found)
    gpu_gate = _gpu_gate(grid, found.cell, cuda)
    _check_reports([a for a in artifacts if a.artifact_type == reports.SELFTEST_TYPE], found, gpu_gate)
    _check_build_id(artifacts, found, grid)
    if key is not None:
        envelopes = [a for a in artifacts if a.artifact_type in provenance.SIGNED_TYPES]
        _check_attestations(envelopes, found, grid, key, gpu_gate)
    return found


@dataclass(frozen=True)
class Artifact:
    artifact_type: str
    annotations: dict[str, Any]
    document: dict[str, Any]


# What publish attaches, and so what verify reads: an artifact of another type (a SOCI index for
# lazy pulling, another tool's signature) is named, not read. It cannot add trust: the checks
# below look only at these types.
READ_TYPES = frozenset({*ARTIFACT_TYPES.values(), *provenance.SIGNED_TYPES})


def _artifacts(door: attachments.Door, subject: Manifest, found: ImageFindings) -> list[Artifact]:
    """Every artifact of a type publish attaches that proves to be `subject`'s (attachments.py);
    one that does not is a problem. Artifacts of other types are counted in a line, not read."""
    entries = door.listed(subject.digest)
    read = [e for e in entries if e.get("artifactType") in READ_TYPES]
    if len(read) > MAX_ARTIFACTS:  # only what is read is held to the limit; other tools' artifacts are counted
        raise UserError(
            f"{subject.digest[:19]} lists {len(read)} SBOMs, reports and attestations, more than the {MAX_ARTIFACTS} "
            "verify reads; remove stale ones (publish prune)"
        )
    lazy = [entry for entry in entries if entry.get("artifactType") == soci.INDEX_TYPE]
    if lazy:  # publish.soci: what nodes pull lazily by; a zTOC is checked by its digest, nothing here is signed
        found.lines.append(f"SOCI index for lazy pulling: {len(lazy)} (not signed; soci-snapshotter checks its zTOCs)")
    unread = [entry for entry in entries if entry.get("artifactType") not in READ_TYPES | {soci.INDEX_TYPE}]
    if unread:
        kinds = sorted({_plain(entry.get("artifactType"), grammar.MEDIA_TYPE) or "no type" for entry in unread})
        found.lines.append(f"also attached, not read (not what publish attaches): {len(unread)} ({', '.join(kinds)})")
    artifacts = []
    for entry in read:
        try:  # one bad artifact is a finding, not the end of the listing
            attachment = door.read(subject.digest, str(entry.get("digest", "")), READ_TYPES)
            body = door.document(attachment, verdict.MAX_REPORT_BYTES)
        except UserError as error:
            found.problems.append(error.message)
            continue
        annotations = attachment.manifest.get("annotations")
        artifacts.append(Artifact(attachment.artifact_type, annotations if isinstance(annotations, dict) else {}, body))
    return artifacts


def _check_sbom(artifacts: list[Artifact], found: ImageFindings) -> None:
    sboms = [a for a in artifacts if a.artifact_type == ARTIFACT_TYPES["sbom"]]
    if not sboms:
        found.problems.append("no SBOM attached")
        return
    components = sboms[0].document.get("components")
    count = len(components) if isinstance(components, list) else 0
    found.lines.append(f"SBOM: attached (CycloneDX, {count} components)")


def _gpu_gate(grid: Matrix | None, cell_name: str, cuda: object) -> str:
    """The cell's gate as this checkout's matrix says; without it, any CUDA image needs a GPU report."""
    if grid is not None:
        cell = next((c for c in grid.cells if c.name == cell_name), None)
        if cell is not None:
            return cell.gpu_gate
    return "none" if cuda in (None, "cpu") else "required"


def _check_reports(artifacts: list[Artifact], found: ImageFindings, gpu_gate: str) -> None:
    if not artifacts:
        found.problems.append("no self-test report attached")
        return
    passing_gpu = False
    for artifact in artifacts:
        report = artifact.document
        why = verdict.why_not_a_pass(report, found.image_id)
        found_checks, found_device = report.get("checks"), report.get("device")
        checks: list[Any] = found_checks if isinstance(found_checks, list) else []
        passed = sum(1 for c in checks if isinstance(c, dict) and c.get("status") == "pass")
        device = found_device if isinstance(found_device, str) else "?"
        where = f"{verdict.report_kind(report)} report on {quoted(device)}"
        if why is not None:
            found.lines.append(f"{where}: NOT a pass ({quoted(why, 300)})")
            found.problems.append(f"{where}: {quoted(why, 300)}")
            continue
        text = f"{where}: pass, {passed}/{len(checks)} checks passed"
        if verdict.report_kind(report) == "gpu":
            gpu_why = verdict.why_not_a_gpu_pass(report, found.image_id)
            if gpu_why is None:
                passing_gpu = True
                figures = verdict.gpu_figures(report)
                text += f"; sm {quoted(figures['capability'], 20)}, driver {quoted(figures['driver'], 40)}, " + (
                    f"bf16 matmul {figures['matmul_bf16_fraction_of_peak']:.0%} of peak"
                    if figures["gated"] and figures["matmul_bf16_fraction_of_peak"] is not None
                    else "not gated (no datasheet peak for this device)"
                )
            else:
                text += f"; not a GPU pass ({quoted(gpu_why, 300)})"
                found.problems.append(f"{where}: {quoted(gpu_why, 300)}")
        found.lines.append(text)
    if gpu_gate == "required" and not passing_gpu:
        found.problems.append("no passing GPU self-test, which this CUDA image's tags require")
    elif gpu_gate == "optional" and not passing_gpu:
        found.lines.append("GPU: not tested (the matrix makes this cell's GPU gate optional)")


def _check_build_id(artifacts: list[Artifact], found: ImageFindings, grid: Matrix | None) -> None:
    if not found.build_id:
        found.problems.append(f"the image has no {BUILD_ID_LABEL} label")
        return
    claimed = {str(a.annotations.get(BUILD_ID_LABEL)) for a in artifacts if a.annotations.get(BUILD_ID_LABEL)}
    if claimed - {found.build_id}:
        found.problems.append(f"artifacts name build ID {', '.join(sorted(c[:12] for c in claimed))}, "
                              f"the image's label {found.build_id[:12]}")  # fmt: skip
    record = _record_build_id(grid, found.cell, found.digest)
    if record is None:
        found.lines.append(f"build ID {found.build_id[:12]}: as its artifacts say (no publish record here names it)")
    elif record == found.build_id:
        found.lines.append(f"build ID {found.build_id[:12]}: matches published/{found.cell}.json")
    else:
        found.problems.append(f"build ID {found.build_id[:12]} is not published/{found.cell}.json's {record[:12]}")


def _record_build_id(grid: Matrix | None, cell: str, digest: str) -> str | None:
    """The build ID this checkout's publish record gives the cell, when the record is of this digest."""
    if grid is None or not cell:
        return None
    path = grid.path.resolve().parent / "published" / f"{cell}.json"
    try:
        record = jsonread.loads(Path(path).read_bytes()[: 1 << 20], str(path))
    except (OSError, UserError):
        return None
    if not isinstance(record, dict):
        return None
    found_image = record.get("image")
    image: dict[str, Any] = found_image if isinstance(found_image, dict) else {}
    if digest not in (record.get("digest"), image.get("digest")):
        return None
    build_id = record.get("build_id")
    return build_id if isinstance(build_id, str) else None


def _plain(value: object, grammar_: grammar.Grammar) -> str:
    return value if isinstance(value, str) and grammar_.matches(value) else ""


@dataclass(frozen=True)
class SignedPredicate:
    """One verified statement's predicate, as a reader gets it."""

    predicate_type: str
    predicate: dict[str, Any]
    where: str  # "attestation 3 (...)": how lines about it begin


def _read_provenance(signed: SignedPredicate, found: ImageFindings, grid: Matrix | None) -> set[str]:
    _check_provenance(signed.predicate, found, grid)
    return {"provenance"}


def _read_selftest(signed: SignedPredicate, found: ImageFindings, grid: Matrix | None) -> set[str]:
    why = verdict.why_not_a_pass(signed.predicate, found.image_id)
    if why is not None:
        found.problems.append(f"{signed.where}: the signed report is not a pass ({quoted(why, 300)})")
        return set()
    kind = "gpu" if verdict.why_not_a_gpu_pass(signed.predicate, found.image_id) is None else "cpu"
    found.lines.append(f"signed {kind} self-test on {quoted(signed.predicate.get('device'))}: pass")
    return {f"{kind} self-test"}


def _read_rebuild(signed: SignedPredicate, found: ImageFindings, grid: Matrix | None) -> set[str]:
    found.lines.append("a rebuild signed by the given key: not counted (rebuilders sign with their own)")
    return set()  # the team's key vouches for no rebuild


def _read_vex(signed: SignedPredicate, found: ImageFindings, grid: Matrix | None) -> set[str]:
    statements = signed.predicate.get("statements")
    named = [s.get("vulnerability", {}).get("name") for s in statements or [] if isinstance(s, dict)]
    found.lines.append(f"signed VEX: not affected by {', '.join(quoted(n, 40) for n in named[:10]) or 'nothing'}")
    return set()


def _read_sbom(signed: SignedPredicate, found: ImageFindings, grid: Matrix | None) -> set[str]:
    listed = "components" if signed.predicate_type == provenance.CYCLONEDX else "packages"
    components = signed.predicate.get(listed)
    count = len(components) if isinstance(components, list) else 0
    found.lines.append(f"signed SBOM ({signed.predicate_type}): {count} components")
    return set()


def _read_test_result(signed: SignedPredicate, found: ImageFindings, grid: Matrix | None) -> set[str]:
    configuration = signed.predicate.get("configuration")
    first = configuration[0] if isinstance(configuration, list) and configuration else {}
    notes = first.get("annotations") if isinstance(first, dict) else None
    notes = notes if isinstance(notes, dict) else {}
    found.lines.append(
        f"signed test result ({provenance.TEST_RESULT}): {quoted(signed.predicate.get('result'), 20)}, "
        f"{quoted(notes.get('kind'), 8)} on {quoted(notes.get('device'))}"
    )
    return set()


# What verify says of each kind of signed statement, and which kinds of evidence it counts.
PREDICATE_READERS: dict[str, Callable[[SignedPredicate, ImageFindings, Matrix | None], set[str]]] = {
    provenance.PROVENANCE: _read_provenance,
    provenance.SELFTEST: _read_selftest,
    provenance.REBUILD: _read_rebuild,
    provenance.OPENVEX: _read_vex,
    provenance.CYCLONEDX: _read_sbom,
    provenance.SPDX: _read_sbom,
    provenance.TEST_RESULT: _read_test_result,
}


def _check_attestations(
    envelopes: list[Artifact], found: ImageFindings, grid: Matrix | None, key: SSlibKey, gpu_gate: str
) -> None:
    """Each DSSE envelope signed by `key`, about this digest and image; the provenance's inputs
    as this checkout commits them; and which attestations are missing."""
    kinds: set[str] = set()
    quorum = trust.rebuilders(grid, key) if grid is not None else []
    agreed: dict[str, str] = {}
    for number, envelope in enumerate(envelopes, 1):
        named = envelope.annotations.get(provenance.PREDICATE_ANNOTATION) or envelope.annotations.get(
            provenance.COSIGN_PREDICATE_ANNOTATION
        )
        where = f"attestation {number} ({str(named)[:60]})"
        if provenance.is_keyless(envelope.document):  # GitHub's own, say: it proves nothing about --key
            found.lines.append(
                f"{where}: signed keyless (a Sigstore certificate), not by a key: not checked here; "
                "`gh attestation verify` or cosign's --certificate-identity checks it"
            )
            continue
        rebuild = _rebuilder_statement(envelope, found, quorum)
        if rebuild is not None:  # a rebuilder's, signed with its own key
            name, engine = rebuild
            if engine is None:
                found.problems.append(f"{where}: {name}'s signed rebuild did not give this image ID")
            else:
                agreed[name] = engine
            continue
        try:
            statement = provenance.verified_statement(
                envelope.document, envelope.artifact_type, key, found.digest, found.image_id
            )
        except UserError as error:
            found.problems.append(f"{where}: {error.message}")
            continue
        predicate_type, predicate = str(statement.get("predicateType")), statement["predicate"]
        reader = PREDICATE_READERS.get(predicate_type)
        if reader is not None:
            kinds |= reader(SignedPredicate(predicate_type, predicate, where), found, grid)
    if quorum:
        found.lines.append(f"rebuilder keys whose signed rebuild gave this image ID: {trust.agreement_line(agreed)}")
    required = grid.spec.publish.require_rebuilds if grid is not None else 0
    if len(agreed) < required:
        found.problems.append(f"publish.require_rebuilds is {required}; {len(agreed)} rebuilder keys agree")
    needed = {
        "provenance": "provenance" in kinds,
        "cpu self-test": bool(kinds & {"cpu self-test", "gpu self-test"}),  # a GPU pass is a pass too
        "gpu self-test": gpu_gate != "required" or "gpu self-test" in kinds,
    }
    missing = [kind for kind, present in needed.items() if not present]
    for kind in missing:
        found.problems.append(f"no signed {kind} attestation from the given key")


def _rebuilder_statement(
    envelope: Artifact, found: ImageFindings, quorum: list[trust.Rebuilder]
) -> tuple[str, str | None] | None:
    """(rebuilder, the builder it names or None where it gave another image) for a rebuild signed
    by one of the quorum's keys about this digest and image; None when no rebuilder signed it."""
    for rebuilder in quorum:
        try:
            statement = provenance.verified_statement(
                envelope.document, envelope.artifact_type, rebuilder.key, found.digest, found.image_id
            )
        except UserError:
            continue
        if statement.get("predicateType") == provenance.REBUILD and isinstance(statement.get("predicate"), dict):
            return rebuilder.name, provenance.rebuild_engine(statement["predicate"], found.image_id)
    return None


def _check_provenance(predicate: dict[str, Any], found: ImageFindings, grid: Matrix | None) -> None:
    cell = next((c for c in grid.cells if c.name == found.cell), None) if grid is not None else None
    problem = provenance.provenance_problem(predicate, found.build_id, cell)
    if problem is not None:
        found.problems.append(problem)
    elif cell is None:
        found.lines.append(f"signed provenance: build ID {found.build_id[:12]} (no cell {found.cell} here to compare)")
    else:
        locks = [name for name in provenance.build_inputs(cell) if name.endswith(".lock")]
        found.lines.append(f"signed provenance: {len(locks)} locks match this checkout, build ID {found.build_id[:12]}")
