"""cosign 2's `.att` form (builder/publish/cosign_tag.py): each signed envelope is added to the
digest's one manifest, and what the tag held before is kept only where it reads as cosign's
form: anyone with push rights can write that tag."""

from __future__ import annotations

import hashlib
import json

from builder.errors import UserError
from builder.oci.registry import OCI_MANIFEST, Manifest
from builder.publish import cosign_tag

SUBJECT = "sha256:" + "a" * 64
SLSA = "https://slsa.dev/provenance/v1"


class FakeRegistry:
    """Blobs and manifests in memory, as the registry client's methods give and take them."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, Manifest] = {}

    def upload_blob(self, repository: str, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self.blobs[digest] = data
        return digest

    def put_manifest(self, repository: str, reference: str, manifest: Manifest) -> str:
        self.manifests[reference] = manifest
        return manifest.digest

    def manifest(self, repository: str, reference: str) -> Manifest | None:
        return self.manifests.get(reference)

    def layers(self) -> list[dict[str, object]]:
        return json.loads(self.manifests[cosign_tag.tag(SUBJECT)].body)["layers"]


def _envelope(n: int) -> dict[str, object]:
    return {"payloadType": "application/vnd.in-toto+json", "payload": f"e{n}", "signatures": [{"sig": "s"}]}


def test_each_envelope_joins_the_digests_one_att_manifest_under_cosigns_tag() -> None:
    registry = FakeRegistry()
    assert cosign_tag.tag(SUBJECT) == "sha256-" + "a" * 64 + ".att"
    cosign_tag.append(registry, "torch", SUBJECT, _envelope(1), SLSA)
    cosign_tag.append(registry, "torch", SUBJECT, _envelope(2), "https://cyclonedx.org/bom")
    cosign_tag.append(registry, "torch", SUBJECT, _envelope(1), SLSA)  # the same again: not twice
    layers = registry.layers()
    assert [json.loads(registry.blobs[str(layer["digest"])])["payload"] for layer in layers] == ["e2", "e1"]
    assert layers[1]["annotations"] == {"dev.cosignproject.cosign/signature": "", "predicateType": SLSA}
    document = json.loads(registry.manifests[cosign_tag.tag(SUBJECT)].body)
    config = json.loads(registry.blobs[document["config"]["digest"]])
    assert config["rootfs"]["diff_ids"] == [layer["digest"] for layer in layers]


def test_what_the_tag_held_is_kept_only_where_it_reads_as_cosigns_form() -> None:
    registry = FakeRegistry()
    good = {"mediaType": cosign_tag.LAYER_TYPE, "size": 10, "digest": "sha256:" + "b" * 64,
            "annotations": {"predicateType": SLSA, "x-extra": "dropped"}}  # fmt: skip
    hostile = [
        {**good, "mediaType": "application/vnd.oci.image.layer.v1.tar"},
        {**good, "digest": "sha256:../../etc"},
        {**good, "size": -1},
        {**good, "size": 1 << 40},
        {**good, "annotations": {"predicateType": "javascript:alert(1)\n"}},
        "not an object",
    ]
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "layers": [good, *hostile]}).encode()
    registry.manifests[cosign_tag.tag(SUBJECT)] = Manifest.of(body, OCI_MANIFEST)
    cosign_tag.append(registry, "torch", SUBJECT, _envelope(1), SLSA)
    layers = registry.layers()
    assert len(layers) == 2 and layers[0]["digest"] == good["digest"]
    assert layers[0]["annotations"] == {"dev.cosignproject.cosign/signature": "", "predicateType": SLSA}


def test_a_tag_the_registry_will_not_read_back_is_replaced_not_a_traceback() -> None:
    registry = FakeRegistry()

    def refuses(repository: str, reference: str) -> Manifest | None:
        raise UserError("registry 127.0.0.1:1: answered 500")

    registry.manifest = refuses  # type: ignore[method-assign]
    cosign_tag.append(registry, "torch", SUBJECT, _envelope(1), SLSA)
    assert len(registry.layers()) == 1


def test_the_manifest_keeps_at_most_its_cap_of_envelopes_the_newest_last() -> None:
    registry = FakeRegistry()
    for n in range(cosign_tag.MAX_LAYERS + 5):
        cosign_tag.append(registry, "torch", SUBJECT, _envelope(n), SLSA)
    layers = registry.layers()
    assert len(layers) == cosign_tag.MAX_LAYERS
    assert json.loads(registry.blobs[str(layers[-1]["digest"])])["payload"] == f"e{cosign_tag.MAX_LAYERS + 4}"
