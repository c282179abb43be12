"""cosign 2's form of attestations, kept beside the Sigstore bundles: every DSSE envelope about
a digest, as one layer of a single image manifest under the tag `sha256-<hex>.att` (cosign's
specs/ATTESTATION_SPEC.md; the config and annotations are what `cosign attest
--new-bundle-format=false` writes). cosign 2, the policy engines built on its libraries, and
cosign 3 on a registry without referrers look there. Each envelope is the one the bundle holds,
so both forms say the same thing, signed once."""

from __future__ import annotations

import json
from typing import Any

from builder import digests, jsonread
from builder.config import grammar
from builder.errors import UserError
from builder.oci.registry import DIGEST, OCI_MANIFEST, Manifest

LAYER_TYPE = "application/vnd.dsse.envelope.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"  # empty: the envelope holds the signature
PREDICATE_ANNOTATION = "predicateType"
MAX_LAYERS = 64  # a provenance, SBOMs, VEX and a report per device, with room to spare
MAX_LAYER_BYTES = 4 << 20


def tag(digest: str) -> str:
    """Where cosign 2 looks for a digest's attestations."""
    return digest.replace(":", "-", 1) + ".att"


def append(registry: Any, repository: str, digest: str, envelope: dict[str, Any], predicate_type: str) -> str:
    """Add one envelope to the digest's `.att` manifest (made when there is none); returns the
    manifest's digest. What the tag held before is kept only where it reads as cosign's form."""
    body = digests.canonical_json(envelope)  # prune finds the layer again by this digest
    layer = {
        "mediaType": LAYER_TYPE,
        "size": len(body),
        "digest": registry.upload_blob(repository, body),
        "annotations": {SIGNATURE_ANNOTATION: "", PREDICATE_ANNOTATION: predicate_type},
    }
    kept = [entry for entry in _layers(registry, repository, tag(digest)) if entry["digest"] != layer["digest"]]
    return _put(registry, repository, digest, [*kept[-(MAX_LAYERS - 1) :], layer])


def remove(registry: Any, repository: str, digest: str, layers: set[str]) -> None:
    """Take these envelope layers (by digest) out of the digest's `.att` manifest (pruning)."""
    current = _layers(registry, repository, tag(digest)) if layers else []
    kept = [entry for entry in current if entry["digest"] not in layers]
    if len(kept) != len(current):
        _put(registry, repository, digest, kept)


def _put(registry: Any, repository: str, digest: str, layers: list[dict[str, Any]]) -> str:
    config = _config([entry["digest"] for entry in layers])
    document = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": CONFIG_TYPE, "size": len(config), "digest": registry.upload_blob(repository, config)},
        "layers": layers,
    }
    manifest = Manifest.of(json.dumps(document, separators=(",", ":")).encode(), OCI_MANIFEST)
    registry.put_manifest(repository, tag(digest), manifest)
    return manifest.digest


def _config(diff_ids: list[str]) -> bytes:
    """The config cosign writes for its signature and attestation images: nothing but the layers."""
    config = {
        "architecture": "",
        "created": "0001-01-01T00:00:00Z",
        "history": [{"created": "0001-01-01T00:00:00Z"}],
        "os": "",
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "config": {},
    }
    return json.dumps(config, separators=(",", ":")).encode()


def _layers(registry: Any, repository: str, reference: str) -> list[dict[str, Any]]:
    """The envelope layers the tag holds now, each rebuilt from checked fields; none where the
    tag is missing or holds something else (anyone with push rights can write the tag)."""
    try:
        manifest = registry.manifest(repository, reference)
        document = jsonread.loads(manifest.body, reference) if manifest is not None else {}
    except UserError:
        return []
    layers = document.get("layers") if isinstance(document, dict) else None
    kept = []
    for entry in layers if isinstance(layers, list) else []:
        if not isinstance(entry, dict) or entry.get("mediaType") != LAYER_TYPE:
            continue
        digest, size = entry.get("digest"), entry.get("size")
        annotations = entry.get("annotations") if isinstance(entry.get("annotations"), dict) else {}
        predicate_type = annotations.get(PREDICATE_ANNOTATION)  # type: ignore[union-attr]
        if not (isinstance(digest, str) and DIGEST.fullmatch(digest)):
            continue
        if not (isinstance(size, int) and 0 < size <= MAX_LAYER_BYTES):
            continue
        if not (isinstance(predicate_type, str) and grammar.URL.matches(predicate_type)):
            continue
        kept.append({"mediaType": LAYER_TYPE, "size": size, "digest": digest,
                     "annotations": {SIGNATURE_ANNOTATION: "", PREDICATE_ANNOTATION: predicate_type}})  # fmt: skip
    return kept
