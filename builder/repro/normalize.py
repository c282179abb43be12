"""Bit-for-bit reproducible images: normalize a built image, and prove it by building twice.

The engine's classic builder stamps the build time on every file it writes and on the
config. Most of that is undone inside the build: every rendered RUN step ends with
settle-layer.sh (mtimes clamped to SOURCE_DATE_EPOCH, logs, caches and /tmp emptied), and
the engine then writes such a layer the same way every time (directory order, numeric
times, root owners). After the build, one streaming pass over `docker save` checks each
layer entry by entry. Settled layers are kept byte for byte; an unsettled one (a COPY step
stamps the build time on the directories it writes into) is rewritten: entries sorted by
name, mtimes clamped, numeric owners, hard links kept valid, volatile files dropped. The
config gets fixed times and loses the fields that name the build host, and the result is
loaded back under the same tag, sending the engine only the layers it does not have.
Bytecode is already deterministic: under SOURCE_DATE_EPOCH py_compile writes hash-based .pyc.

Everything streams through files on disk: a layer of several GB is never held in memory.
`verify-repro` records a file manifest (path, type, mode, size, sha256) per layer to name
the paths that differ between two builds.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import os
import re
import tarfile
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import docker

from builder import paths

Report = Callable[[str], None]
# Paths whose content changes from build to build and that no image needs.
# (The -old copies dpkg and debconf keep are not among them: they hold the previous state of
# a deterministic file, and removing one a base ships would leave a whiteout in the layer.)
VOLATILE = re.compile(
    r"^(var/lib/apt/lists/[^/]*_[^/]*|var/cache/apt/[^/]+\.bin|var/cache/apt/archives/[^/]+\.deb"
    r"|var/cache/ldconfig/aux-cache|var/log/.+\.log|var/log/apt/.+|root/\.cache/pip(/.*)?|tmp/.+)$"
)
# Config fields that describe the machine and moment of the build, not the image.
VOLATILE_CONFIG = ("container", "container_config", "docker_version", "author", "os.version")
KEPT_PAX = ("SCHILY.xattr.", "path", "linkpath")
# Layers up to this size are kept aside while scanning, so that rewriting the small layers a
# build leaves unsettled (its COPY steps, last in the rendered images) needs no second pass.
SMALL_LAYER = 64 << 20


def cache_dir() -> Path:
    return paths.cache_dir("layers")


def timestamp(epoch: int) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Entry:
    info: tarfile.TarInfo
    offset: int = -1  # of its data in the spool file, for regular files


def _clean_info(info: tarfile.TarInfo, epoch: int) -> tarfile.TarInfo:
    clean = tarfile.TarInfo(info.name)
    clean.type, clean.mode, clean.size = info.type, info.mode, info.size if info.isreg() else 0
    clean.uid, clean.gid, clean.uname, clean.gname = info.uid, info.gid, "", ""
    clean.mtime = min(int(info.mtime), epoch)
    clean.linkname, clean.devmajor, clean.devminor = info.linkname, info.devmajor, info.devminor
    clean.pax_headers = {k: v for k, v in info.pax_headers.items() if k.startswith(KEPT_PAX[0])}
    return clean


def _spool_layer(stream: IO[bytes], spool: IO[bytes], epoch: int) -> list[Entry]:
    """Read a layer tar once, in order, keeping metadata in memory and file data in the spool."""
    entries = []
    with tarfile.open(fileobj=stream, mode="r|") as layer:
        for info in layer:
            name = info.name.removeprefix("./").rstrip("/")
            if not name or VOLATILE.match(name):
                continue
            info.name = name
            if info.islnk():
                info.linkname = info.linkname.removeprefix("./")
            entry = Entry(_clean_info(info, epoch))
            if info.isreg():
                entry.offset = spool.tell()
                source = layer.extractfile(info)
                assert source is not None
                while chunk := source.read(1 << 20):
                    spool.write(chunk)
            entries.append(entry)
    return entries


def _order(entries: list[Entry]) -> list[Entry]:
    """Entries sorted by name, each hard-link group headed by the first of its members."""
    by_name = {e.info.name: e for e in entries}
    ordered = sorted(entries, key=lambda e: e.info.name)
    heads: dict[str, str] = {}  # original link target -> the name that now carries the data
    result = []
    for entry in ordered:
        info = entry.info
        if info.islnk():
            target = info.linkname
            if target not in by_name:  # the target was volatile and dropped: keep the data here
                continue
            if target in heads:
                info.linkname = heads[target]
            elif by_name[target].info.name > info.name:  # its target comes later: this one carries the data
                original = by_name[target]
                heads[target] = info.name
                info.type, info.size, info.linkname = tarfile.REGTYPE, original.info.size, ""
                entry.offset = original.offset
            else:
                heads.setdefault(target, target)
                info.linkname = heads[target]
        elif info.isreg() and info.name in heads and heads[info.name] != info.name:
            info.type, info.size, info.linkname = tarfile.LNKTYPE, 0, heads[info.name]
        elif info.isreg():
            heads.setdefault(info.name, info.name)
        result.append(entry)
    return result


class _Reader(io.RawIOBase):
    """A window of the spool file, for tarfile.addfile."""

    def __init__(self, spool: IO[bytes], offset: int, size: int, digest: Any) -> None:
        self.spool, self.position, self.end, self.digest = spool, offset, offset + size, digest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        count = min(len(buffer), self.end - self.position)
        if count <= 0:
            return 0
        self.spool.seek(self.position)
        data = self.spool.read(count)
        buffer[: len(data)] = data
        self.digest.update(data)
        self.position += len(data)
        return len(data)


class _HashingWriter(io.RawIOBase):
    def __init__(self, sink: IO[bytes]) -> None:
        self.sink, self.digest = sink, hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.digest.update(data)
        return self.sink.write(data)


def _manifest_row(info: tarfile.TarInfo, sha256: str = "") -> list[Any]:
    """One entry of a layer's file manifest: (path, type, mode, size, sha256 or link target)."""
    name = info.name.removeprefix("./").rstrip("/")
    if info.isreg():
        return [name, "file", oct(info.mode), info.size, sha256]
    kinds = {tarfile.DIRTYPE: "dir", tarfile.SYMTYPE: "symlink", tarfile.LNKTYPE: "hardlink"}
    return [name, kinds.get(info.type, "other"), oct(info.mode), 0, info.linkname]


