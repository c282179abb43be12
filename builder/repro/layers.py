"""Layer tars rewritten to be the same on every build, and the file manifest of a layer.

Pure functions over tar streams: no engine here. Entries are sorted by name, mtimes clamped to
SOURCE_DATE_EPOCH, owners numeric, hard links kept valid and volatile files dropped; a layer
entry that would differ between builds is `unsettled`.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from builder import times
from builder.engine import archive

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


def manifest_row(info: tarfile.TarInfo, sha256: str = "") -> list[Any]:
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
                        manifest.append(manifest_row(info, content.hexdigest()))
                    else:
                        out.addfile(info)
                        manifest.append(manifest_row(info))
    return "sha256:" + writer.digest.hexdigest(), Path(name), manifest


def normalize_config(config: dict[str, Any], diff_ids: list[str], epoch: int) -> bytes:
    created = times.iso_utc(epoch)
    config = {k: v for k, v in config.items() if k not in VOLATILE_CONFIG}
    config["created"] = created
    config["history"] = [{**h, "created": created} for h in config.get("history", [])]
    inner = dict(config.get("config") or {})
    inner["Hostname"], inner["Domainname"] = "", ""
    inner.pop("Image", None)  # the ID of the unnormalized parent: differs per build
    config["config"] = inner
    config["rootfs"] = {"type": "layers", "diff_ids": diff_ids}
    return archive.canonical_json(config)


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
            rows.append(manifest_row(info, digest.hexdigest()))
    return rows
