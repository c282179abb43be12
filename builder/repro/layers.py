"""A layer's file manifest: (path, type, mode, size, sha256 or link target) of every entry, to name
the paths that differ between two builds (verify-repro). Pure functions over tar streams."""

from __future__ import annotations

import hashlib
import tarfile
from typing import IO, Any


def manifest_row(info: tarfile.TarInfo, sha256: str = "") -> list[Any]:
    """One entry of a layer's file manifest: (path, type, mode, size, sha256 or link target, owner)."""
    name = info.name.removeprefix("./").rstrip("/")
    owner = f"{info.uid}:{info.gid}"
    if info.isreg():
        return [name, "file", oct(info.mode), info.size, sha256, owner]
    kinds = {tarfile.DIRTYPE: "dir", tarfile.SYMTYPE: "symlink", tarfile.LNKTYPE: "hardlink"}
    return [name, kinds.get(info.type, "other"), oct(info.mode), 0, info.linkname, owner]


def file_manifest(stream: IO[bytes]) -> list[list[Any]]:
    """(path, type, mode, size, sha256 or link target, owner) of every entry of a layer, in order."""
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