def normalize_layer(stream: IO[bytes], epoch: int, workdir: Path) -> tuple[str, Path, list[list[Any]]]:
    """Rewrite one layer; returns its diff_id, the normalized tar and its file manifest."""
    with tempfile.TemporaryFile(dir=workdir) as spool:
        entries = _order(_spool_layer(stream, spool, epoch))
        handle, name = tempfile.mkstemp(dir=workdir, suffix=".tar")
        manifest: list[list[Any]] = []
        with os.fdopen(handle, "wb") as raw:
            writer = _HashingWriter(raw)
            with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as out:
                for entry in entries:
                    info = entry.info
                    if info.isreg():
                        content = hashlib.sha256()
                        out.addfile(info, _Reader(spool, entry.offset, info.size, content))
                        manifest.append(_manifest_row(info, content.hexdigest()))
                    else:
                        out.addfile(info)
                        manifest.append(_manifest_row(info))
    return "sha256:" + writer.digest.hexdigest(), Path(name), manifest


def normalize_config(config: dict[str, Any], diff_ids: list[str], epoch: int) -> bytes:
    created = timestamp(epoch)
    config = {k: v for k, v in config.items() if k not in VOLATILE_CONFIG}
    config["created"] = created
    config["history"] = [{**h, "created": created} for h in config.get("history", [])]
    inner = dict(config.get("config") or {})
    inner["Hostname"], inner["Domainname"] = "", ""
    inner.pop("Image", None)  # the ID of the unnormalized parent: differs per build
    config["config"] = inner
    config["rootfs"] = {"type": "layers", "diff_ids": diff_ids}
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def _saved_members(engine: docker.DockerClient, image_id: str) -> Iterator[tuple[tarfile.TarInfo, IO[bytes] | None]]:
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


