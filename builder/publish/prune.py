"""`publish --prune-reports CELL...`: the self-test reports a published image no longer needs.

Every GPU run attaches one more report to a digest (and, with a key, its two signed statements),
and the gates read at most reports.MAX_REPORTS of them. Pruning deletes only what it can prove
is this digest's own attachment: a manifest read from the registry, one document, of a type
publish attaches, whose own `subject` names this digest (a referrers listing, and the referrers
tag anyone who can push may rewrite, is a hint and never proof; what cannot be read is kept).
Of those, from each of a cell's published images (every form: gzip, zstd), it deletes:

- junk: attached as a report, proven, and not one;
- a passing report of another image (its image ID is not the digest's config);
- a device's passing report where a newer passing report of the same device is there, and the
  newer one is at least as trusted: a report the team's key signed a statement about (checked
  with `--key`; without a key, any statement naming it counts) is superseded only by a newer
  report with a statement the key verifies;
- the signed statements about what it deletes (the report itself, and the test result naming it
  by digest), each itself proven to be this digest's, and their layers in cosign 2's `.att`
  manifest.

A failed report is never pruned, nor a statement about a failure: the gate keeps refusing its
tags until someone decides the device was at fault and deletes that report by hand. The registry
must allow deleting manifests (distribution's `storage.delete.enabled`; GHCR and GitLab do)."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from securesystemslib.signer import SSlibKey

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
    report: dict[str, Any] | None  # None: junk, a proven attachment of the report type that is no report


@dataclass(frozen=True)
class _Statement:
    artifact: str  # the attestation's manifest digest
    envelope: str  # the sha256 of its envelope as cosign's form stores it
    predicate_type: str
    predicate: dict[str, Any]
    verified: bool  # the key given verified it (False without a key)


def prune(
    registry: Registry, grid: Matrix, cells: list[Cell], report: Report = print, key: SSlibKey | None = None
) -> list[Pruned]:
    repository, done = grid.spec.repository, []
    for cell in cells:
        for compression in publish.compressions(grid):
            tag = multiarch.image_tag(grid, cell, compression)
            manifest = registry.manifest(repository, tag)
            if manifest is None:
                report(f"{cell.name}: {tag} is not in {registry.host}; nothing to prune")
                continue
            image_id = str(json.loads(manifest.body).get("config", {}).get("digest", ""))
            done.append(prune_digest(registry, repository, tag, manifest.digest, image_id, key))
            report(_summary(cell, done[-1]))
    return done


def prune_digest(
    registry: Registry, repository: str, tag: str, digest: str, image_id: str, key: SSlibKey | None = None
) -> Pruned:
    """Delete what one digest's reports no longer need to say; returns what went and what stayed."""
    pruned = Pruned(tag, digest)
    listed = registry.referrers(repository, digest, reports.SELFTEST_TYPE)
    if len(listed) > MAX_ARTIFACTS:
        raise UserError(f"{digest[:19]} carries {len(listed)} reports, more than {MAX_ARTIFACTS}: prune by hand")
    attached = _reports(registry, repository, digest, listed)
    statements = _statements(registry, repository, digest, image_id, key)
    going = _stale(attached, image_id, statements, key is not None)
    pruned.kept = len(listed) - len(going)
    gone_documents = {a.document for a in going}
    gone_identities = {_identity(a.report) for a in going if a.report is not None}
    about_gone = [s for s in statements if _about_gone(s, image_id, gone_documents, gone_identities)]
    for artifact in [a.artifact for a in going] + [s.artifact for s in about_gone]:
        registry.delete_manifest(repository, artifact)
    deleted = {a.artifact for a in going} | {s.artifact for s in about_gone}
    registry.drop_from_referrers_tag(repository, digest, deleted)
    cosign_tag.remove(registry, repository, digest, {s.envelope for s in about_gone})
    pruned.reports = [a.artifact for a in going]
    pruned.statements = [s.artifact for s in about_gone]
    return pruned


def _proven_manifest(registry: Registry, repository: str, artifact: str, digest: str, types: tuple[str, ...]) -> Any:
    """The artifact's manifest, read from the registry, when it proves itself this digest's
    attachment of one of `types`: one document, the type, and `subject` naming the digest.
    None otherwise, and when it cannot be read: what is not proven is never deleted."""
    try:
        manifest = registry.artifact_manifest(repository, artifact)
    except UserError:
        return None
    subject = manifest.get("subject")
    layer = manifest["layers"][0]
    kind = manifest.get("artifactType") or (layer.get("mediaType") if isinstance(layer, dict) else None)
    if not isinstance(subject, dict) or subject.get("digest") != digest or kind not in types:
        return None
    return manifest


