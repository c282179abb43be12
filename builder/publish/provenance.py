"""Signed attestations: the image's SLSA v1 provenance and its self-test reports as in-toto
statements, each in a DSSE envelope signed with a key the team holds, attached to the image's
digest as referrers beside the SBOM.

Maintained libraries do the work: in-toto's attestation library builds and validates the
statements (`in_toto_attestation`), securesystemslib makes and checks the DSSE envelopes with
`cryptography`'s keys. `verify_envelope` also checks each signature a second way, with
`cryptography` alone over DSSE's pre-authentication encoding, so that a fault in one
implementation does not pass an envelope the other refuses. No crypto is written here.

Keyless signing (Sigstore: an OIDC identity, Fulcio's certificate, Rekor's log) needs services
these machines cannot reach; a `Signer` from securesystemslib's sigstore module would take the
key's place in `sign`, and its bundle the envelope's, without changing the statements.
"""

from __future__ import annotations

import base64
import copy
import datetime
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from google.protobuf import json_format
from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
from in_toto_attestation.v1.statement import Statement
from securesystemslib import dsse
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import CryptoSigner, SSlibKey

from builder import digests, jsonread, paths, verdict
from builder.config import vex
from builder.errors import UserError
from builder.plan.cell import Cell
from builder.publish import reports

PAYLOAD_TYPE = "application/vnd.in-toto+json"
# Attestations are attached as Sigstore bundles (v0.3: the DSSE envelope and the key's hint), as
# OCI 1.1 referrers: where cosign 3 and the admission controllers built on it look. Images signed
# before that carry bare DSSE envelopes (ENVELOPE_TYPE); verify and the gates read both.
BUNDLE_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
ENVELOPE_TYPE = "application/vnd.dsse.envelope.v1+json"
SIGNED_TYPES = (BUNDLE_TYPE, ENVELOPE_TYPE)
PROVENANCE = "https://slsa.dev/provenance/v1"
TEST_RESULT = "https://in-toto.io/attestation/test-result/v0.1"  # in-toto's standard test result
CYCLONEDX = "https://cyclonedx.org/bom"  # the SBOM, as cosign's `--type cyclonedx` reads it
SPDX = "https://spdx.dev/Document"  # the SBOM as SPDX 2.3 (cosign's `--type spdxjson`)
OPENVEX = "https://openvex.dev/ns/v0.2.0"  # reviewed not-affected findings (vex.yaml)
SELFTEST = "https://torch-images.invalid/selftest/v1"  # this project's predicate: a self-test report
# A rebuild that gave the published image ID: SLSA's verification summary (a VSA), which policy
# engines read, its policy this project's rebuild check.
REBUILD = "https://slsa.dev/verification_summary/v1"
# This project's predicate: the SOCI index publish made of the image (no standard type names one).
SOCI_INDEX = "https://torch-images.invalid/soci-index/v1"
REBUILD_POLICY = "https://torch-images.invalid/rebuild/v1"
BUILD_TYPE = "https://torch-images.invalid/build/v1"
PREDICATE_ANNOTATION = "io.torch-images.predicate-type"
COSIGN_PREDICATE_ANNOTATION = "dev.sigstore.bundle.predicateType"  # cosign's, and GitHub's attestations'
KEY_ENVIRONMENT = "TORCH_IMAGES_SIGNING_KEY"  # a PEM private key, for CI's secret store
REBUILD_KEY_ENVIRONMENT = "TORCH_IMAGES_REBUILD_KEY"  # a rebuilder's own (publish.rebuilders), never the team's
MAX_KEY_BYTES = 64 << 10
# What a gate reads of one digest's envelopes: a provenance and a report per device that ran it.
MAX_ENVELOPE_BYTES = 4 << 20
MAX_VERIFIED = 256  # attestations read to learn what a digest already carries signed
MAX_SIGNATURES = 16  # signatures on one envelope: the team's among a few others


