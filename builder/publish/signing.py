"""`publish sign`: the team's key signs what a run staged, in a job that runs no build code and no
image (the shape SLSA's Build L3 asks for: the key never meets what the build ran).

What is signed comes from the registry: the staged manifest under the tag the matrix and the run
ID name (never a digest a build wrote down), its image ID (the config digest the registry serves),
its build ID label, and the documents attached to that digest, each read back by its own digest.
The run's staged records (`--staged-record`, carried as the run's artifacts) only say *which* of
the documents attached to the digest the run's own jobs attached (by their sha256): a look-alike
someone else attached beside them is never picked, and a record naming bytes that are not attached
to that digest signs nothing. The provenance names the checkout's locks, as the signing job
checked it out at the workflow's commit.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from builder import confined, jsonread, verdict
from builder.errors import UserError
from builder.oci.registry import IMAGE_TYPES, Manifest, Registry
from builder.plan.cell import Cell
from builder.publish import existing, provenance, publish, reports, staging
from builder.publish.publication import tag_suffix
from builder.publish.publisher import Publisher

# The kinds of document a run's jobs attach and record: the cell job's self-test report and SBOM,
# the GPU stage's report. Each is signed as the stage signed it before (publish.attach_attestations).
RECORDED_KINDS = {
    "selftest": reports.SELFTEST_TYPE,
    "sbom": publish.ARTIFACT_TYPES["sbom"],
}
MAX_SBOM_BYTES = 32 << 20
MAX_RECORD_BYTES = staging.STAGED_RECORD_BYTES
MAX_BUILDER = 200  # characters of an engine's name in a record


def recorded_documents(directory: Path, tag: str) -> dict[str, str]:
    """kind -> sha256 of each document the run's jobs recorded attaching to `tag`'s digest."""
    found: dict[str, str] = {}
    if not (directory / f"{tag}.json").exists():
        raise UserError(f"--staged-record {directory}: no {tag}.json; give the folder `publish stage` wrote")
    path = directory / f"{tag}.json"
    record = jsonread.loads(confined.read_bytes(path, MAX_RECORD_BYTES), str(path))
    # A form staged from the registry (its build already published) attached nothing this run.
    attached = record.get("attached", {}) if isinstance(record, dict) and record.get("tag") == tag else None
    if not isinstance(attached, dict) or not all(
        kind in RECORDED_KINDS and isinstance(digest, str) and Registry.is_digest(digest)
        for kind, digest in attached.items()
    ):
        raise UserError(f"{path}: not a staged record of {tag}; write what `publish stage` wrote")
    found.update(attached)
    return found


def recorded_builder(directory: Path, tag: str) -> str | None:
    """The engine and backend the cell job's build recorded (`built_on` in `<tag>.json`): a name the
    provenance carries as the job's word, never what decides; a malformed one is refused."""
    path = directory / f"{tag}.json"
    record = jsonread.loads(confined.read_bytes(path, MAX_RECORD_BYTES), str(path))
    built_on = record.get("built_on") if isinstance(record, dict) else None
    if built_on is None:
        return None
    if not isinstance(built_on, str) or not 0 < len(built_on) <= MAX_BUILDER or not built_on.isprintable():
        raise UserError(f"{path}: its built_on is not an engine's name; write what `publish stage` wrote")
    return built_on


def sign(publisher: Publisher, cells: list[Cell], run: str, staged_record: Path) -> list[str]:
    """Sign, for each cell's staged forms, the provenance and the documents the run's jobs
    recorded attaching; returns a line per form saying what was signed."""
    staging.check_run(run)
    if publisher.signer is None:
        raise UserError(
            f"publish sign signs with the team's key: give it (--sign-key, or {provenance.KEY_ENVIRONMENT})"
        )
    said = []
    for cell in cells:
        for compression in publish.compressions(publisher.grid):
            said.append(_sign_form(publisher, cell, run, compression, staged_record))
    return said


def _staged_image(publisher: Publisher, cell: Cell, tag: str) -> tuple[Manifest, str]:
    manifest = publisher.registry.manifest(publisher.repository, tag)
    if manifest is None or manifest.media_type not in IMAGE_TYPES:
        raise UserError(f"{cell.name}: {tag} is not one image in {publisher.grid.spec.registry}; nothing signed")
    return manifest, str(json.loads(manifest.body)["config"]["digest"])


