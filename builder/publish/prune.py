"""`publish prune CELL...`: the self-test reports a published image no longer needs.

Every GPU run attaches one more report to a digest (and, with a key, its two signed statements),
and the gates read at most reports.MAX_REPORTS of them. Pruning deletes only what it can prove
is this digest's own attachment: a manifest read from the registry, one document, of a type
publish attaches, whose own `subject` names this digest (a referrers listing, and the referrers
tag anyone who can push may rewrite, is a hint and never proof; what cannot be read is kept).
Of those, from each of a cell's published images (every form: gzip, zstd), it deletes:

- junk: attached as a report, proven, and not one;
- a passing report of another image (its image ID is not the digest's config);
- a device's passing report where a strictly later passing report of the same device, with other
  bytes, is there, and the later one is at least as trusted: a report a statement names (checked
  with `--key`; without a key, any statement naming it counts) is superseded only by a later
  report whose own bytes a statement the key verifies names;
- the signed statements about what it deletes (the report itself, and the test result naming it
  by digest), only together with the exact bytes they name and never while a report with those
  bytes stays, each itself proven to be this digest's, and their layers in cosign 2's `.att`
  manifest.

It decides on artifact digests and exact bytes, never on what a report says of itself: an
artifact listed twice proves once, and a look-alike or byte-identical copy supersedes nothing.

A failed report is never pruned, nor a statement about a failure: the gate keeps refusing its
tags until someone decides the device was at fault and deletes that report by hand. The registry
must allow deleting manifests (distribution's `storage.delete.enabled`; GHCR and GitLab do)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from securesystemslib.signer import SSlibKey

from builder import digests, verdict
from builder.errors import UserError
from builder.oci.registry import Registry
from builder.plan.cell import Cell
from builder.plan.matrix import Matrix
from builder.publish import attachments, multiarch, provenance, publish, reports
from builder.steps import Report

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
    registry: Registry,
    grid: Matrix,
    cells: list[Cell],
    report: Report = print,
    key: SSlibKey | None = None,
    dry_run: bool = False,
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
            door = attachments.Door(registry, repository)
            done.append(prune_digest(door, tag, manifest.digest, image_id, key, dry_run))
            report(("dry run: " if dry_run else "") + _summary(cell, done[-1], dry_run))
    return done


def prune_digest(
    door: attachments.Door, tag: str, digest: str, image_id: str, key: SSlibKey | None = None, dry_run: bool = False
) -> Pruned:
    """Delete what one digest's reports no longer need to say; returns what went (with `dry_run`,
    what would go: nothing is deleted) and what stayed."""
    pruned = Pruned(tag, digest)
    listed = door.listed(digest, [reports.SELFTEST_TYPE])
    door.at_most(listed, MAX_ARTIFACTS, digest, "reports", "prune by hand, a few at a time")
    proven = door.proven(digest, listed, [reports.SELFTEST_TYPE])  # each artifact once, however often listed
    signed = door.signed(digest, image_id, key, MAX_ARTIFACTS)
    attached, statements = _reports(door, proven), [_statement(found) for found in signed]
    going = _stale(attached, image_id, statements, key is not None)
    staying = [a for a in attached if a not in going]
    pruned.kept = len(staying)
    about_gone = [s for s in statements if _goes_with(s, going, staying)]
    by_digest = {found.digest: found for found in [*proven, *(s.attachment for s in signed)]}
    deleted = [a.artifact for a in going] + [s.artifact for s in about_gone]
    if not dry_run:
        door.delete(digest, [by_digest[artifact] for artifact in deleted], {s.envelope for s in about_gone})
    pruned.reports = [a.artifact for a in going]
    pruned.statements = [s.artifact for s in about_gone]
    return pruned


def _reports(door: attachments.Door, proven: list[attachments.Attachment]) -> list[_Attached]:
    """The proven reports, each with its document (None where it is none: junk)."""
    found = []
    for attachment in proven:
        try:
            document = door.document(attachment, verdict.MAX_REPORT_BYTES)
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
    """Junk (attached as a report, and none), passing reports of another image, and passes that a
    strictly later pass of the same device, with other bytes, supersedes. A pass any statement
    names (signed, as far as prune can tell) is superseded only, with the key, by one whose own
    bytes a statement the key verified names. Decided on artifacts and bytes, never on what a
    report says of itself: a look-alike, a byte-identical copy or an entry listed twice supersedes
    nothing. Never a failed report."""
    going = [a for a in attached if a.report is None]
    reports_of = [(a, a.report) for a in attached if a.report is not None and a.report.get("status") == "pass"]
    going += [a for a, report in reports_of if report.get("image_id") != image_id]
    named = {document for s in statements for document in _documents_named(s, attached)}
    verified = {document for s in statements if s.verified for document in _documents_named(s, attached)}
    passes = [(a, r) for a, r in reports_of if a not in going and verdict.why_not_a_pass(r, image_id) is None]
    for older, report in passes:
        newer = [
            a for a, r in passes
            if a.document != older.document and str(r.get("device")) == str(report.get("device"))
            and str(r.get("time")) > str(report.get("time"))
        ]  # fmt: skip
        if older.document in named:  # signed: superseded only by a pass whose own bytes the key signed
            newer = [a for a in newer if keyed and a.document in verified]
        if newer:
            going.append(older)
    return going


def _documents_named(statement: _Statement, attached: list[_Attached]) -> set[str]:
    """The sha256 of each attached report whose exact bytes the statement is about: the test
    result names them by digest; the self-test statement carries the report itself."""
    predicate = statement.predicate
    if statement.predicate_type == provenance.TEST_RESULT:
        configuration = predicate.get("configuration")
        first = configuration[0] if isinstance(configuration, list) and configuration else {}
        sha = first.get("digest", {}).get("sha256") if isinstance(first, dict) else None
        return {sha} if isinstance(sha, str) and any(a.document == sha for a in attached) else set()
    if statement.predicate_type == provenance.SELFTEST:
        carried = reports.document_bytes(predicate)
        return {a.document for a in attached if a.report is not None and _as_signed(a.report) == carried}
    return set()


_ANY = provenance.Subject("x", "sha256:" + "0" * 64, "sha256:" + "0" * 64, "")


def _as_signed(report: dict[str, Any]) -> bytes:
    """A report as a signed self-test statement carries it (its own encoding: no table, numbers
    as floats), to compare with a statement read back."""
    return reports.document_bytes(provenance.selftest_statement(_ANY, report)["predicate"])


def _goes_with(statement: _Statement, going: list[_Attached], staying: list[_Attached]) -> bool:
    """Whether a statement goes: only together with the exact report bytes it names, never while
    a report with those bytes stays, and never one about a failure or anything but a report."""
    if statement.predicate_type == provenance.TEST_RESULT and statement.predicate.get("result") not in (
        "PASSED", "WARNED"  # a pass with warnings is WARNED; only FAILED is a failure, and that is never pruned
    ):  # fmt: skip
        return False
    if statement.predicate_type == provenance.SELFTEST and statement.predicate.get("status") != "pass":
        return False
    named = _documents_named(statement, [*going, *staying])
    return bool(named) and named <= {a.document for a in going} and not named & {a.document for a in staying}


def _summary(cell: Cell, pruned: Pruned, dry_run: bool = False) -> str:
    verb = "would delete" if dry_run else "deleted"
    return (
        f"{cell.name}: {pruned.tag} ({pruned.digest[:19]}): {verb} {len(pruned.reports)} reports and "
        f"{len(pruned.statements)} signed statements, kept {pruned.kept} reports"
    )