def _reports(registry: Registry, repository: str, digest: str, listed: list[dict[str, Any]]) -> list[_Attached]:
    """The listed reports that prove to be this digest's, each with its document."""
    found = []
    for entry in listed:
        artifact = str(entry.get("digest", ""))
        manifest = _proven_manifest(registry, repository, artifact, digest, (reports.SELFTEST_TYPE,))
        if manifest is None:
            continue
        try:
            document = registry.artifact_document(repository, manifest, smoke.MAX_REPORT_BYTES)
        except (UserError, LookupError, AttributeError):
            found.append(_Attached(artifact, "", None))  # attached here as a report, and none
            continue
        layer = str(manifest["layers"][0].get("digest", ""))
        found.append(_Attached(artifact, layer.removeprefix("sha256:"), document))
    return found


def _statements(
    registry: Registry, repository: str, digest: str, image_id: str, key: SSlibKey | None
) -> list[_Statement]:
    """The signed statements that prove to be this digest's, read for what they say: verified with
    the key where one is given (a statement the key does not verify is then kept, never counted)."""
    found = []
    for entry in provenance.attested(registry, repository, digest)[:MAX_ARTIFACTS]:
        artifact = str(entry.get("digest", ""))
        artifact_type = str(entry.get("artifactType", provenance.BUNDLE_TYPE))
        manifest = _proven_manifest(registry, repository, artifact, digest, provenance.SIGNED_TYPES)
        if manifest is None:
            continue
        try:
            document = registry.artifact_document(repository, manifest, provenance.MAX_ENVELOPE_BYTES)
            envelope = provenance.envelope_of(document, artifact_type)
            if key is not None:
                statement = provenance.verified_statement(document, artifact_type, key, digest, image_id)
            else:
                statement = jsonread.loads(base64.b64decode(str(envelope.get("payload", ""))), artifact)
        except (UserError, ValueError, LookupError, AttributeError):
            continue
        if not isinstance(statement, dict) or not isinstance(statement.get("predicate"), dict):
            continue
        layer = json.dumps(envelope, sort_keys=True, separators=(",", ":")).encode()
        envelope_digest = "sha256:" + hashlib.sha256(layer).hexdigest()
        kind, predicate = str(statement.get("predicateType")), statement["predicate"]
        found.append(_Statement(artifact, envelope_digest, kind, predicate, key is not None))
    return found


def _stale(attached: list[_Attached], image_id: str, statements: list[_Statement], keyed: bool) -> list[_Attached]:
    """Junk (attached as a report, and none), passing reports of another image, and passes a
    newer, at least as trusted pass of the same device supersedes. Never a failed report."""
    going = [a for a in attached if a.report is None]
    reports_of = [(a, a.report) for a in attached if a.report is not None and a.report.get("status") == "pass"]
    going += [a for a, report in reports_of if report.get("image_id") != image_id]
    signed = {_identity(s.predicate) for s in statements if s.predicate_type == provenance.SELFTEST}
    verified = {_identity(s.predicate) for s in statements if s.predicate_type == provenance.SELFTEST and s.verified}
    by_device: dict[str, list[tuple[_Attached, dict[str, Any]]]] = {}
    passes = [(a, r) for a, r in reports_of if a not in going and smoke.why_not_a_pass(r, image_id) is None]
    for item, report in sorted(passes, key=lambda pair: (str(pair[1].get("time")), pair[0].artifact)):
        by_device.setdefault(str(report.get("device")), []).append((item, report))
    for items in by_device.values():
        for index, (older, report) in enumerate(items):
            newer = [r for _, r in items[index + 1 :]]
            if _identity(report) in signed:  # superseded only by a pass the key verified
                newer = [r for r in newer if keyed and _identity(r) in verified]
            if newer:
                going.append(older)
    return going


def _about_gone(statement: _Statement, image_id: str, documents: set[str], identities: set[Any]) -> bool:
    """Whether a statement is about a report that goes; never one about a failure."""
    predicate = statement.predicate
    if statement.predicate_type == provenance.SELFTEST:
        return predicate.get("status") == "pass" and (
            predicate.get("image_id") != image_id or _identity(predicate) in identities
        )
    if statement.predicate_type == provenance.TEST_RESULT:
        configuration = predicate.get("configuration")
        first = configuration[0] if isinstance(configuration, list) and configuration else {}
        named = first.get("digest", {}).get("sha256") if isinstance(first, dict) else None
        # a pass with warnings is WARNED; only FAILED is a failure, and that is never pruned
        return predicate.get("result") in ("PASSED", "WARNED") and isinstance(named, str) and named in documents
    return False


def _identity(report: dict[str, Any]) -> tuple[str, str, str]:
    """What tells one report from another: the image, the device and when it ran."""
    return str(report.get("image_id")), str(report.get("device")), str(report.get("time"))


def _summary(cell: Cell, pruned: Pruned) -> str:
    return (
        f"{cell.name}: {pruned.tag} ({pruned.digest[:19]}): deleted {len(pruned.reports)} reports and "
        f"{len(pruned.statements)} signed statements, kept {pruned.kept} reports"
    )
