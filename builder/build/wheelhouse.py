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

import functools
import hashlib
import html
import http.server
import os
import posixpath
import re
import shutil
import stat
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock
from packaging import tags as wheel_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

from builder import paths
from builder.errors import UserError
from builder.facts import pypi
from builder.lock.requirements import Lockfile
from builder.plan.cell import Cell
from builder.plan.matrix import Matrix
from builder.spec.env import expand_env

MARKER = ".torch-images-wheelhouse"
SERVED_LIST = "served.list"  # the paths builds asked for, shared with servers of other processes
BIG_FILE = 64 << 20  # downloads this large report their progress
Report = Callable[[str], None]


def default_root() -> Path:
    return paths.cache_root() / "wheelhouse"


@dataclass(frozen=True)
class WheelRef:
    """One file a lock names, and where to get it."""

    project: str
    filename: str
    url: str
    sha256: str
    size: int | None = None  # as the index lists it


def target_tags(cell: Cell) -> list[wheel_tags.Tag]:
    """The wheel tags pip inside the cell's image accepts, most preferred first."""
    major, minor = (int(p) for p in cell.python.split(".")[:2])
    glibc_minor = int(cell.base.glibc.split(".")[1])
    platforms = [f"manylinux_2_{n}_x86_64" for n in range(glibc_minor, 4, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
    return [
        *wheel_tags.cpython_tags((major, minor), platforms=platforms),
        *wheel_tags.compatible_tags((major, minor), platforms=platforms),
    ]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class Wheelhouse:
    def __init__(self, root: Path | None = None, report: Report | None = None) -> None:
        self.root = root or default_root()
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / MARKER).write_text(str(self.root.resolve()))
        self.bytes_downloaded = 0
        self.report: Report = report or (lambda _: None)
        self._served: set[str] = {MARKER}
        self.corrupt: list[str] = []  # cached files found corrupt (and removed) in this run

    @staticmethod
    def blob_path(sha256: str, filename: str) -> str:
        """Where a file lives under the root (and the server's URL path): named by its hash."""
        return f"sha256/{sha256[:2]}/{sha256}/{filename}"

    def blob(self, sha256: str, filename: str) -> Path:
        return self.root / self.blob_path(sha256, filename)

    # ------------------------------------------------------------ finding files

    @functools.cache  # noqa: B019 - one listing per project and index for the wheelhouse's life
    def _listing(self, project: str, index_urls: tuple[str, ...], find_links: tuple[str, ...]) -> list[pypi.WheelFile]:
        files: list[pypi.WheelFile] = []
        for directory in find_links:
            files += pypi.find_links_files(project, Path(directory))
        for url in index_urls:
            try:
                files += pypi.index_files(project, url)
            except urllib.error.HTTPError as error:
                if error.code != 404:  # an index without this project is normal with extra_urls
                    raise
        return files

    def refs(self, cell: Cell, grid: Matrix, lock: Lockfile) -> list[WheelRef]:
        """The one wheel per locked package that the cell's image will install."""
        index = grid.index(cell.index)
        links = tuple(expand_env(p) for p in index.find_links)
        priority = {tag: rank for rank, tag in enumerate(target_tags(cell))}
        refs = []
        for package in lock.packages.values():
            best: tuple[int, WheelRef] | None = None
            for wheel in self._listing(package.name, tuple(index.urls), links):
                name, version, _, file_tags = parse_wheel_filename(wheel.filename)
                if canonicalize_name(name) != package.name or str(version) != package.version:
                    continue
                rank = min((priority[t] for t in file_tags if t in priority), default=None)
                if rank is None:
                    continue
                digest = wheel.sha256 or self._local_digest(wheel)
                if digest not in package.hashes:
                    continue
                if best is None or rank < best[0]:
                    best = (rank, WheelRef(package.name, wheel.filename, wheel.url, digest, wheel.size))
            if best is None:
                raise UserError(
                    f"{lock.path}: no wheel of {package.name}=={package.version} with a locked hash fits "
                    f"Python {cell.python} on glibc {cell.base.glibc}; run `python -m builder lock {cell.name}`"
                )
            refs.append(best[1])
        return sorted(refs, key=lambda r: r.filename)

    @functools.cache  # noqa: B019
    def _local_digest(self, wheel: pypi.WheelFile) -> str:
        return sha256_of(Path(urllib.request.url2pathname(wheel.url.removeprefix("file://"))))

    # ------------------------------------------------------------ fetching

    def fetch(self, ref: WheelRef) -> Path:
        """The verified file in the cache, downloading it first if it is missing or corrupt."""
        target = self.blob(ref.sha256, ref.filename)
        if self.intact(target, ref.sha256):
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(target) + ".lock"):
            if self.intact(target, ref.sha256):  # another build fetched it while we waited
                return target
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

    def _download(self, ref: WheelRef, sink: tempfile._TemporaryFileWrapper[bytes]) -> str:
        digest = hashlib.sha256()
        url = ref.url
        local = url.startswith("file://")
        if local:
            source = open(urllib.request.url2pathname(url.removeprefix("file://")), "rb")  # noqa: SIM115
        else:
            source = urllib.request.urlopen(url, timeout=120)
        with source:
            headers = getattr(source, "headers", None)
            total = int(headers.get("Content-Length") or 0) if headers is not None else 0
            if total:
                self.report(f"downloading {ref.filename} ({total / 1e6:.0f} MB)")
            received, next_step = 0, 0.25
            while chunk := source.read(1 << 20):
                digest.update(chunk)
                sink.write(chunk)
                received += len(chunk)
                if not local:
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
        if not path.is_file():
            return False
        stamp = self._stamp_path(path)
        if stamp.exists() and stamp.read_text() == self._signature(path):
            return True
        if sha256_of(path) == sha256:
            self._stamp(path)
            return True
        self.report(f"cached {path.name} does not match its sha256; removed, fetching it again")
        self.corrupt.append(path.name)
        path.unlink()
        stamp.unlink(missing_ok=True)
        return False

    # ------------------------------------------------------------ serving

    def publish_page(self, lock: Lockfile, refs: list[WheelRef]) -> str:
        """Write the find-links page for one lock, and the lock beside it; returns the page's path."""
        page = self.root / lock_page(lock.path) / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        self._publish_lock(lock)
        self.allow([lock_page(lock.path) + "index.html", *(self.blob_path(r.sha256, r.filename) for r in refs)])
        links = "\n".join(
            f'<a href="../../{html.escape(self.blob_path(r.sha256, r.filename))}#sha256={r.sha256}">'
            f"{html.escape(r.filename)}</a><br>"
            for r in refs
        )
        with tempfile.NamedTemporaryFile("w", dir=page.parent, delete=False) as handle:
            handle.write(f"<!DOCTYPE html><html><body>\n{links}\n</body></html>\n")
        os.replace(handle.name, page)
        return lock_page(lock.path)

    def publish_files(self, paths: Iterable[Path]) -> None:
        """Serve build inputs that are not wheels (helper scripts) under their content's name."""
        for path in paths:
            self._place(path, self.root / served_path(path))
            self.allow([served_path(path)])

    def _publish_lock(self, lock: Lockfile) -> None:
        """The lock itself beside its page: RUN steps fetch it from there."""
        self._place(lock.path, self.root / lock_page(lock.path) / lock.path.name)
        self.allow([lock_page(lock.path) + lock.path.name])

    def allow(self, paths: Iterable[str]) -> None:
        """Let the server answer for these paths (relative to the root): the files a build asked for."""
        new = [p for p in paths if p not in self._served]
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
            self._served.update(listing.read_text().splitlines())
        return path in self._served

    @staticmethod
    def _place(source: Path, target: Path) -> None:
        content = source.read_bytes()
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
            cached = self.cached_files(lock)
            if cached is not None and all(self.intact(self.root / path, digest) for path, digest in cached):
                self._publish_lock(lock)
                self.allow([lock_page(lock.path) + "index.html", *(path for path, _ in cached)])
                files += [self.root / path for path, _ in cached]
                continue
            try:
                refs = self.refs(cell, grid, lock)
            except OSError as error:
                raise self._offline_error(lock, error) from None
            missing = sum(1 for r in refs if not self.blob(r.sha256, r.filename).is_file())
            if missing:
                self.report(f"{lock.path.name}: {missing} of {len(refs)} files to download")
            files += [self.fetch(ref) for ref in refs]
            self.publish_page(lock, refs)
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

    def cached_files(self, lock: Lockfile) -> list[tuple[str, str]] | None:
        """The files (paths under the root) a lock's existing page names, with their hashes; None
        when there is no page, or it does not name one file per locked package."""
        page = self.root / lock_page(lock.path) / "index.html"
        if not page.exists():
            return None
        found = re.findall(r'href="\.\./\.\./(sha256/[0-9a-f]{2}/([0-9a-f]{64})/[^"#/]+)#', page.read_text())
        if len(found) != len(lock.packages):
            return None
        return found


