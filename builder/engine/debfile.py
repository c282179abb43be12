"""A file pinned by its sha256, kept in the cache: fetched once and checked; a Debian package
unpacked once (`dpkg-deb -x`), never installed. The keyring of an Ubuntu base, Debian's Packages
indexes and the qemu that runs another architecture's programs come this way; the tools publish
runs, through the wheelhouse (builder/wheelhouse/tools.py), unpack the same way."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from builder import digests, downloads, paths
from builder.errors import UserError


def partial_beside(cached: Path) -> Path:
    """A file of its own next to `cached`, to write and then rename onto it: two builders that
    fill the same cache entry at once (two test processes, two cells) never write one file."""
    cached.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=cached.parent, delete=False, prefix=".part-") as part:
        return Path(part.name)


@contextlib.contextmanager
def written_beside(target: Path) -> Iterator[Path]:
    """A file of its own beside `target` (partial_beside) for the block to write, renamed onto
    `target` when the block ends and removed however it fails (a full disk, a signal, a refusal):
    the cache keeps no `.part-` file."""
    partial = partial_beside(target)
    try:
        yield partial
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)


# The most one pinned file may take: the largest pinned today is qemu-user's .deb, 71 MB. A
# server that sends more is stopped there, not allowed to fill the disk.
MAX_PINNED_BYTES = 256 << 20


def fetch(url: str, sha256: str, cached: Path, expected_by: str, unreachable: str = "") -> Path:
    """`cached`, downloaded from `url` unless it is there with the sha256 that `expected_by`
    gives ("the matrix pins", "its signed Release says"); a download with another sha256, or past
    MAX_PINNED_BYTES, is refused and not kept. `unreachable` ends the line when the download
    fails. Nothing is left beside `cached` however it ends, an interruption (Ctrl-C) included."""
    if cached.is_file() and not cached.is_symlink() and digests.sha256_file(cached) == sha256:
        return cached
    with written_beside(cached) as partial:
        try:
            downloads.download(url, partial, timeout=60, most=MAX_PINNED_BYTES)
        except OSError as error:
            raise UserError(f"could not fetch {url} ({getattr(error, 'reason', error)}){unreachable}") from None
        actual = digests.sha256_file(partial)
        if actual != sha256:
            raise UserError(f"{url} has sha256 {actual}; {expected_by} {sha256}")
    return cached


def unpacked(deb: Path, root: Path, stamp: str) -> Path:
    """The package's files under `root`, unpacked once and checked on every use: the stamp file
    holds `stamp` (what is there) and the digest of the tree as it was unpacked, so a changed,
    added or linked file in the cache (a restored CI cache, say) is unpacked again, never run."""
    done = root / ".unpacked"
    if done.is_file() and not done.is_symlink() and _still_unpacked(root, done, stamp):
        return root
    if shutil.which("dpkg-deb") is None:
        raise UserError(f"unpacking {deb.name} needs dpkg-deb (Debian's and Ubuntu's dpkg package)")
    if root.is_symlink():
        root.unlink()
    shutil.rmtree(root, ignore_errors=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], capture_output=True, check=False)
    if result.returncode != 0:
        raise UserError(f"dpkg-deb could not unpack {deb.name}: {result.stderr.decode(errors='replace')[-200:]}")
    signature = stat_signature(root)  # taken before the hash: a change made during it shows next time
    done.write_text(f"{stamp}\n{tree_digest(root)}\n{signature}\n")
    return root


def _still_unpacked(root: Path, done: Path, stamp: str) -> bool:
    """Whether the tree is still what the stamp says was unpacked. Its bytes are hashed again only
    where an entry's inode, size, mode or change time differ from the last check's (qemu's 455 MB:
    0.76 s a call with the page cache warm, 4 ms by its signature): a write, a chmod, a rename or a
    new file each change a change time, which no user can set back. After a check of the bytes,
    the stamp takes the tree's new signature."""
    lines = done.read_text().split("\n")
    if len(lines) < 3 or lines[0] != stamp:
        return False
    signature = stat_signature(root)  # before the hash, as when unpacked
    if signature and signature == lines[2]:
        return True
    if tree_digest(root) != lines[1]:
        return False
    done.write_text(f"{stamp}\n{lines[1]}\n{signature}\n")
    return True


RACY_NS = 2_000_000_000  # a change time this recent may share its clock tick with a change still to come


def stat_signature(root: Path) -> str:
    """The sha256 of each entry's path, inode, size, mode and change and modification times, in
    path order (the stamp file left out): what any change to the tree changes. "" (no signature,
    the bytes hashed on every use) while an entry changed within the last two seconds: a file
    system's clock ticks coarsely, so a change in the same tick would keep its time (git's
    "racily clean" entries)."""
    digest = hashlib.sha256()
    settled = time.time_ns() - RACY_NS
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if relative == ".unpacked":
            continue
        info = path.lstat()
        if max(info.st_ctime_ns, info.st_mtime_ns) > settled:
            return ""
        digest.update(
            f"{relative}\0{info.st_ino}\0{info.st_size}\0{info.st_mode}\0{info.st_mtime_ns}\0{info.st_ctime_ns}\n".encode()
        )
    return digest.hexdigest()


def tree_digest(root: Path) -> str:
    """The sha256 of a folder's tree: each entry's path, kind, mode, and its bytes or link
    target, in path order (the stamp file left out)."""
    digest = hashlib.sha256()
    if root.is_symlink() or not root.is_dir():
        return ""
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if relative == ".unpacked":
            continue
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            described = f"l {os.readlink(path)}"
        elif stat.S_ISREG(info.st_mode):
            described = f"f {digests.sha256_file(path)}"
        elif stat.S_ISDIR(info.st_mode):
            described = "d"
        else:
            described = f"? {info.st_mode}"
        digest.update(f"{relative}\0{stat.S_IMODE(info.st_mode):o}\0{described}\n".encode())
    return digest.hexdigest()


def tool_root(name: str, version: str, sha256: str) -> Path:
    """Where a pinned tool's package is unpacked in the cache. No colon (an epoch's) in it:
    binfmt_misc's register line, which names a path under it, splits on colons."""
    return paths.cache_dir("tools") / f"{name}-{version.replace(':', '_')}-{sha256[:12]}"