@dataclass(frozen=True)
class Subject:
    """What a statement is about: one image manifest, by digest, carrying its image ID."""

    name: str  # registry/repository
    digest: str  # sha256:<hex> of the manifest
    image_id: str  # the config digest, which recompression does not change
    build_id: str


def _descriptor(name: str, digest: str, annotations: dict[str, str] | None = None) -> Any:
    algorithm, _, value = digest.partition(":")
    found = ResourceDescriptor(name=name, digest={algorithm: value}, annotations=annotations or {})
    found.validate()
    return found.pb


def _file_descriptor(name: str, path: Path) -> Any:
    return _descriptor(name, "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest())


def build_inputs(cell: Cell) -> dict[str, Path]:
    """Every input of the image, by the name the provenance gives it: the cell's locks (the
    Debian lock holds the base's package list), its Dockerfile and spec (the matrix entry), the
    templates it was rendered from, and the self-test files that ship in it."""
    inputs = {f"images/{cell.name}/{path.name}": path for path in sorted(cell.directory.glob("*.lock"))}
    for name in ("Dockerfile", "spec.json"):
        inputs[f"images/{cell.name}/{name}"] = cell.file(name)
    for path in sorted(paths.TEMPLATES.rglob("*")):
        relative = path.relative_to(paths.TEMPLATES)
        if path.is_file() and relative.parts[0] != "ci":  # the CI templates make no image
            inputs[f"templates/{relative.as_posix()}"] = path
    inputs["image/selftest.py"], inputs["image/gpu_peaks.json"] = paths.SELFTEST, paths.GPU_PEAKS
    return inputs


def provenance_statement(
    subject: Subject, cell: Cell, builder_version: str, built_on: str | None = None
) -> dict[str, Any]:
    """An in-toto statement with the SLSA v1 provenance predicate for the image; `built_on`, the
    engine and backend of the first build as the job that built it recorded them."""
    provenance = provenance_pb2.Provenance()
    definition = provenance.build_definition
    definition.build_type = BUILD_TYPE
    matrix_entry = json.loads(cell.file("spec.json").read_text())  # the matrix entry, as rendered and committed
    definition.external_parameters.update({"cell": cell.name, "matrixEntry": matrix_entry})
    definition.internal_parameters.update({"buildId": subject.build_id, "imageId": subject.image_id})
    if built_on:
        definition.internal_parameters.update({"builtOn": built_on})
    definition.resolved_dependencies.extend(_file_descriptor(n, p) for n, p in build_inputs(cell).items())
    provenance.run_details.builder.id = BUILD_TYPE.removesuffix("/build/v1") + "/builder"
    provenance.run_details.builder.version["torch-images"] = builder_version
    provenance.run_details.metadata.invocation_id = subject.build_id
    predicate = json_format.MessageToDict(provenance)
    return _statement(subject, PROVENANCE, predicate)


def selftest_statement(subject: Subject, report: dict[str, Any]) -> dict[str, Any]:
    """A self-test report as an in-toto statement about the same image."""
    return _statement(subject, SELFTEST, {k: v for k, v in report.items() if k != "table"})


def openvex_statement(
    subject: Subject, decisions: list[vex.Decision], python_packages: set[str], cell: Cell, issued: int
) -> dict[str, Any]:
    """vex.yaml's decisions for this image as one OpenVEX document: each `not_affected` with
    its justification and impact statement, the image (by digest) as the product and the package
    (a PyPI one where the cell's lock has it, else the base's Debian one) as its subcomponent.
    `issued` (the matrix's SOURCE_DATE_EPOCH) dates it, so the same inputs sign the same bytes."""
    name = subject.name.rsplit("/", 1)[-1]
    product = f"pkg:oci/{name}@{subject.digest}?repository_url={subject.name}"
    statements = []
    for decision in decisions:
        ecosystem = "pypi" if decision.package in python_packages else f"deb/{cell.base.distro}"
        statements.append({
            "vulnerability": {"name": decision.vulnerability},
            "products": [{"@id": product, "subcomponents": [{"@id": f"pkg:{ecosystem}/{decision.package}"}]}],
            "status": "not_affected",
            "justification": decision.justification,
            "impact_statement": decision.impact,
        })  # fmt: skip
    document = {
        "@context": OPENVEX,
        "@id": f"https://torch-images.invalid/vex/{subject.digest}",
        "author": "the image's maintainers (vex.yaml, reviewed)",
        "timestamp": datetime.datetime.fromtimestamp(issued, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "version": 1,
        "statements": statements,
    }
    return _statement(subject, OPENVEX, document)


def sbom_statement(subject: Subject, predicate_type: str, document: dict[str, Any]) -> dict[str, Any]:
    """The image's SBOM (CycloneDX, or the same as SPDX) as a statement about it."""
    return _statement(subject, predicate_type, document)


def rebuild_statement(subject: Subject, engine: str, builder_version: str, verified_at: str) -> dict[str, Any]:
    """A rebuild that gave exactly this image ID, as SLSA's verification summary: who rebuilt it
    (the builder, on which engine), when, and that the result is the published digest's image."""
    predicate = {
        "verifier": {"id": REBUILD_POLICY.removesuffix("/rebuild/v1") + "/rebuilder",
                     "version": {"torch-images": builder_version, "engine": engine}},
        "timeVerified": verified_at,
        "resourceUri": f"{subject.name}@{subject.digest}",
        "policy": {"uri": REBUILD_POLICY},
        "verificationResult": "PASSED",
        "verifiedLevels": [],
        "imageId": subject.image_id,
        "buildId": subject.build_id,
    }  # fmt: skip
    return _statement(subject, REBUILD, predicate)


def soci_index_statement(subject: Subject, index_digest: str) -> dict[str, Any]:
    """That `index_digest` is the SOCI index publish made of this image: the one a later publish
    keeps, where its key verifies this statement (another party's index never stands in)."""
    return _statement(subject, SOCI_INDEX, {"index": {"mediaType": "application/vnd.oci.image.manifest.v1+json",
                                                      "digest": index_digest}})  # fmt: skip


def soci_index_named(predicate: dict[str, Any]) -> str | None:
    index = predicate.get("index")
    digest = index.get("digest") if isinstance(index, dict) else None
    return digest if isinstance(digest, str) else None


def rebuild_engine(predicate: dict[str, Any], image_id: str) -> str | None:
    """The engine a signed rebuild statement says gave `image_id`, or None when it is not one."""
    verifier = predicate.get("verifier")
    version = verifier.get("version") if isinstance(verifier, dict) else None
    engine = version.get("engine") if isinstance(version, dict) else None
    passed = predicate.get("verificationResult") == "PASSED" and predicate.get("imageId") == image_id
    policy = predicate.get("policy")
    ours = isinstance(policy, dict) and policy.get("uri") == REBUILD_POLICY
    return str(engine) if passed and ours and isinstance(engine, str) and engine else None


def test_result_statement(subject: Subject, report: dict[str, Any]) -> dict[str, Any]:
    """The same report as in-toto's standard test result, what policies read: `result` (PASSED,
    WARNED or FAILED), the checks by outcome, and the full report as the configuration it names
    by digest (the bytes attached beside it), annotated with its kind (cpu or gpu) and device."""
    checks = [c for c in report.get("checks", []) if isinstance(c, dict)]
    by_status = {
        s: sorted(str(c.get("check")) for c in checks if c.get("status") == s) for s in ("pass", "warn", "fail")
    }
    result = (
        "FAILED" if report.get("status") != "pass" or by_status["fail"] else "WARNED" if by_status["warn"] else "PASSED"
    )
    document = reports.document_bytes(report)
    configuration = {
        "name": "torch-selftest-report.json",
        "digest": {"sha256": hashlib.sha256(document).hexdigest()},
        "mediaType": reports.SELFTEST_TYPE,
        "annotations": {"kind": verdict.report_kind(report), "device": str(report.get("device"))[:120]},
    }
    predicate: dict[str, Any] = {"result": result, "configuration": [configuration]}
    for status, field in (("pass", "passedTests"), ("warn", "warnedTests"), ("fail", "failedTests")):
        if by_status[status]:
            predicate[field] = by_status[status]
    return _statement(subject, TEST_RESULT, predicate)


def _statement(subject: Subject, predicate_type: str, predicate: dict[str, Any]) -> dict[str, Any]:
    annotations = {"imageId": subject.image_id, "buildId": subject.build_id}
    statement = Statement([_descriptor(subject.name, subject.digest, annotations)], predicate_type, predicate)
    statement.validate()
    document: dict[str, Any] = json_format.MessageToDict(statement.pb, preserving_proto_field_name=False)
    return document


# ---------------------------------------------------------------- keys and envelopes


def load_signer(path: Path | None, environment: str = KEY_ENVIRONMENT) -> CryptoSigner | None:
    """A private key (Ed25519 or ECDSA P-256, PEM, unencrypted: CI's secret store keeps it): from
    `--sign-key FILE`, else from `environment` (the team's TORCH_IMAGES_SIGNING_KEY, or a
    rebuilder's TORCH_IMAGES_REBUILD_KEY); None when neither is set."""
    if path is not None:
        try:
            data, where = path.read_bytes()[: MAX_KEY_BYTES + 1], str(path)
        except OSError as error:
            raise UserError(f"--sign-key {path}: cannot read it ({error.strerror})") from None
    elif os.environ.get(environment):
        data, where = os.environ[environment].encode(), environment
    else:
        return None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise UserError(
            f"{where}: not an unencrypted PEM private key; write an Ed25519 or ECDSA P-256 key "
            "(openssl genpkey -algorithm ed25519 -out signing.pem)"
        ) from None
    _check_key_type(key, where)
    return CryptoSigner(key)


def _check_key_type(key: object, where: str) -> None:
    """Ed25519 and ECDSA on P-256 only: the two that sign what `verify --key` and the gates check
    (another curve would sign envelopes nothing here could ever accept)."""
    if isinstance(key, ed25519.Ed25519PrivateKey | ed25519.Ed25519PublicKey):
        return
    if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1):
        return
    kind = (
        f"an ECDSA {key.curve.name} key"
        if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey)
        else (f"a {type(key).__name__.lstrip('_')}")
    )
    raise UserError(f"{where}: {kind}; write an Ed25519 or ECDSA P-256 key")


