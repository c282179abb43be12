"""`publish prune CELL...`: the self-test reports a published image no longer needs.

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

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from securesystemslib.signer import SSlibKey

from builder import digests
from builder.assemble import smoke
from builder.errors import UserError
from builder.oci.registry import Registry
from builder.plan.cell import Cell
from builder.plan.matrix import Matrix
from builder.progress import Report
from builder.publish import attachments, multiarch, provenance, publish, reports

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
            done.append(prune_digest(attachments.Door(registry, repository), tag, manifest.digest, image_id, key))
            report(_summary(cell, done[-1]))
    return done


def prune_digest(door: attachments.Door, tag: str, digest: str, image_id: str, key: SSlibKey | None = None) -> Pruned:
    """Delete what one digest's reports no longer need to say; returns what went and what stayed."""
    pruned = Pruned(tag, digest)
    listed = door.listed(digest, [reports.SELFTEST_TYPE])
    door.at_most(listed, MAX_ARTIFACTS, digest, "reports", "prune by hand, a few at a time")
    proven = door.proven(digest, listed, [reports.SELFTEST_TYPE])
    signed = door.signed(digest, image_id, key, MAX_ARTIFACTS)
    attached, statements = _reports(door, proven), [_statement(found) for found in signed]
    going = _stale(attached, image_id, statements, key is not None)
    pruned.kept = len(listed) - len(going)
    gone_documents = {a.document for a in going}
    gone_identities = {_identity(a.report) for a in going if a.report is not None}
    about_gone = [s for s in statements if _about_gone(s, image_id, gone_documents, gone_identities)]
    by_digest = {found.digest: found for found in [*proven, *(s.attachment for s in signed)]}
    deleted = [a.artifact for a in going] + [s.artifact for s in about_gone]
    door.delete(digest, [by_digest[artifact] for artifact in deleted], {s.envelope for s in about_gone})
    pruned.reports = [a.artifact for a in going]
    pruned.statements = [s.artifact for s in about_gone]
    return pruned


def _reports(door: attachments.Door, proven: list[attachments.Attachment]) -> list[_Attached]:
    """The proven reports, each with its document (None where it is none: junk)."""
    found = []
    for attachment in proven:
        try:
            document = door.document(attachment, smoke.MAX_REPORT_BYTES)
        except (UserError, LookupError, AttributeError):
            found.append(_Attached(attachment.digest, "", None))  # attached here as a report, and none
            continue
        found.append(_Attached(attachment.digest, attachment.layer.removeprefix("sha256:"), document))
    return found


def _statement(signed: attachments.Signed) -> _Statement:
    """A proven statement as prune reads it, with the digest of its envelope as cosign 2's
    `.att` manifest stores it (the layer that goes with it)."""
    envelope_digest = "sha256:" + hashlib.sha256(digests.canonical_json(signed.envelope)).hexdigest()
    return _Statement(signed.attachment.digest, envelope_digest, signed.predicate_type, signed.predicate,
                      signed.verified)  # fmt: skip


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
