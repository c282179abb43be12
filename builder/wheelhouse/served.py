"""The wheelhouse server's URL scheme, in one place: where it offers a build's inputs (wheels and
.debs, locks and their pages, helper scripts, apt repositories), each under a URL named by its
content, so a changed file gets a new URL and the rendered Dockerfile (which names each by its
URL and sha256) changes with it. The cache on disk has the same layout."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from builder import paths
from builder.lock.aptindex import ArchiveFile
from builder.lock.requirements import Lockfile
from builder.plan.cell import Cell

# Helper scripts that RUN steps fetch from the wheelhouse server (see partials/fetch.j2).
# Helper scripts, and the self-test with its datasheet peaks (fetched by the last RUN).
SUPPORT_FILES = (
    *(
        paths.TEMPLATES / "scripts" / name
        for name in (
            "settle-layer.sh",
            "hardlink-duplicates.py",
            "link-cuda-home.sh",
            "prune-paths.py",
            "owners-of.sh",
        )
    ),
    paths.SELFTEST,
    paths.GPU_PEAKS,
)


@dataclass(frozen=True)
class ServedFile:
    """A build input on the wheelhouse server, named by its content."""

    name: str
    path: str  # URL path under the server root
    sha256: str


@dataclass(frozen=True)
class LockRef(ServedFile):
    page: str  # path of the lock's find-links page on the wheelhouse server


def blob_path(sha256: str, filename: str) -> str:
    """Where a wheel or .deb lives under the server root (and in the cache): named by its hash."""
    return f"sha256/{sha256[:2]}/{sha256}/{filename}"


def lock_page(lock: Lockfile, cell: Cell) -> str:
    """Where a lock's find-links page (and the lock itself) lives under the server root, for one
    cell: a folder named by everything that chooses the page's wheels (the lock's content, and the
    Python, glibc and platform whose tags pick one wheel of each package), so a changed lock gets
    a new URL, and two cells whose locks read alike but install other wheels get a page each."""
    chooser = f"lock {lock.sha256}\npython {cell.python}\nglibc {cell.base.glibc}\nplatform {cell.platform}\n"
    return f"locks/{hashlib.sha256(chooser.encode()).hexdigest()[:16]}/"


def served_bytes(name: str, content: bytes) -> ServedFile:
    """A build input the Dockerfile names by its content (a helper script, a cell's spec.json):
    under a folder named by the content's sha256. Helpers are small: hashed from the bytes that
    are served, read once."""
    sha256 = hashlib.sha256(content).hexdigest()
    return ServedFile(name, f"files/{sha256[:16]}/{name}", sha256)


def support_file(path: Path) -> ServedFile:
    """A helper script as the Dockerfile names it: under a folder named by its content."""
    return served_bytes(path.name, path.read_bytes())


def served_text(name: str, text: str) -> ServedFile:
    """A file render writes (a cell's spec.json) as the Dockerfile names it, from its text."""
    return served_bytes(name, text.encode())


def lock_ref(lock: Lockfile, cell: Cell) -> LockRef:
    """A lock as the cell's Dockerfile names it: its URL, its sha256 and its find-links page."""
    page = lock_page(lock, cell)
    return LockRef(lock.path.name, page + lock.path.name, lock.sha256, page)


def support_files() -> dict[str, ServedFile]:
    return {path.name: support_file(path) for path in SUPPORT_FILES}


def apt_repository(files: Iterable[ArchiveFile]) -> str:
    """Where the local apt repository of a set of .debs lives under the server root: a folder
    named by the files' paths and sha256, so another set of packages gets another URL (and a
    RUN line that names it, another layer cache key). See wheelhouse/aptrepo.py."""
    listing = "".join(sorted(f"{f.path} {f.sha256}\n" for f in files))
    return f"apt/{hashlib.sha256(listing.encode()).hexdigest()[:16]}/"
