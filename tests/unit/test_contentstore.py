"""Reading an image's blobs from containerd's content store (builder/engine/contentstore.py):
found through `ctr`'s plugin listing, each blob checked against its digest, and nothing read
where the engine does not keep its images there."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from builder.engine import canonical, contentstore
from builder.errors import UserError

LISTING = """Type:             io.containerd.content.v1
ID:               content
Exports:
                  root      /var/lib/containerd/io.containerd.content.v1.content

Type:             io.containerd.snapshotter.v1
ID:               overlayfs
Exports:
                  root      /var/lib/containerd/io.containerd.snapshotter.v1.overlayfs
"""


def test_the_content_stores_folder_is_read_from_ctrs_plugin_listing() -> None:
    assert contentstore._content_root(LISTING) == "/var/lib/containerd/io.containerd.content.v1.content"
    assert contentstore._content_root(LISTING.replace("io.containerd.content.v1", "io.containerd.other")) is None


def _put(blobs: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return "sha256:" + digest


def _layer(name: str, content: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    return gzip.compress(buffer.getvalue(), mtime=0)


class FakeEngine:
    def __init__(self, descriptor: dict[str, Any] | None) -> None:
        self.descriptor = descriptor
        self.api = self

    def inspect_image(self, reference: str) -> dict[str, Any]:
        attrs: dict[str, Any] = {"Id": "x", "Architecture": "amd64", "Os": "linux"}
        if self.descriptor is not None:
            attrs["Descriptor"] = self.descriptor
        return attrs


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, dict[str, Any], list[str]]:
    blobs = tmp_path / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    layers = [_put(blobs, _layer("a", b"first")), _put(blobs, _layer("b", b"second"))]
    config = _put(blobs, json.dumps({"architecture": "amd64", "rootfs": {"diff_ids": []}}).encode())
    manifest = json.dumps({
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"digest": config},
        "layers": [{"digest": d} for d in layers],
    }).encode()  # fmt: skip
    arm = _put(blobs, b'{"mediaType": "application/vnd.oci.image.manifest.v1+json", "layers": []}')
    index = json.dumps({
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"digest": arm, "platform": {"architecture": "arm64", "os": "linux"}},
                      {"digest": _put(blobs, manifest), "platform": {"architecture": "amd64", "os": "linux"}}],
    }).encode()  # fmt: skip
    return blobs, {"digest": _put(blobs, index), "mediaType": "application/vnd.oci.image.index.v1+json"}, layers


def test_an_images_layers_come_in_its_order_from_its_platforms_manifest(store) -> None:  # type: ignore[no-untyped-def]
    blobs, descriptor, layers = store
    stored = contentstore.read_image(FakeEngine(descriptor), "x", blobs)  # type: ignore[arg-type]
    assert stored is not None and [blob.digest for blob in stored.layers] == layers
    with stored.layers[1].open() as handle:
        entries = list(canonical.entries(canonical.uncompressed(handle), 0))
    assert [entry.name for entry, _ in entries] == ["b"]


def test_a_blob_whose_bytes_are_not_its_digest_is_an_error_when_read(store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    blobs, descriptor, layers = store
    stored = contentstore.read_image(FakeEngine(descriptor), "x", blobs)  # type: ignore[arg-type]
    assert stored is not None
    (blobs / layers[0].removeprefix("sha256:")).write_bytes(_layer("a", b"tampered"))
    lower = canonical.LowerTree()
    with pytest.raises(UserError, match="its store is damaged"):
        canonical.rewrite_layer(stored.layers[0].open, tmp_path / "out.tar", lower, 0)


def test_nothing_is_read_where_the_engine_names_no_manifest_or_a_blob_is_missing(store) -> None:  # type: ignore[no-untyped-def]
    blobs, descriptor, layers = store
    assert contentstore.read_image(FakeEngine(None), "x", blobs) is None  # type: ignore[arg-type]
    (blobs / layers[1].removeprefix("sha256:")).unlink()
    assert contentstore.read_image(FakeEngine(descriptor), "x", blobs) is None  # type: ignore[arg-type]


def test_an_engine_without_the_containerd_store_is_not_searched() -> None:
    class Overlay2:
        def info(self) -> dict[str, Any]:
            return {"DriverStatus": [["Backing Filesystem", "extfs"]], "Containerd": {"Address": "/run/x.sock"}}

    assert contentstore.locate(Overlay2()) is None  # type: ignore[arg-type]


def _manifest_descriptor(blobs: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    return {
        "digest": _put(blobs, json.dumps(manifest).encode()),
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
    }


@pytest.mark.parametrize(
    "manifest",
    [
        {"config": [], "layers": "sha256:abc"},  # string layers
        {"config": ["not", "an", "object"], "layers": []},  # a list for a config: nothing to read
        {"mediaType": "application/vnd.oci.image.index.v1+json", "manifests": ["sha256:x", 7]},  # string entries
    ],
)
def test_a_store_document_of_the_wrong_shape_is_one_line_or_nothing_never_a_traceback(
    tmp_path: Path, manifest: dict[str, Any]
) -> None:
    blobs = tmp_path / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    try:
        found = contentstore.read_image(FakeEngine(_manifest_descriptor(blobs, manifest)), "x", blobs)  # type: ignore[arg-type]
    except UserError as error:
        assert "\n" not in error.line() and "content store" in error.line()
    else:
        assert found is None


def test_a_blob_that_is_a_link_is_refused_not_followed(store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    blobs, descriptor, layers = store
    outside = tmp_path / "outside"
    (blobs / layers[0].removeprefix("sha256:")).rename(outside)
    (blobs / layers[0].removeprefix("sha256:")).symlink_to(outside)
    with pytest.raises(UserError, match="not a regular file"):
        contentstore.read_image(FakeEngine(descriptor), "x", blobs)  # type: ignore[arg-type]


def test_a_corrupt_gzip_layer_is_one_line(tmp_path: Path) -> None:
    corrupt = _layer("a", b"x" * 1000)[:20] + b"\xff" * 100
    with pytest.raises(UserError, match="gzip stream is corrupt"):
        canonical.rewrite_layer(lambda: io.BufferedReader(io.BytesIO(corrupt)), tmp_path / "out.tar",
                                canonical.LowerTree(), 0)  # fmt: skip
