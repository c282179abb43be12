"""The one door to a registry's attachments (builder/publish/attachments.py): a listing is a hint,
only a manifest that names the digest as its subject is proven, only proven attachments are
deleted, and a listing longer than a reader reads is said, not cut short. The real registry's
side of these (a distribution registry, the referrers API) is in tests/integration/test_publish.py
and tests/unit/test_prune.py."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from builder.errors import UserError
from builder.oci.registry import Manifest
from builder.publish import attachments, publish, reports

SUBJECT = "sha256:" + "d" * 64
OTHER = "sha256:" + "e" * 64
SBOM = publish.ARTIFACT_TYPES["sbom"]


def _digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


class _Registry:
    """Artifact manifests by digest, and a listing anyone with push rights wrote."""

    host = "127.0.0.1:5000"

    def __init__(self) -> None:
        self.manifests: dict[str, dict[str, Any]] = {}
        self.listing: list[dict[str, Any]] = []
        self.deleted: list[str] = []
        self.dropped: set[str] = set()

    def add(self, subject: str | None, artifact_type: str, payload: bytes, listed_type: str | None = None) -> str:
        manifest: dict[str, Any] = {"artifactType": artifact_type,
                                    "layers": [{"mediaType": artifact_type, "digest": _digest(payload)}]}  # fmt: skip
        if subject is not None:
            manifest["subject"] = {"digest": subject}
        digest = _digest(json.dumps(manifest).encode())
        self.manifests[digest] = manifest
        self.listing.append({"digest": digest, "artifactType": listed_type or artifact_type})
        return digest

    def referrers(self, repository: str, subject: str, artifact_type: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.listing if artifact_type is None or e["artifactType"] == artifact_type]

    def artifact_manifest(self, repository: str, digest: str) -> dict[str, Any]:
        if digest not in self.manifests:
            raise UserError(f"registry {self.host} lists artifact {digest} but does not serve it")
        return self.manifests[digest]

    def delete_manifest(self, repository: str, digest: str) -> None:
        self.deleted.append(digest)

    def drop_from_referrers_tag(self, repository: str, subject: str, digests: set[str]) -> None:
        self.dropped |= digests

    def manifest(self, repository: str, reference: str) -> Manifest | None:
        return None  # no cosign `.att` manifest


def _door(registry: _Registry) -> attachments.Door:
    return attachments.Door(registry, "torch")  # type: ignore[arg-type]


def test_a_listing_is_a_hint_and_only_a_manifest_naming_this_digest_is_proven() -> None:
    registry = _Registry()
    ours = registry.add(SUBJECT, SBOM, b"our sbom")
    registry.add(OTHER, SBOM, b"another image's sbom")  # listed under this digest by whoever could push
    registry.add(None, SBOM, b"a released image, no subject")
    registry.add(SUBJECT, reports.SELFTEST_TYPE, b"a report", listed_type=SBOM)  # listed as an SBOM, is not one
    registry.listing.append({"digest": "sha256:" + "0" * 64, "artifactType": SBOM})  # listed, not served
    door = _door(registry)
    proven = door.proven(SUBJECT, door.listed(SUBJECT, [SBOM]), [SBOM])
    assert [found.digest for found in proven] == [ours]
    assert door.carries(SUBJECT, SBOM, b"our sbom", most=16)
    assert not door.carries(SUBJECT, SBOM, b"another image's sbom", most=16)
    with pytest.raises(UserError, match=r"belongs to another digest"):
        door.read(SUBJECT, registry.listing[1]["digest"], [SBOM])


def test_only_attachments_proven_for_the_digest_are_deleted() -> None:
    registry = _Registry()
    ours = registry.add(SUBJECT, reports.SELFTEST_TYPE, b"stale report")
    registry.add(OTHER, reports.SELFTEST_TYPE, b"another digest's report")
    door = _door(registry)
    [proven] = door.proven(SUBJECT, door.listed(SUBJECT), [reports.SELFTEST_TYPE])
    elsewhere = attachments.Attachment(ours, OTHER, reports.SELFTEST_TYPE, registry.manifests[ours])
    with pytest.raises(UserError, match="is not proven"):
        door.delete(SUBJECT, [proven, elsewhere])
    assert registry.deleted == []  # nothing, when one of them is not this digest's
    door.delete(SUBJECT, [proven])
    assert registry.deleted == [ours] and registry.dropped == {ours}


def test_more_than_a_reader_reads_is_refused_in_one_line_not_cut_short() -> None:
    registry = _Registry()
    for number in range(reports.MAX_REPORTS + 1):
        registry.add(SUBJECT, reports.SELFTEST_TYPE, f"report {number}".encode())
    with pytest.raises(UserError, match=f"carries {reports.MAX_REPORTS + 1} self-test reports, more than the"):
        _door(registry).reports(SUBJECT)


def test_a_signed_statement_counts_only_when_the_key_verifies_it() -> None:
    """An attestation whose manifest names this digest but whose envelope the key did not sign
    is proven attached, and still not counted."""
    from securesystemslib.signer import CryptoSigner

    from builder.publish import provenance

    team, stranger = CryptoSigner.generate_ed25519(), CryptoSigner.generate_ed25519()
    about = provenance.Subject("r/torch", SUBJECT, "sha256:" + "a" * 64, "b" * 32)
    statement = provenance.selftest_statement(about, {"status": "pass", "image_id": about.image_id})
    registry = _Registry()
    documents: dict[str, dict[str, Any]] = {}
    for signer in (team, stranger):
        bundle = provenance.bundle_document(statement, signer)
        payload = json.dumps(bundle, sort_keys=True).encode()
        documents[_digest(payload)] = bundle
        registry.add(SUBJECT, provenance.BUNDLE_TYPE, payload)
    registry.artifact_document = lambda repository, manifest, limit: documents[manifest["layers"][0]["digest"]]  # type: ignore[attr-defined]
    door = _door(registry)
    assert [s.verified for s in door.signed(SUBJECT, about.image_id, team.public_key, most=8)] == [True]
    assert door.verified_kinds(SUBJECT, about.image_id, team.public_key) == {provenance.SELFTEST}
    assert len(door.signed(SUBJECT, about.image_id, None, most=8)) == 2  # read for what they say, unverified
    with pytest.raises(UserError, match="carries 2 attestations, more than the 1 read"):
        door.signed(SUBJECT, about.image_id, team.public_key, most=1)
