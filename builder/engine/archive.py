"""`docker save` and `docker load` archives, streamed: a layer of several GB is never held in
memory. One writer serves both the bootstrapped bases and normalized images."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

import docker

from builder import times
from builder.config import platform as platforms
from builder.digests import canonical_json
from builder.engine import canonical
from builder.errors import UserError

# (diff_id, the layer's tar, or None: a layer the engine already has)
Layers = list[tuple[str, Path | None]]


def _variant(architecture: str) -> str | None:
    platform = platforms.of_debian(architecture)
    return platform.variant if platform else None


def image_config(
    diff_ids: list[str], epoch: int, labels: dict[str, str], history: list[str], architecture: str = "amd64"
) -> bytes:
    """A new image's config with fixed times (the bootstrapped bases), for `architecture` (Debian's
    and OCI's names agree for amd64 and arm64; OCI adds arm64's variant)."""
    created = times.iso_utc(epoch)
    return canonical_json(
        {
            "architecture": architecture,
            **({"variant": variant} if (variant := _variant(architecture)) else {}),
            "os": "linux",
            "created": created,
            "config": {
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                "Cmd": ["bash"],
                "Labels": labels,
            },
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
            "history": [{"created": created, "created_by": line} for line in history],
        }
    )


def write_load_archive_as_made(
    archive: IO[bytes],
    layers: Iterator[tuple[str, Path | None]],
    config_of: Callable[[list[str]], bytes],
    reference: str,
    epoch: int,
) -> None:
    """A `docker load` archive whose layers are written as `layers` yields them (each as soon as
    it is made), and whose config and manifest come last: the config names every diff ID, known
    only once the last layer is made. Every loader reads the whole archive before its manifest
    (Docker's own into a folder, containerd's importer blob by blob)."""
    with tarfile.open(fileobj=archive, mode="w|", format=tarfile.PAX_FORMAT) as out:
        diff_ids: list[str] = []
        written = set()
        for diff_id, path in layers:
            diff_ids.append(diff_id)
            name = f"{diff_id.removeprefix('sha256:')}/layer.tar"
            if path is None or name in written:  # an empty layer may repeat
                continue
            written.add(name)
            info = out.gettarinfo(str(path), arcname=name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "", ""
            with path.open("rb") as handle:
                out.addfile(info, handle)
        config = config_of(diff_ids)
        config_name = hashlib.sha256(config).hexdigest() + ".json"
        names = [f"{d.removeprefix('sha256:')}/layer.tar" for d in diff_ids]
        manifest = json.dumps([{"Config": config_name, "RepoTags": [reference], "Layers": names}]).encode()
        for name, payload in ((config_name, config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(payload), epoch
            out.addfile(info, io.BytesIO(payload))


def load(engine: docker.DockerClient, config: bytes, layers: Layers, reference: str, epoch: int) -> list[Any]:
    """`docker load` of an image, the archive written into a pipe as the engine reads it. A layer
    without a file is one the engine already has: its loader looks a layer up by chain ID before it
    opens the file, so the file may be absent."""
    return load_as_made(engine, iter(layers), lambda _: config, reference, epoch)


def load_as_made(
    engine: docker.DockerClient,
    layers: Iterator[tuple[str, Path | None]],
    config_of: Callable[[list[str]], bytes],
    reference: str,
    epoch: int,
) -> list[Any]:
    """`docker load` of an image whose layers are still being made: each goes to the engine as
    `layers` yields it (write_load_archive_as_made), through a pipe the engine reads as it is
    written, so making the next layer overlaps the engine's reading of this one."""
    read_end, write_end = os.pipe()
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            with os.fdopen(write_end, "wb") as sink:
                write_load_archive_as_made(sink, layers, config_of, reference, epoch)
        except BaseException as error:  # reported after the engine finished reading
            failure.append(error)

    writer = threading.Thread(target=produce, daemon=True)
    writer.start()

    def chunks(source: IO[bytes]) -> Iterator[bytes]:
        # Fixed-size chunks: iterating a binary file would split it at arbitrary b"\n" bytes.
        while chunk := source.read(1 << 20):
            yield chunk

    try:
        with os.fdopen(read_end, "rb") as source:
            loaded: list[Any] = engine.images.load(chunks(source))
    except Exception:
        writer.join()
        if failure:  # the archive was cut short by what went wrong making it: that is the cause
            raise failure[0] from None
        raise
    writer.join()
    if failure:
        raise failure[0]
    return loaded


Scanned = TypeVar("Scanned")
# A blob of `docker save` this small that holds a JSON object is a config or a manifest, not a layer.
DOCUMENT_LIMIT = 4 << 20


def _layer_path(name: str) -> bool:
    """A layer's name in `docker save`: `<id>/layer.tar` (Docker's own format, up to 24) or
    `blobs/sha256/<hex>` (an OCI layout: Docker 25 and later, either image store)."""
    return name.endswith("/layer.tar") or name.startswith("blobs/")