def load_public_key(path: Path) -> SSlibKey:
    try:
        data = path.read_bytes()[: MAX_KEY_BYTES + 1]
    except OSError as error:
        raise UserError(f"--key {path}: cannot read it ({error.strerror})") from None
    return public_key_from_pem(data, f"--key {path}")


def public_key_from_pem(data: bytes, where: str) -> SSlibKey:
    """A public key the gates and `verify` can check signatures with, or one line saying why not."""
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise UserError(f"{where}: not a PEM public key (openssl pkey -in signing.pem -pubout)") from None
    _check_key_type(key, where)
    return SSlibKey.from_crypto(key)


def is_about(statement: dict[str, Any], digest: str, image_id: str) -> bool:
    """Whether a statement's one subject is exactly this manifest digest carrying this image ID."""
    subjects = statement.get("subject")
    if not isinstance(subjects, list) or len(subjects) != 1 or not isinstance(subjects[0], dict):
        return False
    named = subjects[0].get("digest")
    annotations = subjects[0].get("annotations")
    return (
        isinstance(named, dict)
        and f"sha256:{named.get('sha256')}" == digest
        and isinstance(annotations, dict)
        and annotations.get("imageId") == image_id
    )


def provenance_problem(predicate: dict[str, Any], build_id: str, cell: Cell | None) -> str | None:
    """None when a signed SLSA provenance names this build ID and, where the cell is in this
    checkout, exactly the locks it commits; else why not, in one line."""
    definition = predicate.get("buildDefinition")
    definition = definition if isinstance(definition, dict) else {}
    internal = definition.get("internalParameters")
    named_build = internal.get("buildId") if isinstance(internal, dict) else None
    if named_build != build_id:
        return f"signed provenance names build ID {str(named_build)[:12]}, the image's label {build_id[:12]}"
    if cell is None:
        return None
    committed = {name: path for name, path in build_inputs(cell).items() if name.endswith(".lock")}
    dependencies = definition.get("resolvedDependencies")
    named = {
        str(d.get("name")): f"sha256:{(d.get('digest') or {}).get('sha256')}"
        for d in (dependencies if isinstance(dependencies, list) else []) if isinstance(d, dict)
        and isinstance(d.get("digest"), dict)
    }  # fmt: skip
    differ = [name for name, path in committed.items() if named.get(name) != f"sha256:{digests.sha256_file(path)}"]
    if differ:
        return f"signed provenance's locks differ from this checkout's: {', '.join(differ)}"
    return None