def _mapping_file() -> Path:
    return cache_dir() / "normalized.json"


def _known_normalized(engine: docker.DockerClient, raw_id: str) -> str | None:
    path = _mapping_file()
    mapping = json.loads(path.read_text()) if path.exists() else {}
    known = mapping.get(raw_id)
    if known:
        try:
            engine.images.get(known)
            return str(known)
        except docker.errors.ImageNotFound:
            return None
    return None


def _remember(raw_id: str, normalized_id: str) -> None:
    path = _mapping_file()
    mapping = json.loads(path.read_text()) if path.exists() else {}
    mapping[raw_id] = normalized_id
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(mapping, indent=1))
    os.replace(temporary, path)


def unsettled(info: tarfile.TarInfo, epoch: int) -> str | None:
    """Why a layer entry would make the layer differ between builds, or None.

    A layer made only of settled entries is kept byte for byte: the engine writes it in
    directory order with numeric times, so the same tree gives the same bytes.
    """
    name = info.name.removeprefix("./").rstrip("/")
    if info.mtime > epoch:
        return f"{name} was modified after SOURCE_DATE_EPOCH"
    if not info.isdir() and VOLATILE.match(name):
        return f"{name} is a log, cache or temporary file"
    if (info.uid and info.uname) or (info.gid and info.gname):
        return f"{name} has an owner named by the build host ({info.uname}:{info.gname})"
    return None


@dataclass
class LayerScan:
    member: str  # its name in the `docker save` archive
    problem: str | None  # the first unsettled entry, None when the layer is settled
    copy: Path | None = None  # the layer as saved, when it was kept aside


class _Tee(io.RawIOBase):
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


def _read_to_end(source: IO[bytes]) -> None:
    """Reads what tarfile leaves unread (end-of-archive padding), so a tee sees every byte."""
    while source.read(1 << 20):
        pass


def _scan_layer(handle: IO[bytes], epoch: int, copy: IO[bytes] | None) -> str | None:
    source: IO[bytes] = io.BufferedReader(_Tee(handle, copy.write), buffer_size=1 << 20) if copy else handle
    problem = None
    with tarfile.open(fileobj=source, mode="r|") as layer:
        for info in layer:
            problem = problem or unsettled(info, epoch)
    _read_to_end(source)
    return problem


@dataclass
class SavedImage:
    config: dict[str, Any]
    layers: list[LayerScan]  # in the image's order


def _scan_image(
    engine: docker.DockerClient, image_id: str, epoch: int, workdir: Path, keep_aside: Callable[[str, int], bool]
) -> SavedImage:
    """One pass over `docker save`: which layers are settled, keeping aside those asked for."""
    scans: dict[str, LayerScan] = {}
    aliases: dict[str, str] = {}  # a repeated layer saved as a link to the first copy
    config: dict[str, Any] = {}
    manifest: list[dict[str, Any]] = []
    for member, handle in _saved_members(engine, image_id):
        if member.issym() and member.name.endswith("/layer.tar"):
            aliases[member.name] = os.path.normpath(os.path.join(os.path.dirname(member.name), member.linkname))
        elif handle is None:
            continue
        elif member.name.endswith("/layer.tar"):
            if keep_aside(member.name, member.size):
                copy = workdir / f"raw-{len(scans)}.tar"
                with copy.open("wb") as sink:
                    scans[member.name] = LayerScan(member.name, _scan_layer(handle, epoch, sink), copy)
            else:
                scans[member.name] = LayerScan(member.name, _scan_layer(handle, epoch, None))
        elif member.name == "manifest.json":
            manifest = json.loads(handle.read())
        elif member.name.endswith(".json") and "/" not in member.name:
            config = json.loads(handle.read())
    return SavedImage(config, [scans[aliases.get(name, name)] for name in manifest[0]["Layers"]])