def content_key(path: Path) -> str:
    """A URL path segment naming a file by its content, so a changed file gets a new URL."""
    return sha256_of(path)[:16]


def lock_page(path: Path) -> str:
    """Where a lock's find-links page (and the lock itself) lives under the server root."""
    return f"locks/{content_key(path)}/"


def served_path(path: Path) -> str:
    """Where a helper script lives under the server root."""
    return f"files/{content_key(path)}/{path.name}"


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves exactly the files builds asked for: no directory listings, no symbolic links."""

    house: Wheelhouse

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        relative = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")
        if relative.endswith("/") or not relative:  # pip reads a find-links page by its folder's URL
            relative += "index.html"
        relative = posixpath.normpath(relative)  # "locks/k/../../sha256/..." as a client may send it
        path = self.house.root / relative
        if not self.house.serves(relative) or os.path.realpath(path) != os.path.abspath(path):
            self.send_error(404)
            return
        try:
            handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            self.send_error(404)
            return
        with os.fdopen(handle, "rb") as source:
            info = os.fstat(source.fileno())
            if not stat.S_ISREG(info.st_mode):
                self.send_error(404)
                return
            self.send_response(200)
            kind = "text/html" if relative.endswith(".html") else "application/octet-stream"
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(info.st_size))
            self.end_headers()
            if body:
                shutil.copyfileobj(source, self.wfile, 1 << 20)


def _serving_same_root(host: str, port: int, root: Path) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/{MARKER}", timeout=2) as response:
            return bool(response.read().decode() == str(root.resolve()))
    except OSError:
        return False


@contextmanager
def serve(house: Wheelhouse, listen: str) -> Iterator[str]:
    """Serve the wheelhouse on a loopback address for the duration of a build.

    The address is fixed by matrix.yaml because it is part of the rendered RUN line (and so of
    the layer cache key). A second build reuses a server already serving the same cache.
    """
    host, port = listen.rsplit(":", 1)
    handler = type("WheelhouseHandler", (_Handler,), {"house": house})
    try:
        server = http.server.ThreadingHTTPServer((host, int(port)), handler)
    except OSError as error:
        if _serving_same_root(host, int(port), house.root):
            yield f"http://{listen}/"
            return
        raise UserError(
            f"cannot serve the wheelhouse on {listen}: {error.strerror}; free the port or change wheelhouse.listen"
        ) from None
    # A short poll interval: shutdown() waits up to one interval, on every build.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://{listen}/"
    finally:
        server.shutdown()
        server.server_close()
