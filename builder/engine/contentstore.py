"""An image's blobs read straight from containerd's content store, where Docker keeps them.

With the containerd image store (Docker 29's default), `docker save` streams every blob from
containerd through dockerd: about 48 MB/s here, with both daemons busy (8 s for the CPU cell's
376 MB), longer than reading, decompressing and rewriting the layers together. containerd keeps
each blob as a file named by its digest (`<root>/blobs/sha256/<hex>`, its local content
store), so the pass after the build reads them there when it can: the engine's containerd
answers on the socket `docker info` names, `ctr` (shipped with containerd) reports the content
store's folder, and the builder may read it (root). Every blob is checked against its digest as
it is read; a mismatch is an error, never an image. Where any of that is missing (Docker's own
image store, no `ctr`, not root, a remote engine), the caller uses `docker save`.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import docker

from builder.errors import UserError
from builder.oci.registry import DIGEST, INDEX_TYPES, sha256_digest

DOCUMENT_LIMIT = 4 << 20
CHUNK = 1 << 20


@dataclass(frozen=True)
class Blob:
    digest: str
    path: Path

    def open(self) -> IO[bytes]:
        """The blob's bytes, checked against its digest when the last byte is read."""
        return io.BufferedReader(_Verified(self.path.open("rb"), self.digest), CHUNK)


@dataclass(frozen=True)
class StoredImage:
    config: bytes  # the engine's config, as stored (its sha256 is the config digest)
    layers: list[Blob]  # in the image's order, as stored (gzip, zstd or plain tar)


def locate(engine: docker.DockerClient) -> Path | None:
    """The content store's blobs folder of the engine's containerd, or None where it cannot be read."""
    info = engine.info()
    if not any("containerd.snapshotter" in str(pair) for pair in info.get("DriverStatus") or []):
        return None
    address = (info.get("Containerd") or {}).get("Address")
    ctr = shutil.which("ctr")
    if not isinstance(address, str) or not address or ctr is None:
        return None
    try:
        listed = subprocess.run(
            [ctr, "--address", address, "plugins", "ls", "--detailed"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    root = _content_root(listed.stdout) if listed.returncode == 0 else None
    blobs = Path(root) / "blobs" / "sha256" if root else None
    return blobs if blobs is not None and blobs.is_dir() and _readable(blobs) else None


def _content_root(listing: str) -> str | None:
    """The `root` export of the io.containerd.content.v1 plugin in `ctr plugins ls --detailed`."""
    inside = False
    for line in listing.splitlines():
        words = line.split()
        if line.startswith("Type:"):
            inside = words[1:2] == ["io.containerd.content.v1"]
        elif inside and words[:1] == ["root"] and len(words) == 2:
            return words[1]
    return None


def _readable(folder: Path) -> bool:
    try:
        next(folder.iterdir(), None)
        return True
    except OSError:
        return False


def read_image(engine: docker.DockerClient, reference: str, blobs: Path) -> StoredImage | None:
    """The image's config and layer blobs from the store, or None when the engine does not name
    its manifest (Docker's own image store) or a blob is not there."""
    attrs = engine.api.inspect_image(reference)
    descriptor = attrs.get("Descriptor")
    if not isinstance(descriptor, dict):
        return None
    manifest = _document(blobs, str(descriptor.get("digest")))
    if manifest is None:
        return None
    if descriptor.get("mediaType") in INDEX_TYPES or manifest.get("mediaType") in INDEX_TYPES:
        chosen = _platform_manifest(manifest, str(attrs.get("Architecture")), str(attrs.get("Os")))
        manifest = _document(blobs, chosen) if chosen else None
        if manifest is None:
            return None
    config_digest = str(_object(manifest.get("config")).get("digest"))
    config = _bytes(blobs, config_digest)
    listed = manifest.get("layers")
    if not isinstance(listed, list):
        raise _damaged(str(descriptor.get("digest")), "its manifest's layers are not a list")
    layers = [_blob(blobs, str(_object(layer).get("digest"))) for layer in listed]
    if config is None or any(layer is None for layer in layers):
        return None
    return StoredImage(config, [layer for layer in layers if layer is not None])


def _object(value: object) -> dict[str, Any]:
    """A JSON object of the store's documents, or an empty one where something else stands."""
    return value if isinstance(value, dict) else {}


def _damaged(digest: str, what: str) -> UserError:
    return UserError(f"containerd's content store: {digest[:19]}: {what}; the image is not one an engine wrote")


def _platform_manifest(index: dict[str, Any], architecture: str, os_name: str) -> str | None:
    entries = index.get("manifests")
    for entry in entries if isinstance(entries, list) else []:
        platform = _object(_object(entry).get("platform"))
        if platform.get("architecture") == architecture and platform.get("os") == os_name:
            return str(_object(entry).get("digest"))
    return None


def _blob(blobs: Path, digest: str) -> Blob | None:
    """The blob's file: a regular file named by the digest, never through a link."""
    path = blobs / digest.removeprefix("sha256:") if DIGEST.fullmatch(digest) else None
    if path is None or not path.exists():
        return None
    if path.is_symlink() or not path.is_file():
        raise _damaged(digest, "its blob is not a regular file (a link, say)")
    return Blob(digest, path)


def _bytes(blobs: Path, digest: str) -> bytes | None:
    blob = _blob(blobs, digest)
    if blob is None or blob.path.stat().st_size > DOCUMENT_LIMIT:
        return None
    data = blob.path.read_bytes()
    if sha256_digest(data) != digest:
        raise UserError(f"containerd's content store holds {digest[:19]} with other bytes; its store is damaged")
    return data


def _document(blobs: Path, digest: str) -> dict[str, Any] | None:
    data = _bytes(blobs, digest)
    try:
        document = json.loads(data) if data is not None else None
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


class _Verified(io.RawIOBase):
    """A blob's file, hashed as it is read; at its end the hash must be the blob's digest."""

    def __init__(self, source: IO[bytes], digest: str) -> None:
        self.source, self.digest, self.hash = source, digest, hashlib.sha256()
        self.check: Callable[[], None] = self._compare

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.source.read(len(buffer))
        if not data:
            self.check()
            return 0
        buffer[: len(data)] = data
        self.hash.update(data)
        return len(data)

    def _compare(self) -> None:
        self.check = lambda: None
        if "sha256:" + self.hash.hexdigest() != self.digest:
            raise UserError(
                f"containerd's content store holds {self.digest[:19]} with other bytes; its store is damaged"
            )

    def close(self) -> None:
        self.source.close()
        super().close()
