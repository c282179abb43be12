"""Layers compressed and uploaded by the builder itself: the zstd form (`publish push --compression
zstd`), and the gzip form where the engine cannot push one (Docker 29's containerd image store
pushes the layers as the builder loaded them, uncompressed).

Why the builder uploads them: Docker 20.10 (Debian 12's engine) can neither push nor pull zstd
layers. containerd has read them since 1.5, Docker since 23.0 (docs/using-images.md).

How the image stays the one that was self-tested:
- The layers come from `docker save`. Each `layer.tar` there is the layer uncompressed, and its
  sha256 is checked against the image's diff ID before anything is uploaded.
- The config blob is the image's own, byte for byte, so the image ID is unchanged.
- A puller that unpacks checks each decompressed layer against those diff IDs.

The compressed form is reproducible: libzstd in its multithreaded mode writes the same bytes for
the same input, level and library version, whatever the number of workers. So the same image
republished gives the same digests. The library version is named in the manifest's annotations;
another version may give other bytes, and so another digest for the same image ID.

What was compressed is remembered in the cache (`zstd/<level>-<libzstd>/<diff ID>.json`: the
blob's digest and size). A republish to a registry that already holds the blobs compresses nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import docker
import zstandard

from builder import paths
from builder.digests import canonical_json
from builder.engine import archive, ids
from builder.errors import UserError
from builder.oci.registry import OCI_MANIFEST, Manifest, Registry
from builder.steps import Report

ZSTD_LAYER = "application/vnd.oci.image.layer.v1.tar+zstd"
GZIP_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
# zlib's default level, as engines push at; its gzip header carries no time or name, so the same
# layer and zlib version give the same bytes.
GZIP_LEVEL = 6
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
COMPRESSION_ANNOTATION = "io.torch-images.compression"
CHUNK = 1 << 20


def libzstd_version() -> str:
    return ".".join(str(part) for part in zstandard.ZSTD_VERSION)


def describe(level: int) -> str:
    """What the manifest's annotation says of its layers' compression."""
    return f"zstd level {level}, libzstd {libzstd_version()}, multithreaded"


@dataclass(frozen=True)
class Blob:
    digest: str
    size: int


def _compressor(level: int) -> zstandard.ZstdCompressor:
    # threads >= 1 is libzstd's multithreaded mode, whose output does not depend on the number
    # of workers (threads=0, the single-threaded mode, writes other bytes): measured in the tests.
    return zstandard.ZstdCompressor(level=level, threads=max(1, os.cpu_count() or 1), write_content_size=True)


class _HashingSink:
    """Writes to a file and hashes what it writes."""

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle, self.digest, self.size = handle, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.size += len(data)
        return self.handle.write(data)


def compress_layer(source: IO[bytes], size: int, level: int, sink: IO[bytes]) -> tuple[str, Blob]:
    """Compress one uncompressed layer (`size` bytes) into `sink`; returns the layer's own digest
    (its diff ID) and the compressed blob's digest and size."""
    raw, hashing = hashlib.sha256(), _HashingSink(sink)
    with _compressor(level).stream_writer(hashing, size=size, closefd=False) as writer:  # type: ignore[arg-type]
        while chunk := source.read(CHUNK):
            raw.update(chunk)
            writer.write(chunk)
    return "sha256:" + raw.hexdigest(), Blob("sha256:" + hashing.digest.hexdigest(), hashing.size)


def gzip_layer(source: IO[bytes], sink: IO[bytes]) -> tuple[str, Blob]:
    """Compress one uncompressed layer with gzip into `sink`; returns its diff ID and the blob."""
    raw, hashing = hashlib.sha256(), _HashingSink(sink)
    deflate = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
    while chunk := source.read(CHUNK):
        raw.update(chunk)
        hashing.write(deflate.compress(chunk))
    hashing.write(deflate.flush())
    return "sha256:" + raw.hexdigest(), Blob("sha256:" + hashing.digest.hexdigest(), hashing.size)


def cache_dir() -> Path:
    return paths.cache_dir("zstd")


def _cache_file(level: int, diff_id: str) -> Path:
    return cache_dir() / f"{level}-{libzstd_version()}" / f"{diff_id[7:]}.json"


def _gzip_cache_file(diff_id: str) -> Path:
    return paths.cache_dir("gzip") / f"{GZIP_LEVEL}-zlib{zlib.ZLIB_RUNTIME_VERSION}" / f"{diff_id[7:]}.json"


