"""An image's layers read from the overlay2 driver's folders, where Docker keeps their files.

Docker's own image store (20.10, and 29 with overlay2) keeps each layer as a folder of files
(`.../overlay2/<id>/diff`), and `docker save` first writes every layer out as a tar into a
folder of its own before sending the first byte (about 6 s of a 7 s save for the CPU cell here).
The engine names the folders in its answer to `inspect` (GraphDriver: UpperDir, LowerDir), so the
pass after the build reads them there when it may (root): each layer's entries are made from its
folder exactly as the overlay2 driver's differ makes its tar (a walk in byte order of names;
whiteout devices as `.wh.` files of mode 0600, an opaque directory followed by its
`.wh..wh..opq` marker, hard links by inode within the layer, `security.capability` as the one
extended attribute), and rewritten by the same code as a saved layer. Elsewhere, the caller uses
`docker save`.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import docker

from builder.engine import canonical
from builder.engine.canonical import Entry

OPAQUE_XATTR = "trusted.overlay.opaque"
CAPABILITY_XATTR = "security.capability"


@dataclass(frozen=True)
class LayerFolder:
    path: Path

    def gathered(self, epoch: int) -> list[tuple[Entry, canonical.Opener | None]]:
        """The entries the overlay2 differ's tar of this folder holds, in canonical form, each
        regular file with a way to read it when its turn comes."""
        found: list[tuple[Entry, canonical.Opener | None]] = []
        _walk(self.path, "", epoch, {}, found)
        return found


def locate(engine: docker.DockerClient, reference: str) -> list[LayerFolder] | None:
    """The image's layer folders, bottom first, or None where they cannot be read."""
    attrs = engine.api.inspect_image(reference)
    driver = attrs.get("GraphDriver") or {}
    data = driver.get("Data") or {}
    if driver.get("Name") != "overlay2" or not isinstance(data.get("UpperDir"), str):
        return None
    lower = [p for p in str(data.get("LowerDir") or "").split(":") if p]
    folders = [Path(p) for p in [*reversed(lower), data["UpperDir"]]]
    layers = (attrs.get("RootFS") or {}).get("Layers") or []
    if len(folders) != len(layers) or not all(_readable(f) for f in folders):
        return None
    return [LayerFolder(f) for f in folders]


def _readable(folder: Path) -> bool:
    try:
        next(folder.iterdir(), None)
        return os.access(folder, os.R_OK | os.X_OK)
    except OSError:
        return False


def _walk(
    root: Path,
    relative: str,
    epoch: int,
    inodes: dict[tuple[int, int], str],
    found: list[tuple[Entry, canonical.Opener | None]],
) -> None:
    folder = root / relative if relative else root
    for name in sorted(os.listdir(folder), key=lambda n: n.encode("utf-8", "surrogateescape")):
        path = folder / name
        member = f"{relative}/{name}" if relative else name
        info = os.lstat(path)
        mode = info.st_mode
        if stat.S_ISSOCK(mode):
            continue  # the differ leaves sockets out
        entry = Entry(member, canonical.REGULAR, stat.S_IMODE(mode), info.st_uid, info.st_gid,
                      min(int(info.st_mtime), epoch))  # fmt: skip
        capability = _xattr(path, CAPABILITY_XATTR)
        if capability is not None:
            entry.xattrs[CAPABILITY_XATTR] = capability
        if stat.S_ISCHR(mode) and info.st_rdev == 0:  # a whiteout: the differ writes a `.wh.` file
            parent, _, base = member.rpartition("/")
            entry.name = f"{parent}/{canonical.WHITEOUT}{base}" if parent else f"{canonical.WHITEOUT}{base}"
            entry.mode, entry.xattrs = 0o600, {}
            found.append((entry, None))
        elif stat.S_ISDIR(mode):
            entry.kind = canonical.DIRECTORY
            found.append((entry, None))
            if _xattr(path, OPAQUE_XATTR) == b"y":  # the differ's marker: the directory's mode, no time
                marker = f"{member}/{canonical.OPAQUE}"
                found.append((Entry(marker, canonical.REGULAR, entry.mode & 0o777, entry.uid, entry.gid, 0), None))
            _walk(root, member, epoch, inodes, found)
        elif stat.S_ISLNK(mode):
            entry.kind, entry.linkname = canonical.SYMLINK, os.readlink(path)
            found.append((entry, None))
        elif stat.S_ISREG(mode):
            key = (info.st_dev, info.st_ino)
            if info.st_nlink > 1 and key in inodes:
                entry.kind, entry.linkname = canonical.HARDLINK, inodes[key]
                found.append((entry, None))
                continue
            if info.st_nlink > 1:
                inodes[key] = member
            entry.size = info.st_size
            found.append((entry, _opener(path, info.st_size)))
        elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            entry.kind = canonical.CHARDEV if stat.S_ISCHR(mode) else canonical.BLOCKDEV
            entry.devmajor, entry.devminor = os.major(info.st_rdev), os.minor(info.st_rdev)
            found.append((entry, None))
        elif stat.S_ISFIFO(mode):
            entry.kind = canonical.FIFO
            found.append((entry, None))


def _opener(path: Path, size: int) -> canonical.Opener:
    # O_NOFOLLOW: the walk saw a regular file; a link put there since is refused, not followed.
    return canonical.file_opener(lambda: os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb"), size)


def _xattr(path: Path, name: str) -> bytes | None:
    try:
        return os.getxattr(path, name, follow_symlinks=False)
    except OSError:
        return None