def sign(statement: dict[str, Any], signer: CryptoSigner) -> dict[str, Any]:
    """The statement in a DSSE envelope signed by `signer` (the envelope as a JSON object)."""
    payload = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()
    envelope = dsse.Envelope(payload=payload, payload_type=PAYLOAD_TYPE, signatures={})
    envelope.sign(signer)
    signed: dict[str, Any] = envelope.to_dict()
    return signed


def bundle(statement: dict[str, Any], signer: CryptoSigner) -> bytes:
    return json.dumps(bundle_document(statement, signer), sort_keys=True).encode()


def bundle_document(statement: dict[str, Any], signer: CryptoSigner) -> dict[str, Any]:
    """A Sigstore bundle (v0.3) of the signed statement, for a key: the envelope, and as its
    verification material the key's hint (base64 of the sha256 of its DER public key), no
    transparency-log entry (keyless signing would add Rekor's and Fulcio's here)."""
    public = (
        serialization.load_pem_public_key(signer.public_key.keyval["public"].encode())
        if (signer.public_key.keytype != "ed25519")
        else ed25519.Ed25519PublicKey.from_public_bytes(bytes.fromhex(signer.public_key.keyval["public"]))
    )
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    envelope = sign(statement, signer)
    # No key ID in the signatures: securesystemslib's own IDs mean nothing to other verifiers, and
    # cosign skips a signature whose key ID is not the one it computes (the hint names the key).
    envelope["signatures"] = [{"sig": s["sig"]} for s in envelope["signatures"]]
    document = {
        "mediaType": BUNDLE_TYPE,
        "verificationMaterial": {"publicKey": {"hint": base64.b64encode(hashlib.sha256(der).digest()).decode()}},
        "dsseEnvelope": envelope,
    }
    return document