def _document(handle: IO[bytes], size: int) -> bytes | None:
    """The blob's bytes when it is a small JSON document (a config or a manifest), else None with
    the handle left at its start."""
    if size > DOCUMENT_LIMIT or handle.peek(1)[:1] not in (b"{", b"["):  # type: ignore[attr-defined]
        return None
    data = handle.read()
    try:
        json.loads(data)
        return data
    except ValueError:
        raise UserError(f"a {size}-byte blob of docker save starts like JSON and is neither JSON nor a layer") from None


def _scan(
    engine: docker.DockerClient, image_id: str, read_layer: Callable[[str, int, IO[bytes]], Scanned]
) -> tuple[bytes, list[Scanned]]:
    scanned: dict[str, Scanned] = {}
    aliases: dict[str, str] = {}
    documents: dict[str, bytes] = {}
    for member, handle in saved_members(engine, image_id):
        if member.issym() and _layer_path(member.name):
            aliases[member.name] = os.path.normpath(os.path.join(os.path.dirname(member.name), member.linkname))
        elif handle is None:
            continue
        elif member.name.endswith(".json"):
            documents[member.name] = handle.read(DOCUMENT_LIMIT + 1)
        elif _layer_path(member.name):
            buffered = io.BufferedReader(handle, 1 << 20)  # type: ignore[type-var]
            document = _document(buffered, member.size)
            if document is not None:
                documents[member.name] = document
            else:
                layer = canonical.uncompressed(buffered)
                scanned[member.name] = read_layer(member.name, member.size, layer)
                read_to_end(layer)
    try:
        manifest = json.loads(documents.get("manifest.json", b""))
        config_name, names = manifest[0]["Config"], [aliases.get(n, n) for n in manifest[0]["Layers"]]
    except (ValueError, LookupError, TypeError):
        raise UserError(
            f"docker save of {image_id[7:19]} holds no manifest.json naming its config and layers"
        ) from None
    if config_name not in documents or any(name not in scanned for name in names):
        raise UserError(f"docker save of {image_id[7:19]} lacks the config or a layer its manifest.json names")
    return documents[config_name], [scanned[name] for name in names]


def scan_saved_config_bytes(
    engine: docker.DockerClient, image_id: str, read_layer: Callable[[str, int, IO[bytes]], Scanned]
) -> tuple[bytes, list[Scanned]]:
    """scan_saved, with the config as the exact bytes `docker save` gave (its sha256 is the image ID)."""
    return _scan(engine, image_id, read_layer)


def scan_saved(
    engine: docker.DockerClient, image_id: str, read_layer: Callable[[str, int, IO[bytes]], Scanned]
) -> tuple[dict[str, Any], list[Scanned]]:
    """One pass over `docker save`: `read_layer(name in the archive, size, stream)` for every
    layer it holds, the stream uncompressed (the containerd image store saves its gzip blobs);
    returns the image config and the results in the image's layer order (a layer the image
    repeats is saved once, as a link, and its result is given again). Reads Docker's own archive
    format and the OCI layout Docker 25 and later write, whose blobs come in digest order."""
    config, results = _scan(engine, image_id, read_layer)
    return json.loads(config), results


def saved_config(engine: docker.DockerClient, image_id: str) -> bytes:
    """The image's config bytes, as `docker save` gives them (every layer is read past)."""

    def skip(_: str, __: int, handle: IO[bytes]) -> None:
        read_to_end(handle)

    return _scan(engine, image_id, skip)[0]


def saved_members(engine: docker.DockerClient, image_id: str) -> Iterator[tuple[tarfile.TarInfo, IO[bytes] | None]]:
    """Members of `docker save`, streamed."""
    response = engine.api.get_image(image_id, chunk_size=1 << 20)
    stream = io.BufferedReader(_IterStream(response), buffer_size=1 << 20)
    with tarfile.open(fileobj=stream, mode="r|") as saved:
        for member in saved:
            yield member, saved.extractfile(member) if member.isreg() else None


class _IterStream(io.RawIOBase):
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.pending = iter(chunks), b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self.pending:
            try:
                self.pending = next(self.chunks)
            except StopIteration:
                return 0
        count = min(len(buffer), len(self.pending))
        buffer[:count], self.pending = self.pending[:count], self.pending[count:]
        return count


class Tee(io.RawIOBase):
    """Hands every byte read on to `seen` too: to keep a copy, or to hash, in the same pass."""

    def __init__(self, source: IO[bytes], seen: Callable[[bytes], object]) -> None:
        self.source, self.seen = source, seen

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.source.read(len(buffer))
        buffer[: len(data)] = data
        self.seen(data)
        return len(data)


def read_to_end(source: IO[bytes]) -> None:
    """Reads what tarfile leaves unread (end-of-archive padding), so a tee sees every byte."""
    while source.read(1 << 20):
        pass
