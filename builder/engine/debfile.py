"""A file pinned by its sha256, kept in the cache: fetched once and checked; a Debian package
unpacked once (`dpkg-deb -x`), never installed. The keyring of an Ubuntu base, Debian's Packages
indexes and the qemu that runs another architecture's programs come this way; the tools publish
runs, through the wheelhouse (builder/wheelhouse/tools.py), unpack the same way."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from builder import digests, downloads, paths
from builder.errors import UserError


def partial_beside(cached: Path) -> Path:
    """A file of its own next to `cached`, to write and then rename onto it: two builders that
    fill the same cache entry at once (two test processes, two cells) never write one file."""
    cached.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=cached.parent, delete=False, prefix=".part-") as part:
        return Path(part.name)


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
    partial = partial_beside(cached)
    try:
        try:
            downloads.download(url, partial, timeout=60, most=MAX_PINNED_BYTES)
        except OSError as error:
            raise UserError(f"could not fetch {url} ({getattr(error, 'reason', error)}){unreachable}") from None
        actual = digests.sha256_file(partial)
        if actual != sha256:
            raise UserError(f"{url} has sha256 {actual}; {expected_by} {sha256}")
        partial.replace(cached)
    finally:
        partial.unlink(missing_ok=True)
    return cached


def unpacked(deb: Path, root: Path, stamp: str) -> Path:
    """The package's files under `root`, unpacked once and checked on every use: the stamp file
    holds `stamp` (what is there) and the digest of the tree as it was unpacked, so a changed,
    added or linked file in the cache (a restored CI cache, say) is unpacked again, never run."""
    done = root / ".unpacked"
    if done.is_file() and not done.is_symlink() and done.read_text() == f"{stamp}\n{tree_digest(root)}\n":
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
    done.write_text(f"{stamp}\n{tree_digest(root)}\n")
    return root


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
