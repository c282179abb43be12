"""Signed attestations (builder/publish/provenance.py): in-toto statements in DSSE envelopes, with
real keys (Ed25519 and ECDSA P-256 made by `cryptography`) and both verifiers."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from in_toto_attestation.v1.statement import Statement
from securesystemslib import dsse
from securesystemslib.signer import CryptoSigner

from builder.errors import UserError
from builder.plan.matrix import load_matrix
from builder.publish import provenance, reports, trust

REPO = Path(__file__).resolve().parents[2]
CELL = "2.13.0-cpu-bookworm-runtime"
SUBJECT = provenance.Subject("127.0.0.1:5000/torch", "sha256:" + "a" * 64, "sha256:" + "b" * 64, "c" * 32)
GENERATORS = [CryptoSigner.generate_ed25519, CryptoSigner.generate_ecdsa]


@pytest.fixture(scope="module")
def statement() -> dict[str, Any]:
    grid = load_matrix(REPO / "matrix.yaml")
    return provenance.provenance_statement(SUBJECT, grid.cell(CELL), "0.1.0")


def test_the_provenance_names_the_digest_the_image_and_every_input_by_its_sha256(statement: dict[str, Any]) -> None:
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    [subject] = statement["subject"]
    assert subject["digest"] == {"sha256": "a" * 64}
    assert subject["annotations"] == {"imageId": SUBJECT.image_id, "buildId": SUBJECT.build_id}
    definition = statement["predicate"]["buildDefinition"]
    assert definition["internalParameters"] == {"buildId": SUBJECT.build_id, "imageId": SUBJECT.image_id}
    inputs = {d["name"]: d["digest"]["sha256"] for d in definition["resolvedDependencies"]}
    for name in ("requirements.lock", "debian.lock", "Dockerfile", "spec.json"):
        path = REPO / "images" / CELL / name
        assert inputs[f"images/{CELL}/{name}"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert "templates/Dockerfile.j2" in inputs and "image/selftest.py" in inputs and "image/gpu_peaks.json" in inputs
    assert not any(name.startswith("templates/ci/") for name in inputs)  # the CI templates make no image
    assert definition["externalParameters"]["matrixEntry"] == json.loads(
        (REPO / "images" / CELL / "spec.json").read_text()
    )


@pytest.mark.parametrize("generate", GENERATORS)
def test_a_signed_statement_verifies_with_its_key_through_both_verifiers(
    generate: Any, statement: dict[str, Any]
) -> None:
    signer = generate()
    envelope = provenance.sign(statement, signer)
    assert provenance.verify_envelope(envelope, signer.public_key) == statement
    assert "sig" in envelope["signatures"][0]  # verifying read the envelope without consuming it
    parsed = dsse.Envelope.from_dict(envelope)
    # the two encodings agree, and the second verifier alone accepts the signature
    assert provenance.pae(parsed.payload_type, parsed.payload) == parsed.pae()
    assert provenance._independently_signed(parsed, signer.public_key)


@pytest.mark.parametrize("generate", GENERATORS)
def test_a_flipped_byte_a_wrong_key_or_a_forged_signature_fails_in_one_line(
    generate: Any, statement: dict[str, Any]
) -> None:
    signer, other = generate(), generate()
    envelope = provenance.sign(statement, signer)
    payload = bytearray(base64.b64decode(envelope["payload"]))
    payload[payload.index(b"a" * 64)] ^= 1  # one bit of the subject's digest
    flipped = {**envelope, "payload": base64.b64encode(bytes(payload)).decode()}
    signature = bytearray(base64.b64decode(envelope["signatures"][0]["sig"]))
    signature[-1] ^= 1
    forged = {
        **envelope,
        "signatures": [{**envelope["signatures"][0], "sig": base64.b64encode(bytes(signature)).decode()}],
    }
    for document, key in ((flipped, signer.public_key), (envelope, other.public_key), (forged, signer.public_key)):
        with pytest.raises(UserError, match=r"^its signature does not verify with the given key"):
            provenance.verify_envelope(document, key)


def test_the_second_verifier_refuses_on_its_own_a_signature_over_the_bare_payload(statement: dict[str, Any]) -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    signer = CryptoSigner(key)
    parsed = dsse.Envelope.from_dict(provenance.sign(statement, signer))
    [entry] = parsed.signatures.values()
    entry.signature = key.sign(parsed.payload).hex()  # signed, but not over DSSE's encoding
    assert not provenance._independently_signed(parsed, signer.public_key)


def test_an_envelope_whose_payload_is_not_a_statement_is_refused(statement: dict[str, Any]) -> None:
    signer = CryptoSigner.generate_ed25519()
    envelope = dsse.Envelope(payload=b'{"_type": "x"}', payload_type=provenance.PAYLOAD_TYPE, signatures={})
    envelope.sign(signer)
    with pytest.raises(UserError, match="not a valid in-toto statement"):
        provenance.verify_envelope(envelope.to_dict(), signer.public_key)
    with pytest.raises(UserError, match="not a DSSE envelope"):
        provenance.verify_envelope({"payload": 3}, signer.public_key)
    other_type = dsse.Envelope(payload=b"{}", payload_type="text/plain", signatures={})
    other_type.sign(signer)
    with pytest.raises(UserError, match="not an in-toto statement"):
        provenance.verify_envelope(other_type.to_dict(), signer.public_key)
    Statement([], "", {})  # the library the verifier validates with is the one the builder builds with


def test_a_self_test_report_becomes_a_statement_about_the_same_image() -> None:
    report = {"status": "pass", "image_id": SUBJECT.image_id, "device": "cpu", "checks": [], "table": "x"}
    statement = provenance.selftest_statement(SUBJECT, report)
    assert statement["predicateType"] == provenance.SELFTEST and "table" not in statement["predicate"]
    assert statement["subject"][0]["annotations"]["imageId"] == SUBJECT.image_id


def test_keys_are_read_from_a_file_or_the_environment_and_a_bad_one_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    (tmp_path / "signing.pem").write_bytes(pem)
    monkeypatch.delenv(provenance.KEY_ENVIRONMENT, raising=False)
    assert provenance.load_signer(None) is None
    assert provenance.load_signer(tmp_path / "signing.pem") is not None
    monkeypatch.setenv(provenance.KEY_ENVIRONMENT, pem.decode())
    signer = provenance.load_signer(None)
    assert signer is not None
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "signing.pub").write_bytes(public)
    assert provenance.load_public_key(tmp_path / "signing.pub").keyid == signer.public_key.keyid
    (tmp_path / "junk.pem").write_text("not a key\n")
    with pytest.raises(UserError, match=r"junk.pem: not an unencrypted PEM private key; write an Ed25519"):
        provenance.load_signer(tmp_path / "junk.pem")
    with pytest.raises(UserError, match="not a PEM public key"):
        provenance.load_public_key(tmp_path / "junk.pem")
    rsa_pem = rsa.generate_private_key(65537, 2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (tmp_path / "rsa.pem").write_bytes(rsa_pem)
    with pytest.raises(UserError, match="RSAPrivateKey; write an Ed25519 or ECDSA P-256 key"):
        provenance.load_signer(tmp_path / "rsa.pem")


@pytest.mark.parametrize(
    ("curve", "name"), [(ec.SECP256K1(), "secp256k1"), (ec.SECP384R1(), "secp384r1")]
)  # fmt: skip
def test_a_key_on_another_curve_is_refused_in_one_line_private_or_public(
    tmp_path: Path, curve: ec.EllipticCurve, name: str
) -> None:
    """Issue 35: secp256k1 gave a traceback, and P-384 signed what `verify --key` never accepts."""
    key = ec.generate_private_key(curve)
    (tmp_path / "k.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    (tmp_path / "k.pub").write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(UserError, match=rf"k.pem: an ECDSA {name} key; write an Ed25519 or ECDSA P-256 key"):
        provenance.load_signer(tmp_path / "k.pem")
    with pytest.raises(UserError, match=rf"k.pub: an ECDSA {name} key; write an Ed25519 or ECDSA P-256 key"):
        provenance.load_public_key(tmp_path / "k.pub")


def test_the_gates_trust_the_key_given_else_the_ci_variable_else_the_signers_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    team_key, other_key = ed25519.Ed25519PrivateKey.generate(), ed25519.Ed25519PrivateKey.generate()
    team, other = CryptoSigner(team_key), CryptoSigner(other_key)
    public = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    team_pub, other_pub = team_key.public_key().public_bytes(*public), other_key.public_key().public_bytes(*public)
    (tmp_path / "team.pub").write_bytes(team_pub)
    monkeypatch.delenv(trust.KEY_ENVIRONMENT, raising=False)
    assert trust.trust_key(None, None) is None
    assert trust.trust_key(None, team).keyid == team.public_key.keyid  # type: ignore[union-attr]
    monkeypatch.setenv(trust.KEY_ENVIRONMENT, other_pub.decode())
    assert trust.trust_key(None, team).keyid == other.public_key.keyid  # type: ignore[union-attr]
    assert trust.trust_key(tmp_path / "team.pub", other).keyid == team.public_key.keyid  # type: ignore[union-attr]
    monkeypatch.setenv(trust.KEY_ENVIRONMENT, "not a key")
    with pytest.raises(UserError, match=r"^TORCH_IMAGES_VERIFY_KEY: not a PEM public key"):
        trust.trust_key(None, None)


@pytest.mark.parametrize("payload_type", [5, None, ["x"], {"a": 1}])
def test_an_envelope_whose_payload_type_is_not_a_string_is_one_line(payload_type: object) -> None:
    key = CryptoSigner.generate_ed25519().public_key
    with pytest.raises(UserError, match="not an in-toto statement"):
        provenance.verify_envelope({"payload": "e30=", "payloadType": payload_type, "signatures": []}, key)


@pytest.mark.parametrize("generate", GENERATORS)
def test_a_statement_is_attached_as_a_sigstore_bundle_that_verifies_with_its_key(
    generate: Any, statement: dict[str, Any]
) -> None:
    """The form cosign 3 reads (issue 37): a v0.3 bundle holding the envelope, the key as a hint."""
    signer, other = generate(), generate()
    document = json.loads(provenance.bundle(statement, signer))
    assert document["mediaType"] == provenance.BUNDLE_TYPE
    assert len(base64.b64decode(document["verificationMaterial"]["publicKey"]["hint"])) == 32
    assert all(set(s) == {"sig"} for s in document["dsseEnvelope"]["signatures"])  # no key ID cosign would trip on
    envelope = provenance.envelope_of(document, provenance.BUNDLE_TYPE)
    assert provenance.verify_envelope(envelope, signer.public_key) == statement
    with pytest.raises(UserError, match="does not verify with the given key"):
        provenance.verify_envelope(envelope, other.public_key)
    with pytest.raises(UserError, match="not a Sigstore bundle"):
        provenance.envelope_of({"mediaType": "x", "dsseEnvelope": envelope}, provenance.BUNDLE_TYPE)


def test_a_report_becomes_in_totos_test_result_naming_the_attached_report_by_digest() -> None:
    checks = [{"check": "cpu", "status": "warn"}, {"check": "sdpa", "status": "pass"}, {"check": "x", "status": "skip"}]
    report = {"status": "pass", "image_id": SUBJECT.image_id, "device": "cpu", "checks": checks, "table": "t"}
    statement = provenance.test_result_statement(SUBJECT, report)
    predicate = statement["predicate"]
    assert statement["predicateType"] == "https://in-toto.io/attestation/test-result/v0.1"
    assert (
        predicate["result"] == "WARNED" and predicate["passedTests"] == ["sdpa"] and predicate["warnedTests"] == ["cpu"]
    )
    [configuration] = predicate["configuration"]
    assert configuration["digest"]["sha256"] == hashlib.sha256(reports.document_bytes(report)).hexdigest()
    assert configuration["annotations"] == {"kind": "cpu", "device": "cpu"}
    failed = {**report, "status": "fail", "checks": [*checks, {"check": "amp", "status": "fail"}]}
    assert provenance.test_result_statement(SUBJECT, failed)["predicate"]["failedTests"] == ["amp"]
    assert provenance.test_result_statement(SUBJECT, failed)["predicate"]["result"] == "FAILED"
    clean = {**report, "checks": [{"check": "sdpa", "status": "pass"}]}
    assert provenance.test_result_statement(SUBJECT, clean)["predicate"]["result"] == "PASSED"


@pytest.mark.parametrize("team_first", [True, False])
def test_an_envelope_the_team_signed_still_verifies_when_another_party_signs_it_too(
    statement: dict[str, Any], team_first: bool
) -> None:
    """Issue 47: a second signature on the team's envelope stopped it verifying (every signature
    was checked under the team key's ID, and the last one won)."""
    team, other = CryptoSigner.generate_ed25519(), CryptoSigner.generate_ed25519()
    signed = provenance.sign(statement, team)
    by_other = provenance.sign(statement, other)
    both = [*signed["signatures"], *by_other["signatures"]] if team_first else [
        *by_other["signatures"], *signed["signatures"]]  # fmt: skip
    assert provenance.verify_envelope({**signed, "signatures": both}, team.public_key)["predicateType"]
    with pytest.raises(UserError, match="does not verify"):
        provenance.verify_envelope(by_other, team.public_key)


def test_a_signed_rebuild_counts_only_for_the_image_id_it_gave() -> None:
    about = provenance.Subject("r/torch", "sha256:" + "1" * 64, "sha256:" + "2" * 64, "b" * 32)
    predicate = provenance.rebuild_statement(about, "Docker 29 (containerd store)", "v", "2026-12-06T00:00:00Z")[
        "predicate"
    ]
    assert provenance.rebuild_engine(predicate, about.image_id) == "Docker 29 (containerd store)"
    assert provenance.rebuild_engine(predicate, "sha256:" + "3" * 64) is None
    assert provenance.rebuild_engine({**predicate, "verificationResult": "FAILED"}, about.image_id) is None
    assert provenance.rebuild_engine({**predicate, "policy": {"uri": "x"}}, about.image_id) is None
