"""`publish --prune-reports CELL...`: the self-test reports a published image no longer needs.

Every GPU run attaches one more report to a digest (and, with a key, its two signed statements),
and the gates read at most reports.MAX_REPORTS of them. Pruning deletes, from each of a cell's
published images (every form: gzip, zstd):

- a report of another image (its image ID is not the digest's config), or no report at all;
- a device's passing report where a newer passing report of the same device is there;
- the signed statements of what it deletes (the report itself, and the test result naming it by
  digest), read for their subject only, and their layers in cosign 2's `.att` manifest.

A failed report of the image is never pruned: the gate keeps refusing its tags until someone
decides the device was at fault and deletes that report by hand. The registry must allow
deleting manifests (distribution's `storage.delete.enabled`; GHCR and GitLab do)."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from builder import jsonread
from builder.assemble import smoke
from builder.errors import UserError
from builder.oci.registry import Registry
from builder.plan.cell import Cell
from builder.plan.matrix import Matrix
from builder.progress import Report
from builder.publish import cosign_tag, multiarch, provenance, publish, reports

# A digest with more artifacts than this is read no further: prune by hand, a few at a time.
MAX_ARTIFACTS = 1024


@dataclass
class Pruned:
    tag: str
    digest: str
    kept: int = 0
    reports: list[str] = field(default_factory=list)  # artifact digests deleted
    statements: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Attached:
    artifact: str  # the artifact manifest's digest
    document: str  # the sha256 of the report's bytes: what a signed test result names
    report: dict[str, Any] | None  # None: not a report


def prune(registry: Registry, grid: Matrix, cells: list[Cell], report: Report = print) -> list[Pruned]:
    repository, done = grid.spec.repository, []
    for cell in cells:
        for compression in publish.compressions(grid):
            tag = multiarch.image_tag(grid, cell, compression)
            manifest = registry.manifest(repository, tag)
            if manifest is None:
                report(f"{cell.name}: {tag} is not in {registry.host}; nothing to prune")
                continue
            image_id = str(json.loads(manifest.body).get("config", {}).get("digest", ""))
            done.append(prune_digest(registry, repository, tag, manifest.digest, image_id))
            report(_summary(cell, done[-1]))
    return done


def prune_digest(registry: Registry, repository: str, tag: str, digest: str, image_id: str) -> Pruned:
    """Delete what one digest's reports no longer need to say; returns what went and what stayed."""
    pruned = Pruned(tag, digest)
    attached = _reports(registry, repository, digest)
    going = _stale(attached, image_id)
    pruned.kept = len(attached) - len(going)
    gone_documents = {a.document for a in going if a.document}
    gone_reports = [a.report for a in going if a.report is not None]
    statements = _statements_of(registry, repository, digest, image_id, gone_documents, gone_reports)
    for artifact in [a.artifact for a in going] + [artifact for artifact, _ in statements]:
        registry.delete_manifest(repository, artifact)
    registry.drop_from_referrers_tag(repository, digest, {a.artifact for a in going} | {s for s, _ in statements})
    cosign_tag.remove(registry, repository, digest, {envelope for _, envelope in statements})
    pruned.reports = [a.artifact for a in going]
    pruned.statements = [artifact for artifact, _ in statements]
    return pruned


def _reports(registry: Registry, repository: str, digest: str) -> list[_Attached]:
    entries = registry.referrers(repository, digest, reports.SELFTEST_TYPE)
    if len(entries) > MAX_ARTIFACTS:
        raise UserError(f"{digest[:19]} carries {len(entries)} reports, more than {MAX_ARTIFACTS}: prune by hand")
    found = []
    for entry in entries:
        artifact = str(entry["digest"])
        try:
            manifest = registry.artifact_manifest(repository, artifact)
            layer = str(manifest["layers"][0].get("digest", ""))
            document = registry.artifact_document(repository, manifest, smoke.MAX_REPORT_BYTES)
        except (UserError, LookupError, AttributeError):
            found.append(_Attached(artifact, "", None))
            continue
        found.append(_Attached(artifact, layer.removeprefix("sha256:"), document))
    return found


def _stale(attached: list[_Attached], image_id: str) -> list[_Attached]:
    """Not a report, another image's, or a pass of a device with a newer pass."""
    going = [a for a in attached if a.report is None or a.report.get("image_id") != image_id]
    passes = [a for a in attached if a not in going and smoke.why_not_a_pass(a.report, image_id) is None]
    newest: dict[str, _Attached] = {}
    for item in sorted(passes, key=lambda a: (str(a.report.get("time")), a.artifact)):  # type: ignore[union-attr]
        newest[str(item.report.get("device"))] = item  # type: ignore[union-attr]
    return going + [a for a in passes if newest[str(a.report.get("device"))] is not a]  # type: ignore[union-attr]


def _statements_of(
    registry: Registry,
    repository: str,
    digest: str,
    image_id: str,
    documents: set[str],
    gone: list[dict[str, Any]],
) -> list[tuple[str, str]]:
    """The signed statements about the deleted reports: (artifact digest, the sha256 of its
    envelope as cosign's form stores it). Read for what they say, not verified: a statement
    chooses only whether it itself goes."""
    identities = {_identity(r) for r in gone}
    found = []
    for entry in provenance.attested(registry, repository, digest)[:MAX_ARTIFACTS]:
        artifact = str(entry["digest"])
        try:
            document = registry.artifact(repository, artifact, provenance.MAX_ENVELOPE_BYTES)
            envelope = provenance.envelope_of(document, str(entry.get("artifactType", provenance.BUNDLE_TYPE)))
            statement = jsonread.loads(base64.b64decode(str(envelope.get("payload", ""))), artifact)
        except (UserError, ValueError):
            continue
        if not isinstance(statement, dict) or not isinstance(statement.get("predicate"), dict):
            continue
        if _about_gone(statement.get("predicateType"), statement["predicate"], image_id, documents, identities):
            layer = json.dumps(envelope, sort_keys=True, separators=(",", ":")).encode()
            found.append((artifact, "sha256:" + hashlib.sha256(layer).hexdigest()))
    return found


def _about_gone(
    predicate_type: object, predicate: dict[str, Any], image_id: str, documents: set[str], identities: set[Any]
) -> bool:
    if predicate_type == provenance.SELFTEST:
        return predicate.get("image_id") != image_id or _identity(predicate) in identities
    if predicate_type == provenance.TEST_RESULT:
        configuration = predicate.get("configuration")
        first = configuration[0] if isinstance(configuration, list) and configuration else {}
        named = first.get("digest", {}).get("sha256") if isinstance(first, dict) else None
        return isinstance(named, str) and named in documents
    return False


def _identity(report: dict[str, Any]) -> tuple[str, str, str]:
    """What tells one report from another: the image, the device and when it ran."""
    return str(report.get("image_id")), str(report.get("device")), str(report.get("time"))


def _summary(cell: Cell, pruned: Pruned) -> str:
    return (
        f"{cell.name}: {pruned.tag} ({pruned.digest[:19]}): deleted {len(pruned.reports)} reports and "
        f"{len(pruned.statements)} signed statements, kept {pruned.kept} reports"
    )
