"""Prune against a real registry without the referrers API (Debian's distribution 2.8: the
referrers tag `sha256-<hex>`, which push rights can rewrite), with the listing made to count wrong
as a party with push rights and no key could (issue 57): a look-alike of the team's signed GPU
pass, byte-identical or with other figures, and a listing that names every entry twice. Prune
must delete nothing the team signed or the gate needs, and still the one stale pass.
(The referrers-API side of the same cases: tests/unit/test_prune.py's HTTP registry.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from securesystemslib.signer import CryptoSigner

from builder.oci.registry import OCI_INDEX, OCI_MANIFEST, Manifest, Registry
from builder.publish import attachments, provenance, prune, reports
from tests.integration.conftest import RunningRegistry
from tests.unit.test_gpu_gate import gpu_report

pytestmark = pytest.mark.integration

CONFIG = b'{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}'


def _subject(api: Registry) -> tuple[Manifest, str]:
    image_id = api.upload_blob("torch", CONFIG)
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "layers": [],
                       "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": image_id,
                                  "size": len(CONFIG)}}).encode()  # fmt: skip
    subject = Manifest.of(body, OCI_MANIFEST)
    api.put_manifest("torch", "t", subject)
    return subject, image_id


def _doubled_listing(api: Registry, subject: str) -> None:
    """Re-put the referrers tag with every entry listed twice: nothing forged, nothing added."""
    tag = api.referrers_tag(subject)
    served = api.manifest("torch", tag)
    assert served is not None
    index = json.loads(served.body)
    index["manifests"] = index["manifests"] * 2
    api.put_manifest("torch", tag, Manifest.of(json.dumps(index).encode(), OCI_INDEX))


def test_prune_on_the_referrers_tag_deletes_nothing_the_team_signed_for_a_look_alike_or_a_doubled_listing(
    start_registry,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    running: RunningRegistry = start_registry()
    api = running.api()
    subject, image_id = _subject(api)
    door, signer = attachments.Door(api, "torch"), CryptoSigner.generate_ed25519()
    about = provenance.Subject(f"{running.host}/torch", subject.digest, image_id, "b" * 32)
    older = {**gpu_report(image_id), "time": "2026-01-01T00:00:00Z"}
    team = {**gpu_report(image_id), "time": "2026-02-01T00:00:00Z"}
    for report in (older, team):  # the team's GPU passes, each attached and signed as sign-gpu does
        door.attach_report(subject, "t", report, about.build_id, "t")
        door.attach_signed_report(subject, "t", about, report, signer)
    # A stranger with push rights and no key: the team's pass byte for byte under a manifest of its
    # own, and the same identity (image, device, time) with other figures.
    api.push_artifact("torch", "copy", reports.document_bytes(team), reports.SELFTEST_TYPE, {"by": "stranger"},
                      subject)  # fmt: skip
    look_alike = {**team, "checks": [*team["checks"][:-1], {**team["checks"][-1], "message": "made up"}]}
    door.attach_report(subject, "look-alike", look_alike, about.build_id, "t")
    _doubled_listing(api, subject.digest)
    statements = {e["digest"] for e in door.listed(subject.digest, provenance.SIGNED_TYPES)}
    assert len(statements) == 4

    listed_before = door.listed(subject.digest)
    would = prune.prune_digest(door, "t", subject.digest, image_id, signer.public_key, dry_run=True)
    assert door.listed(subject.digest) == listed_before  # a dry run deletes nothing
    pruned = prune.prune_digest(door, "t", subject.digest, image_id, signer.public_key)
    assert (would.reports, would.statements) == (pruned.reports, pruned.statements)  # and says what will go

    # Only the team's older pass went, with its two statements; the team's newest pass, both its
    # statements and the strangers' reports (which supersede nothing and are superseded by nothing
    # later than them) stayed.
    left = door.reports(subject.digest)
    assert sorted(r["time"] for r in left) == ["2026-02-01T00:00:00Z"] * 3
    assert len(pruned.reports) == 1 and len(pruned.statements) == 2
    kept = door.signed(subject.digest, image_id, signer.public_key, 64)
    carried = {reports.document_bytes(s.predicate) for s in kept if s.predicate_type == provenance.SELFTEST}
    assert prune._as_signed(team) in carried and prune._as_signed(older) not in carried
    assert len(kept) == 2


def test_prune_without_a_key_on_a_doubled_listing_keeps_the_newest_unsigned_pass(
    start_registry,  # type: ignore[no-untyped-def]
) -> None:
    """Issue 57: without a key, an unsigned image lost both its reports to a doubled listing."""
    running: RunningRegistry = start_registry()
    api = running.api()
    subject, image_id = _subject(api)
    door = attachments.Door(api, "torch")
    for time in ("2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z"):
        door.attach_report(subject, "t", {**gpu_report(image_id), "time": time}, "b" * 32, "t")
    _doubled_listing(api, subject.digest)
    pruned = prune.prune_digest(door, "t", subject.digest, image_id)
    assert [r["time"] for r in door.reports(subject.digest)] == ["2026-02-01T00:00:00Z"]
    assert len(pruned.reports) == 1
