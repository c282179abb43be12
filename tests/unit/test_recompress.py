"""zstd layers: the compressed form is the same bytes whatever the worker count, the manifest
keeps the image's own config, and an archive without a wanted layer is refused."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
from pathlib import Path

import pytest
import zstandard

from builder.errors import UserError
from builder.oci.registry import Manifest
from builder.publish import recompress


def _layer_bytes() -> bytes:
    rng = random.Random(7)  # compressible, but not trivially: words from a small vocabulary
    words = [bytes(rng.choices(range(97, 123), k=rng.randint(2, 9))) for _ in range(500)]
    return b" ".join(rng.choices(words, k=6_000_000))  # about 36 MB: several of libzstd's jobs


def _compress(data: bytes, cpus: int, monkeypatch: pytest.MonkeyPatch) -> tuple[str, recompress.Blob, bytes]:
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    sink = io.BytesIO()
    diff_id, blob = recompress.compress_layer(io.BytesIO(data), len(data), 9, sink)
    return diff_id, blob, sink.getvalue()


def test_the_compressed_layer_is_the_same_bytes_with_one_or_four_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _layer_bytes()
    one = _compress(data, 1, monkeypatch)
    four = _compress(data, 4, monkeypatch)
    assert one == four
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    single = zstandard.ZstdCompressor(level=9, threads=0, write_content_size=True).compress(data)
    assert single != four[2]  # libzstd's single-threaded mode writes other bytes: why threads >= 1 always
    diff_id, blob, compressed = one
    assert zstandard.ZstdDecompressor().decompress(compressed) == data  # content size is in the frame
    assert blob.size == len(compressed) < len(data) // 2
    assert diff_id == "sha256:" + __import__("hashlib").sha256(data).hexdigest()


def test_the_zstd_manifest_names_the_images_own_config_and_zstd_layers() -> None:
    config = {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:" + "c" * 64,
              "size": 1234}  # fmt: skip
    layers = [recompress.Blob("sha256:" + "a" * 64, 10), recompress.Blob("sha256:" + "b" * 64, 20)]
    manifest = recompress.zstd_manifest(config, layers, 9)
    document = json.loads(manifest.body)
    assert document["config"]["digest"] == config["digest"] and document["config"]["size"] == 1234
    assert [layer["mediaType"] for layer in document["layers"]] == [recompress.ZSTD_LAYER] * 2
    assert "libzstd" in document["annotations"][recompress.COMPRESSION_ANNOTATION]
    assert manifest == recompress.zstd_manifest(config, layers, 9)  # serialized one way only
    assert recompress.is_zstd_form(manifest, config["digest"])
    assert not recompress.is_zstd_form(manifest, "sha256:" + "d" * 64)
    gzip_body = json.dumps({**document, "layers": [{**document["layers"][0], "mediaType": "x+gzip"}]}).encode()
    assert not recompress.is_zstd_form(Manifest.of(gzip_body, manifest.media_type), config["digest"])


class _FakeImages:
    def get(self, _: str) -> object:
        return type("Image", (), {"attrs": {"RootFS": {"Layers": ["sha256:" + "e" * 64]}}})()


class _FakeApi:
    def inspect_image(self, reference: str) -> dict[str, str]:
        return {"Id": reference}  # Docker's own store: the engine's ID is the config digest


class _FakeEngine:
    images = _FakeImages()
    api = _FakeApi()


class _FakeRegistry:
    def __init__(self) -> None:
        self.uploaded: list[str] = []

    def has_blob(self, repository: str, digest: str) -> bool:
        return False

    def upload_blob_file(self, repository: str, path: Path, digest: str) -> None:
        self.uploaded.append(digest)


def test_an_archive_without_the_images_layer_is_refused_and_nothing_is_uploaded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(recompress, "cache_dir", lambda: tmp_path)

    def saved(engine: object, image_id: str, read_layer):  # type: ignore[no-untyped-def]
        other = b"not the layer the config names"
        return {}, [read_layer("x/layer.tar", len(other), io.BytesIO(other))]

    monkeypatch.setattr(recompress.archive, "scan_saved", saved)
    registry = _FakeRegistry()
    gzip_form = Manifest.of(json.dumps({"config": {"digest": "sha256:" + "c" * 64, "size": 1}}).encode(), "x")
    with pytest.raises(UserError, match="held no layer with diff ID sha256:eeee"):
        how = recompress.Recompression(3, lambda _: None)
        recompress.push_zstd_form(_FakeEngine(), registry, "torch", gzip_form, how)  # type: ignore[arg-type]
    assert registry.uploaded == []


def test_the_builders_gzip_form_decompresses_to_the_layer_and_is_the_same_bytes_every_time() -> None:
    """What the containerd store's images are pushed as: gzip written here, no time or name in its
    header, so the same layer gives the same blob on any machine with the same zlib."""
    import gzip

    data = b"".join(b"layer %d of torch\n" % i for i in range(100_000))
    first, second = io.BytesIO(), io.BytesIO()
    diff_id, blob = recompress.gzip_layer(io.BytesIO(data), first)
    assert recompress.gzip_layer(io.BytesIO(data), second) == (diff_id, blob)
    assert first.getvalue() == second.getvalue() and gzip.decompress(first.getvalue()) == data
    assert diff_id == "sha256:" + hashlib.sha256(data).hexdigest()
    assert blob.digest == "sha256:" + hashlib.sha256(first.getvalue()).hexdigest() and blob.size < len(data)
    assert first.getvalue()[4:8] == b"\0\0\0\0"  # the gzip header's modification time


@pytest.mark.parametrize("damage", ["truncated", "not a digest", "a link"])
def test_a_compressed_layer_record_that_is_damaged_or_a_link_is_not_used(tmp_path: Path, damage: str) -> None:
    """Issue 58: a record names the blob a layer compressed to; one truncated, naming no digest,
    or made a link (which could be pointed anywhere after a check) names nothing, and the layer is
    compressed again."""
    record = tmp_path / "record.json"
    blob = recompress.Blob("sha256:" + "a" * 64, 10)
    recompress._remember(19, "sha256:" + "b" * 64, blob, record)
    assert recompress._remembered(19, "sha256:" + "b" * 64, record) == blob
    if damage == "truncated":
        record.write_text(record.read_text()[:20])
    elif damage == "not a digest":
        record.write_text(json.dumps({"digest": "sha256:../../x", "size": 10}))
    else:
        elsewhere = tmp_path / "elsewhere.json"
        record.replace(elsewhere)
        record.symlink_to(elsewhere)
    assert recompress._remembered(19, "sha256:" + "b" * 64, record) is None
