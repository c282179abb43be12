"""The host-side wheelhouse: a content-addressed, hash-verified cache served on loopback.

Wheels are downloaded once on the host (where the site's certificates and credentials
live), verified against the lock's sha256, and stored under sha256/<hash>/<filename>,
shared by all cells. A build reaches them over http://127.0.0.1 with host networking,
so nothing from the host's trust store ever enters an image, and the wheel files never
enter a layer. Concurrent builds share the cache safely: one lock file per blob, writes
to a temporary name renamed into place only after the hash matched.

Before a build, every cached file is checked against its sha256 again (a file whose size
and change time are those recorded at its last check is not read again: any write changes
its ctime). A corrupt file is removed and downloaded again, or, offline, refused with one
line. The server answers only for the files builds asked for (no listings, no symbolic
links, nothing else under the cache).
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

from filelock import FileLock

from builder import confined, digests, downloads, paths
from builder.errors import UserError
from builder.lock.requirements import Lockfile
from builder.plan.cell import Cell
from builder.plan.matrix import Matrix
from builder.steps import Report
from builder.wheelhouse import served, wheelchoice
from builder.wheelhouse.fileref import FileRef

MARKER = ".torch-images-wheelhouse"
SERVED_LIST = "served.list"  # the paths builds asked for, shared with servers of other processes
BIG_FILE = 64 << 20  # downloads this large report their progress


def _servable(name: str) -> bool:
    """Whether a line of served.list (written by any process) names a path inside the root: a
    hostile line (`../`, absolute, `//`) is never served, whoever wrote it."""
    try:
        confined.name_parts(name)
    except UserError:
        return False
    return True


def default_root() -> Path:
    return paths.cache_root() / "wheelhouse"


class Wheelhouse:
    def __init__(self, root: Path | None = None, report: Report | None = None, offline: bool = False) -> None:
        self.root = root or default_root()
        self.offline = offline  # never download: every file must be in the cache already (`build --offline`)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / MARKER).write_text(str(self.root.resolve()))
        self.bytes_downloaded = 0
        self.report: Report = report or (lambda _: None)
        self._served: set[str] = {MARKER}
        self.corrupt: list[str] = []  # cached files found corrupt (and removed) in this run

    def blob(self, sha256: str, filename: str) -> Path:
        return self.root / served.blob_path(sha256, filename)

    # ------------------------------------------------------------ fetching

    def fetch(self, ref: FileRef) -> Path:
        """The verified file in the cache, downloading it first if it is missing or corrupt."""
        target = self.blob(ref.sha256, ref.filename)
        if self.intact(target, ref.sha256):
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(target) + ".lock"):
            if self.intact(target, ref.sha256):  # another build fetched it while we waited
                return target
            if self.offline:
                raise UserError(
                    f"{ref.filename} (sha256 {ref.sha256[:12]}) is not in the cache and the build is offline; "
                    "build from a bundle that holds it (`bundle`, then `build --offline --bundle DIR`), or build online"
                )
            with tempfile.NamedTemporaryFile(dir=target.parent, delete=False, prefix=".part-") as part:
                temporary = Path(part.name)
                try:
                    digest = self._download(ref, part)
                except BaseException:
                    temporary.unlink(missing_ok=True)
                    raise
            if digest != ref.sha256:
                temporary.unlink(missing_ok=True)
                raise UserError(
                    f"{ref.filename}: sha256 mismatch, expected {ref.sha256}, got {digest}; refusing it, nothing built"
                )
            os.replace(temporary, target)
            self._stamp(target)
        return target

    def _download(self, ref: FileRef, sink: tempfile._TemporaryFileWrapper[bytes]) -> str:
        digest = hashlib.sha256()
        url = ref.url
        local = downloads.local_path(url)
        with contextlib.ExitStack() as stack:
            if local is not None:
                source = stack.enter_context(local.open("rb"))
                chunks: Iterable[bytes] = iter(lambda: source.read(1 << 20), b"")
                total = 0
            else:
                response = stack.enter_context(downloads.stream(url))
                chunks = response.iter_content(1 << 20)
                total = int(response.headers.get("Content-Length") or 0)
            if total:
                self.report(f"downloading {ref.filename} ({total / 1e6:.0f} MB)")
            received, next_step = 0, 0.25
            for chunk in chunks:
                digest.update(chunk)
                sink.write(chunk)
                received += len(chunk)
                if local is None:
                    self.bytes_downloaded += len(chunk)
                if total >= BIG_FILE and received / total >= next_step:  # coarse steps, fit for CI logs
                    self.report(f"downloading {ref.filename}: {received / total:.0%} of {total / 1e6:.0f} MB")
                    next_step += 0.25
        return digest.hexdigest()

    # ------------------------------------------------------------ verifying the cache

    def _stamp_path(self, path: Path) -> Path:
        return self.root / "verified" / path.parent.name

    @staticmethod
    def _signature(path: Path) -> str:
        info = path.stat()
        return f"{path.name} {info.st_size} {info.st_ino} {info.st_mtime_ns} {info.st_ctime_ns}"

    def _stamp(self, path: Path) -> None:
        stamp = self._stamp_path(path)
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(self._signature(path))

    def intact(self, path: Path, sha256: str) -> bool:
        """True when the cached file exists and has its sha256; a corrupt one is removed.

        A file is read again only when its size, inode or change time differ from the last
        check's: writing to a file, even with its mtime put back, changes its ctime.
        """
        if path.is_symlink():  # the cache holds files; a link could be pointed elsewhere after the check
            self.report(f"cached {path.name} is a link; removed, fetching it again")
            path.unlink()
            return False
        if not path.is_file():
            return False
        stamp = self._stamp_path(path)
        if stamp.exists() and stamp.read_text() == self._signature(path):
            return True
        if digests.sha256_file(path) == sha256:
            self._stamp(path)
            return True
        self.report(f"cached {path.name} does not match its sha256; removed, fetching it again")
        self.corrupt.append(path.name)
        path.unlink()
        stamp.unlink(missing_ok=True)
        return False

    # ------------------------------------------------------------ serving

    def publish_page(self, lock: Lockfile, page: str, refs: list[FileRef]) -> str:
        """Write the find-links page `page` (served.lock_page) for one lock, and the lock beside it."""
        index = self.root / page / "index.html"
        index.parent.mkdir(parents=True, exist_ok=True)
        self._publish_lock(lock, page)
        self.allow([page + "index.html", *(served.blob_path(r.sha256, r.filename) for r in refs)])
        links = "\n".join(
            f'<a href="../../{html.escape(served.blob_path(r.sha256, r.filename))}#sha256={r.sha256}">'
            f"{html.escape(r.filename)}</a><br>"
            for r in refs
        )
        with tempfile.NamedTemporaryFile("w", dir=index.parent, delete=False) as handle:
            handle.write(f"<!DOCTYPE html><html><body>\n{links}\n</body></html>\n")
        os.replace(handle.name, index)
        return page

    def publish_files(self, paths: Iterable[Path]) -> None:
        """Serve build inputs that are not wheels (helper scripts) under their content's name."""
        for path in paths:
            content = path.read_bytes()
            where = served.served_bytes(path.name, content).path
            self.place(content, self.root / where)
            self.allow([where])

    def _publish_lock(self, lock: Lockfile, page: str) -> None:
        """The lock itself beside its page: RUN steps fetch it from there."""
        self.place(lock.text.encode(), self.root / page / lock.path.name)  # as read, not again
        self.allow([page + lock.path.name])

    def allow(self, paths: Iterable[str]) -> None:
        """Let the server answer for these paths (relative to the root): the files a build asked for."""
        new = [p for p in paths if p not in self._served]
        for path in new:
            confined.name_parts(path, self.root / SERVED_LIST)  # never a name that leaves the root
        if not new:
            return
        self._served.update(new)
        with FileLock(str(self.root / SERVED_LIST) + ".lock"), (self.root / SERVED_LIST).open("a") as listing:
            listing.writelines(p + "\n" for p in new)

    def serves(self, path: str) -> bool:
        """Whether a request path is one a build asked for (also through another process's wheelhouse)."""
        if path in self._served:
            return True
        listing = self.root / SERVED_LIST
        if listing.exists():
            self._served.update(p for p in listing.read_text(errors="replace").splitlines() if _servable(p))
        return path in self._served

    @staticmethod
    def place(content: bytes, target: Path) -> None:
        if target.exists() and target.read_bytes() == content:
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, delete=False, prefix=".part-") as handle:
            handle.write(content)
        os.chmod(handle.name, 0o644)
        os.replace(handle.name, target)

    def prepare(self, cell: Cell, grid: Matrix, locks: list[Lockfile]) -> list[Path]:
        """Fetch and verify every file of the cell's locks and publish their pages.

        A lock whose page exists and whose files are all in the cache, intact, needs no index
        at all: the page names each file by its verified hash, so a rebuild works offline.
        """
        files = []
        for lock in locks:
            page = served.lock_page(lock, cell)
            cached = self.cached_files(lock, page)
            if cached is not None and all(self.intact(self.root / path, digest) for path, digest in cached):
                self._publish_lock(lock, page)
                self.allow([page + "index.html", *(path for path, _ in cached)])
                files += [self.root / path for path, _ in cached]
                continue
            if self.offline:
                raise UserError(
                    "the wheels this lock names are not all in the cache and the build is offline; build from a "
                    "bundle that holds them (`bundle`, then `build --offline --bundle DIR`), or build online",
                    lock.path,
                )
            try:
                refs = wheelchoice.choose(cell, grid, lock)
            except OSError as error:
                raise self._offline_error(lock, error) from None
            missing = sum(1 for r in refs if not self.blob(r.sha256, r.filename).is_file())
            if missing:
                self.report(f"{lock.path.name}: {missing} of {len(refs)} files to download")
            files += [self.fetch(ref) for ref in refs]
            self.publish_page(lock, page, refs)
        return files

    def _offline_error(self, lock: Lockfile, error: OSError) -> UserError:
        reason = getattr(error, "reason", error)
        if self.corrupt:
            return UserError(
                f"cached {', '.join(self.corrupt)} did not match its sha256 and was removed, and the index cannot be "
                f"reached to fetch it again ({reason}); reconnect and build again, or put the original file back in "
                f"{self.root}",
                lock.path,
            )
        return UserError(
            f"the wheels this lock names are not all in the cache and the index cannot be reached ({reason}); "
            "reconnect and build again",
            lock.path,
        )

    def cached_files(self, lock: Lockfile, page: str) -> list[tuple[str, str]] | None:
        """The files (paths under the root) a lock's existing page (served.lock_page) names, with
        their hashes; None when there is no page, or it does not name one file per locked package."""
        index = self.root / page / "index.html"
        if not index.exists():
            return None
        found = re.findall(r'href="\.\./\.\./(sha256/[0-9a-f]{2}/([0-9a-f]{64})/[^"#/]+)#', index.read_text())
        if len(found) != len(lock.packages):
            return None
        # The page is a cache entry too: each file it names must be one the lock pins, one per package.
        pinned = {digest: name for name, package in lock.packages.items() for digest in package.hashes}
        if {pinned.get(digest) for _, digest in found} != set(lock.packages):
            self.report(f"{page}index.html names files the lock does not pin; choosing them again")
            return None
        return found