def envelope_of(document: dict[str, Any], artifact_type: str) -> dict[str, Any]:
    """The DSSE envelope an attestation artifact carries: a bundle's, or the bare one of the
    earlier form; UserError (one line) when the artifact is neither."""
    if artifact_type == ENVELOPE_TYPE:
        return document
    envelope = document.get("dsseEnvelope")
    if document.get("mediaType") != BUNDLE_TYPE or not isinstance(envelope, dict):
        raise UserError("not a Sigstore bundle with a DSSE envelope")
    return envelope


def is_keyless(document: dict[str, Any]) -> bool:
    """A Sigstore bundle signed keyless: its verification material is a certificate from
    Sigstore's CA (GitHub's artifact attestations are), not a public key's hint. No team key
    can verify it; `gh attestation verify` or cosign's `--certificate-identity` does."""
    material = document.get("verificationMaterial") if document.get("mediaType") == BUNDLE_TYPE else None
    return isinstance(material, dict) and ("certificate" in material or "x509CertificateChain" in material)


def verified_statement(
    document: dict[str, Any], artifact_type: str, key: SSlibKey, digest: str, image_id: str
) -> dict[str, Any]:
    """The statement an attestation artifact (a bundle, or a bare envelope) carries, when `key`
    signed it about exactly this manifest digest and image ID, with an object as its predicate;
    UserError (one line) otherwise. What `verify --key` and the gates both ask of an attestation."""
    statement = verify_envelope(envelope_of(document, artifact_type), key)
    if not is_about(statement, digest, image_id):
        raise UserError("signed, but about another digest or image")
    if not isinstance(statement.get("predicate"), dict):
        raise UserError("signed, but its predicate is not an object")
    return statement


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding, as its specification writes it."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def verify_envelope(document: dict[str, Any], key: SSlibKey) -> dict[str, Any]:
    """The statement inside a DSSE envelope that `key` signed; UserError (one line) otherwise.
    The signature is checked by securesystemslib and, independently, by `cryptography` over PAE."""
    if not isinstance(document, dict) or not {"payload", "payloadType", "signatures"} <= document.keys():
        raise UserError("not a DSSE envelope")
    payload_type = document["payloadType"]
    if payload_type != PAYLOAD_TYPE:
        raise UserError(f"the envelope's payload is {str(payload_type)[:60]!r}, not an in-toto statement")
    try:
        signatures = document["signatures"]
        if not isinstance(signatures, list) or not signatures or len(signatures) > MAX_SIGNATURES:
            raise ValueError
        # Each signature on its own, checked against `key` whatever key ID it claims (a bundle's
        # claim none): an envelope the team signed stays the team's when others sign it too.
        envelopes = [
            dsse.Envelope.from_dict(copy.deepcopy({**document, "signatures": [{**s, "keyid": key.keyid}]}))
            for s in signatures
        ]
    except (KeyError, TypeError, ValueError, AttributeError):
        raise UserError("not a DSSE envelope") from None
    envelope = next((e for e in envelopes if _verifies(e, key)), None)
    if envelope is None:
        raise UserError("its signature does not verify with the given key")
    if not _independently_signed(envelope, key):
        raise UserError("its signature does not verify with the given key (second check)")
    try:
        statement = jsonread.loads(envelope.payload, "its payload")
        parsed = Statement([], "", {})
        json_format.ParseDict(statement, parsed.pb)
        parsed.validate()
    except (ValueError, json_format.ParseError, UserError):
        raise UserError("its payload is not a valid in-toto statement") from None
    if not isinstance(statement, dict):
        raise UserError("its payload is not a valid in-toto statement")
    return statement