def _sign_form(publisher: Publisher, cell: Cell, run: str, compression: str, staged_record: Path) -> str:
    grid, door, signer = publisher.grid, publisher.door, publisher.signer
    tag = staging.staging_tag(grid, cell, run, compression)
    assert signer is not None
    manifest, image_id = _staged_image(publisher, cell, tag)
    build_id = existing.published_build_id(publisher.registry, publisher.repository, manifest.digest) or ""
    about = provenance.Subject(f"{grid.spec.registry}/{publisher.repository}", manifest.digest, image_id, build_id)
    already = door.signed(manifest.digest, image_id, signer.public_key, provenance.MAX_VERIFIED)
    have = {found.predicate_type for found in already}
    reports_signed = {
        reports.document_bytes(found.predicate) for found in already if found.predicate_type == provenance.SELFTEST
    }
    signed = []
    if provenance.PROVENANCE not in have:
        built_on = recorded_builder(staged_record, tag)
        statement = provenance.provenance_statement(about, cell, provenance.builder_version(), built_on)
        door.attach_statement(manifest, f"{tag}.provenance", statement, signer)
        signed.append("provenance")
    for kind, digest in sorted(recorded_documents(staged_record, tag).items()):
        document = _attached_document(publisher, manifest, kind, digest)
        if kind == "sbom":
            if provenance.CYCLONEDX not in have:
                publish.attach_signed_sbom(door, manifest, tag, about, document, signer)
                signed.append("SBOM (CycloneDX, SPDX)")
            continue
        if document.get("image_id") != image_id:
            raise UserError(f"{tag}: the recorded {kind} report is for another image; nothing more signed")
        if _as_signed(document, about) in reports_signed:  # a rerun, or sign-gpu after sign
            continue
        door.attach_signed_report(manifest, tag, about, document, signer)
        signed.append(f"{verdict.report_kind(document)} self-test ({document.get('status')})")
    gpu_report = staging.read_gpu_report(staged_record, tag)
    if gpu_report is not None and _as_signed(gpu_report, about) not in reports_signed:  # not a rerun
        target = cell.tag + tag_suffix(compression)
        signed.append(_sign_gpu_report(publisher, manifest, tag, target, about, gpu_report))
    verb = "dry run: would sign" if publisher.dry_run else "signed"
    return f"{cell.name}: {verb} {', '.join(signed) or 'nothing new'} for {tag} ({manifest.digest[:19]})"


def _sign_gpu_report(
    publisher: Publisher,
    manifest: Manifest,
    tag: str,
    target: str,
    about: provenance.Subject,
    report: dict[str, Any],
) -> str:
    """Attach the GPU stage's report to the staged digest and sign it, where it is about exactly
    the staged image (the GPU runner holds no write token and no key: this job attaches it)."""
    if report.get("image_id") != about.image_id:
        raise UserError(f"{tag}: the GPU stage's report is for another image than the staged one; nothing more signed")
    publisher.door.attach_report(manifest, tag, report, about.build_id, target)
    assert publisher.signer is not None
    publisher.door.attach_signed_report(manifest, tag, about, report, publisher.signer)
    return f"GPU self-test on {str(report.get('device'))[:60]} ({report.get('status')})"


def _as_signed(report: dict[str, Any], about: provenance.Subject) -> bytes:
    """A report as its signed statement carries it: through the statement's own encoding (no
    table; in-toto's Struct writes every number as a float), so a report signed before compares
    equal to the same report read again."""
    return reports.document_bytes(provenance.selftest_statement(about, report)["predicate"])


def _attached_document(publisher: Publisher, manifest: Manifest, kind: str, digest: str) -> dict[str, Any]:
    """The document of `kind` with exactly that sha256, proven attached to the staged digest."""
    door, artifact_type = publisher.door, RECORDED_KINDS[kind]
    entries = door.listed(manifest.digest, [artifact_type])[: publish.MAX_LISTED]
    found = next((a for a in door.proven(manifest.digest, entries, [artifact_type]) if a.layer == digest), None)
    if found is None:
        raise UserError(
            f"{manifest.digest[:19]}: the run recorded attaching a {kind} document {digest[:19]}, and none with those "
            "bytes is attached to it; nothing more signed"
        )
    limit = MAX_SBOM_BYTES if kind == "sbom" else verdict.MAX_REPORT_BYTES
    document = door.document(found, limit)
    if kind != "sbom" and "sha256:" + hashlib.sha256(reports.document_bytes(document)).hexdigest() != digest:
        raise UserError(f"{manifest.digest[:19]}: its {kind} document {digest[:19]} is not in the builder's form")
    return document
