"""The build context (the rendered Dockerfile: no step COPYs a file) as a tar with fixed times
and owners, and the build ID that hashes it with the base."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

from builder.plan.cell import Cell


def context_files(cell: Cell) -> dict[str, Path]:
    """The build context, by name in the context: the cell's Dockerfile alone. Every file a
    step needs (locks, helper scripts, the self-test, spec.json) is fetched from the wheelhouse
    server and checked against the sha256 the Dockerfile names, so none is COPY'd."""
    return {f"images/{cell.name}/Dockerfile": cell.file("Dockerfile")}


def context_tar(cell: Cell, epoch: int) -> io.BytesIO:
    """The build context as a tar of exactly context_files."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, path in sorted(context_files(cell).items()):
            # Fixed times and owners: a checkout's file times must not reach a COPY'd layer.
            info = archive.gettarinfo(str(path), arcname=name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "", ""
            info.mode = 0o644
            with path.open("rb") as handle:
                archive.addfile(info, handle)
    buffer.seek(0)
    return buffer


def build_id(cell: Cell, base_image_id: str) -> str:
    """A content hash of every input of the build. The rendered Dockerfile names each lock and
    helper script by its sha256 (and each lock every wheel by its own), so hashing the context
    and the base image's config digest (its content, the same on every engine) covers everything
    the image is made from. The builder (classic or BuildKit) is not an input: both give the
    same canonical image. (Normalization is not an input either: it happens after the build,
    and a normalized image says so by its creation time.)"""
    digest = hashlib.sha256()
    for name, path in sorted(context_files(cell).items()):
        digest.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    digest.update(base_image_id.encode())
    return digest.hexdigest()[:32]