def normalize_image(
    engine: docker.DockerClient, reference: str, epoch: int, keep: int = 0, report: Report = print
) -> str:
    """Normalize the image tagged `reference` and move the tag to the result; returns its ID.

    The first `keep` layers (the base image's) are inputs and stay as they are. Of the others,
    a settled layer (see `unsettled`) is kept byte for byte; the first unsettled one and every
    layer above it go back to the engine, the unsettled ones rewritten. The rendered images
    end every RUN with settle-layer.sh and put their COPY layers last, so only those few small
    layers are rewritten and `docker load` skips every layer the engine already has.
    """
    raw = engine.images.get(reference)
    known = _known_normalized(engine, raw.id)
    if known:
        engine.images.get(known).tag(*reference.rsplit(":", 1))
        return known
    report(f"normalizing {reference}")
    diff_ids: list[str] = raw.attrs["RootFS"]["Layers"]
    with tempfile.TemporaryDirectory(dir=cache_dir()) as scratch:
        workdir = Path(scratch)
        saved = _scan_image(engine, raw.id, epoch, workdir, lambda _, size: size <= SMALL_LAYER)
        start = next((i for i, scan in enumerate(saved.layers) if i >= keep and scan.problem), len(diff_ids))
        needed = {scan.member for scan in saved.layers[start:]}
        if any(scan.copy is None for scan in saved.layers[start:]):
            report(f"layer {start + 1} is not settled ({saved.layers[start].problem}): rewriting the layers above it")
            saved = _scan_image(engine, raw.id, epoch, workdir, lambda member, _: member in needed)
        layers: list[tuple[str, Path | None]] = []  # (diff_id, file to load, or None: the engine has it)
        for index, scan in enumerate(saved.layers):
            if index < start:
                layers.append((diff_ids[index], None))
            elif scan.problem is None:
                assert scan.copy is not None
                layers.append((diff_ids[index], scan.copy))
            else:
                assert scan.copy is not None
                with scan.copy.open("rb") as source:
                    diff_id, path, files = normalize_layer(source, epoch, workdir)
                _save_manifest(diff_id, files)
                layers.append((diff_id, path))
        config_bytes = normalize_config(saved.config, [d for d, _ in layers], epoch)
        loaded = _load_streaming(engine, config_bytes, layers, reference, epoch)
    normalized_id: str = loaded[0].id
    _remember(raw.id, normalized_id)
    return normalized_id


def _load_streaming(
    engine: docker.DockerClient, config: bytes, layers: list[tuple[str, Path | None]], reference: str, epoch: int
) -> list[Any]:
    """`docker load` of the normalized image, the archive written into a pipe as the engine reads it."""
    read_end, write_end = os.pipe()
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            with os.fdopen(write_end, "wb") as sink:
                _write_archive(sink, config, layers, reference, epoch)
        except BaseException as error:  # reported after the engine finished reading
            failure.append(error)

    writer = threading.Thread(target=produce, daemon=True)
    writer.start()

    def chunks(source: IO[bytes]) -> Iterator[bytes]:
        # Fixed-size chunks: iterating a binary file would split it at arbitrary b"\n" bytes.
        while chunk := source.read(1 << 20):
            yield chunk

    with os.fdopen(read_end, "rb") as source:
        loaded: list[Any] = engine.images.load(chunks(source))
    writer.join()
    if failure:
        raise failure[0]
    return loaded