def _remembered(level: int, diff_id: str, path: Path | None = None) -> Blob | None:
    path = path or _cache_file(level, diff_id)
    if path.is_symlink():  # the cache holds files; a link could be pointed anywhere after a check
        return None
    try:
        entry = json.loads(path.read_text())
        blob = Blob(str(entry["digest"]), int(entry["size"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return blob if Registry.is_digest(blob.digest) and blob.size > 0 else None


def _remember(level: int, diff_id: str, blob: Blob, path: Path | None = None) -> None:
    path = path or _cache_file(level, diff_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".{os.getpid()}.tmp")  # two processes at once never share one
    temporary.write_text(json.dumps({"digest": blob.digest, "size": blob.size}))
    os.replace(temporary, path)


def zstd_manifest(config: dict[str, Any], layers: list[Blob], level: int) -> Manifest:
    """The OCI image manifest of the zstd form: the image's own config (by its digest and size)
    and each layer's zstd blob, serialized one way only (the same layers, the same digest)."""
    document = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config["digest"], "size": config["size"]},
        "layers": [{"mediaType": ZSTD_LAYER, "digest": blob.digest, "size": blob.size} for blob in layers],
        "annotations": {COMPRESSION_ANNOTATION: describe(level)},
    }
    return Manifest.of(canonical_json(document), OCI_MANIFEST)


def is_zstd_form(manifest: Manifest, image_id: str) -> bool:
    """Whether a manifest is this image (its config) with every layer zstd-compressed."""
    document = json.loads(manifest.body)
    layers = document.get("layers") or []
    return (document.get("config") or {}).get("digest") == image_id and all(
        layer.get("mediaType") == ZSTD_LAYER for layer in layers
    )


@dataclass(frozen=True)
class Recompression:
    """How a zstd form is made: its level, where progress goes, and whether the cache of layers
    compressed before may be taken on trust (not when what is pushed will be signed)."""

    level: int
    report: Report
    trust_cache: bool = True


def push_zstd_form(
    engine: docker.DockerClient, registry: Registry, repository: str, gzip_form: Manifest, how: Recompression
) -> Manifest:
    """Upload the zstd form of the image `gzip_form` names (the engine's push, already in the
    registry) and return its manifest, not yet under any tag. Layers whose zstd blob the cache
    knows and the registry holds are neither read nor compressed again; with `trust_cache` off
    (a publish that signs what it pushes) every layer is compressed here again, since a changed
    cache entry would name a blob nobody read, and only blobs the registry lacks are uploaded."""
    config = dict(json.loads(gzip_form.body)["config"])
    image_id = str(config["digest"])
    in_engine = ids.engine_id(engine, image_id)
    diff_ids: list[str] = engine.images.get(in_engine).attrs["RootFS"]["Layers"]
    known = {
        d: b for d in set(diff_ids)
        if how.trust_cache and (b := _remembered(how.level, d)) and registry.has_blob(repository, b.digest)
    }  # fmt: skip
    if len(known) < len(set(diff_ids)):
        known |= _compress_and_upload(engine, registry, repository, in_engine, set(diff_ids) - set(known), how)
    return zstd_manifest(config, [known[d] for d in diff_ids], how.level)


def _compress_and_upload(
    engine: docker.DockerClient, registry: Registry, repository: str, image_id: str, wanted: set[str],
    how: Recompression,
) -> dict[str, Blob]:  # fmt: skip
    """One pass over `docker save`: each layer is compressed into a file (its diff ID is known
    only once it has been read), and uploaded when it is one of those wanted. A wanted diff ID
    that no layer of the archive hashes to is refused."""
    found: dict[str, Blob] = {}
    with tempfile.TemporaryDirectory(dir=cache_dir()) as scratch:

        def compress(name: str, size: int, handle: IO[bytes]) -> str:
            path = Path(scratch, "layer.zst")
            with path.open("wb") as sink:
                diff_id, blob = compress_layer(handle, size, how.level, sink)
            if diff_id in wanted and diff_id not in found:
                if not registry.has_blob(repository, blob.digest):
                    registry.upload_blob_file(repository, path, blob.digest)
                _remember(how.level, diff_id, blob)
                found[diff_id] = blob
                how.report(f"zstd layer {diff_id[7:19]}: {size / 1e6:.0f} MB -> {blob.size / 1e6:.0f} MB")
            path.unlink()
            return diff_id

        archive.scan_saved(engine, image_id, compress)
    missing = wanted - set(found)
    if missing:
        raise UserError(
            f"docker save of {image_id[7:19]} held no layer with diff ID {sorted(missing)[0][:19]}; nothing was tagged"
        )
    return found


def push_gzip_form(
    engine: docker.DockerClient, registry: Registry, repository: str, reference: str, report: Report
) -> Manifest:
    """Upload the image tagged `reference` with gzip layers compressed here, and its config blob
    byte for byte; return its OCI manifest, not yet under any tag. For an engine whose push sends
    the layers as they were loaded (the containerd image store): what the registry holds is
    compressed as an engine's push would be, and the same on every engine."""
    found: dict[str, Blob] = {}
    with tempfile.TemporaryDirectory(dir=cache_dir()) as scratch:

        def compress(name: str, size: int, handle: IO[bytes]) -> str:
            path = Path(scratch, "layer.gz")
            with path.open("wb") as sink:
                diff_id, blob = gzip_layer(handle, sink)
            cached = _remembered(GZIP_LEVEL, diff_id, _gzip_cache_file(diff_id))
            if diff_id not in found and not (cached == blob and registry.has_blob(repository, blob.digest)):
                registry.upload_blob_file(repository, path, blob.digest)
                _remember(GZIP_LEVEL, diff_id, blob, _gzip_cache_file(diff_id))
                report(f"gzip layer {diff_id[7:19]}: {size / 1e6:.0f} MB -> {blob.size / 1e6:.0f} MB")
            found[diff_id] = blob
            path.unlink()
            return diff_id

        config_bytes, diff_ids = archive.scan_saved_config_bytes(engine, reference, compress)
    config_digest = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    if not registry.has_blob(repository, config_digest):
        with tempfile.NamedTemporaryFile(dir=cache_dir()) as handle:
            handle.write(config_bytes)
            handle.flush()
            registry.upload_blob_file(repository, Path(handle.name), config_digest)
    document = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": len(config_bytes)},
        "layers": [{"mediaType": GZIP_LAYER, "digest": found[d].digest, "size": found[d].size} for d in diff_ids],
        "annotations": {COMPRESSION_ANNOTATION: f"gzip level {GZIP_LEVEL}, zlib {zlib.ZLIB_RUNTIME_VERSION}"},
    }
    return Manifest.of(canonical_json(document), OCI_MANIFEST)