def _verifies(envelope: dsse.Envelope, key: SSlibKey) -> bool:
    try:
        envelope.verify([key], 1)
        return True
    except VerificationError:
        return False


def _independently_signed(envelope: dsse.Envelope, key: SSlibKey) -> bool:
    public = key.keyval["public"]
    message = pae(envelope.payload_type, envelope.payload)
    for signature in envelope.signatures.values():
        if signature.keyid != key.keyid:
            continue
        raw = bytes.fromhex(signature.signature)
        try:
            if key.keytype == "ed25519":
                ed25519.Ed25519PublicKey.from_public_bytes(bytes.fromhex(public)).verify(raw, message)
                return True
            loaded = serialization.load_pem_public_key(public.encode())
            if not isinstance(loaded, ec.EllipticCurvePublicKey):
                return False
            loaded.verify(raw, message, ec.ECDSA(hashes.SHA256()))
            return True
        except InvalidSignature:
            return False
    return False


# ---------------------------------------------------------------- attaching


def builder_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("torch-images")
    except metadata.PackageNotFoundError:
        return "unknown"


def decoded_statement(envelope: dict[str, Any], name: str) -> Any:
    """What an envelope's payload says, unverified: for reading what a statement is about, never
    for trusting it."""
    return jsonread.loads(base64.b64decode(str(envelope.get("payload", ""))), name)