def _write_archive(
    archive: IO[bytes], config: bytes, layers: list[tuple[str, Path | None]], reference: str, epoch: int
) -> None:
    """A `docker save` archive. A layer without a file is one the engine already has: its
    loader looks a layer up by chain ID before it opens the file, so the file may be absent."""
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    names = [f"{d.removeprefix('sha256:')}/layer.tar" for d, _ in layers]
    manifest = json.dumps([{"Config": config_name, "RepoTags": [reference], "Layers": names}]).encode()
    with tarfile.open(fileobj=archive, mode="w|") as out:
        for name, payload in ((config_name, config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(payload), epoch
            out.addfile(info, io.BytesIO(payload))
        written = set()
        for name, (_, path) in zip(names, layers, strict=True):
            if path is None or name in written:  # an empty layer may repeat
                continue
            written.add(name)
            info = out.gettarinfo(str(path), arcname=name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "", ""
            with path.open("rb") as handle:
                out.addfile(info, handle)


def _save_manifest(diff_id: str, files: list[list[Any]]) -> None:
    (cache_dir() / f"{diff_id.removeprefix('sha256:')}.manifest.json").write_text(json.dumps(files))


def file_manifest(stream: IO[bytes]) -> list[list[Any]]:
    """(path, type, mode, size, sha256 or link target) of every entry of a layer, in order."""
    rows: list[list[Any]] = []
    with tarfile.open(fileobj=stream, mode="r|") as layer:
        for info in layer:
            digest = hashlib.sha256()
            if info.isreg():
                source = layer.extractfile(info)
                assert source is not None
                while chunk := source.read(1 << 20):
                    digest.update(chunk)
            rows.append(_manifest_row(info, digest.hexdigest()))
    return rows


def record_manifests(engine: docker.DockerClient, image_id: str) -> None:
    """Write the file manifest of every layer of an image that has none yet (for verify-repro)."""
    wanted = [d for d in engine.images.get(image_id).attrs["RootFS"]["Layers"] if layer_manifest(d) is None]
    if not wanted:
        return
    for member, handle in _saved_members(engine, image_id):
        if handle is None or not member.name.endswith("/layer.tar"):
            continue
        digest = hashlib.sha256()
        source = io.BufferedReader(_Tee(handle, digest.update), buffer_size=1 << 20)
        rows = file_manifest(source)
        _read_to_end(source)
        diff_id = "sha256:" + digest.hexdigest()
        if diff_id in wanted:
            _save_manifest(diff_id, rows)


def layer_manifest(diff_id: str) -> list[list[Any]] | None:
    path = cache_dir() / f"{diff_id.removeprefix('sha256:')}.manifest.json"
    return json.loads(path.read_text()) if path.exists() else None


def differing_paths(first: str, second: str, limit: int = 20) -> list[str]:
    """Paths whose entries differ between two normalized layers (by their manifests)."""
    a, b = layer_manifest(first), layer_manifest(second)
    if a is None or b is None:
        return ["(no manifest recorded for one of the layers)"]
    left = {row[0]: row[1:] for row in a}
    right = {row[0]: row[1:] for row in b}
    names = sorted(n for n in set(left) | set(right) if left.get(n) != right.get(n))
    return names[:limit] + ([f"... and {len(names) - limit} more"] if len(names) > limit else [])


@dataclass
class Verdict:
    cell: str
    first_id: str
    second_id: str
    layers: list[tuple[str, str]]  # (first build's diff_id, second's), layer by layer
    differences: dict[int, list[str]]  # layer index -> differing paths

    @property
    def reproducible(self) -> bool:
        return self.first_id == self.second_id


def compare(engine: docker.DockerClient, cell: str, first_id: str, second_id: str) -> Verdict:
    first = engine.images.get(first_id).attrs["RootFS"]["Layers"]
    second = engine.images.get(second_id).attrs["RootFS"]["Layers"]
    pairs = [(a, b) for a, b in zip(first, second, strict=False)]
    if any(a != b for a, b in pairs):  # name the differing paths: manifests of both images
        record_manifests(engine, first_id)
        record_manifests(engine, second_id)
    differences = {i: differing_paths(a, b) for i, (a, b) in enumerate(pairs) if a != b}
    if len(first) != len(second):
        differences[len(pairs)] = [f"layer count differs: {len(first)} against {len(second)}"]
    return Verdict(cell, first_id, second_id, pairs, differences)
