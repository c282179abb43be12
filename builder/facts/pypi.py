"""Read package indexes and wheel metadata without downloading whole wheels.

The compatibility data is derived from what the wheels say about themselves: their file
names (Python tag, manylinux floor) and their METADATA (Requires-Python, Requires-Dist).
A torch wheel is 0.2-0.9 GB, so METADATA is read with HTTP range requests from the zip's
central directory; local wheel directories (find-links) are read from disk.
"""

from __future__ import annotations

import email.parser
import functools
import io
import json
import re
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import Message
from pathlib import Path

from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from builder import digests, downloads

SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
MANYLINUX = re.compile(r"manylinux_(\d+)_(\d+)_")
CPYTHON_TAG = re.compile(r"cp(\d)(\d+)")
LEGACY_MANYLINUX = {"manylinux1": "2.5", "manylinux2010": "2.12", "manylinux2014": "2.17"}


@dataclass(frozen=True)
class WheelFile:
    """One wheel as an index or a find-links directory lists it."""

    filename: str
    url: str
    sha256: str | None
    requires_python: str | None
    size: int | None = None  # bytes, where the index says (PEP 700)

    @functools.cached_property
    def _parsed(self) -> tuple[str, frozenset[Tag]]:
        """The version and tags, by packaging's parser (the one wheelchoice uses too)."""
        try:
            _, version, _, tags = parse_wheel_filename(self.filename)
        except InvalidWheelFilename:
            raise ValueError(f"not a wheel file name: {self.filename}") from None
        return str(version), tags

    @property
    def version(self) -> str:
        return self._parsed[0]

    @property
    def digest(self) -> str:
        """The wheel's sha256: the index's, or for a find-links directory's file, its bytes' (read
        once a run)."""
        return self.sha256 or _local_file_digest(self.url)

    @property
    def cpython(self) -> str | None:
        """The CPython version a version-specific wheel is for ("3.11" for cp311-cp311), None for
        abi3, free-threaded (cp313t) or pure wheels: what images use is the one kind."""
        found = {(t.interpreter, t.abi) for t in self._parsed[1]}
        if len(found) != 1:
            return None
        interpreter, abi = found.pop()
        match = CPYTHON_TAG.fullmatch(interpreter)
        return f"{match.group(1)}.{match.group(2)}" if match and abi == interpreter else None

    @property
    def glibc_floor(self) -> str | None:
        """The lowest glibc this wheel runs on, from its platform tags (None if not manylinux)."""
        floors = []
        for platform in {t.platform for t in self._parsed[1]}:
            match = MANYLINUX.match(platform + "_")
            if match:
                floors.append(f"{match.group(1)}.{match.group(2)}")
            for legacy, floor in LEGACY_MANYLINUX.items():
                if platform.startswith(legacy + "_"):
                    floors.append(floor)
        if not floors:
            return None
        return min(floors, key=lambda v: tuple(int(p) for p in v.split(".")))

    @property
    def linux_arch(self) -> str | None:
        """The architecture of a Linux wheel (x86_64, aarch64), None for other systems."""
        platforms = sorted({t.platform for t in self._parsed[1]})
        if not platforms or not all("linux" in p for p in platforms):
            return None
        return next((arch for arch in ("x86_64", "aarch64") if platforms[0].endswith("_" + arch)), None)


def _open(url: str, headers: dict[str, str] | None = None, timeout: float = 60) -> bytes:
    return downloads.get(url, headers, timeout)


def index_files(project: str, index_url: str, suffix: str = ".whl") -> list[WheelFile]:
    """Every file of a project on a PEP 691 (JSON) simple index whose name ends with suffix."""
    body = _open(f"{index_url.rstrip('/')}/{project}/", {"Accept": SIMPLE_JSON})
    listing = json.loads(body)
    return [
        WheelFile(
            filename=entry["filename"],
            url=entry["url"],
            sha256=entry.get("hashes", {}).get("sha256"),
            requires_python=entry.get("requires-python"),
            size=entry.get("size"),
        )
        for entry in listing["files"]
        if entry["filename"].endswith(suffix) and not entry.get("yanked")
    ]


def sdist_metadata(url: str, limit: int = 1 << 20) -> Message | None:
    """PKG-INFO of a small source distribution (a stub's pins live there), or None when it has
    none (old stubs are a bare setup.py)."""
    data = _open(url)
    if len(data) > limit:
        raise OSError(f"{url}: {len(data)} bytes is not a small stub")
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        member = next(
            (m for m in archive.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")), None
        )
        handle = archive.extractfile(member) if member else None
        return email.parser.Parser().parsestr(handle.read().decode()) if handle else None


@functools.cache
def _local_file_digest(url: str) -> str:
    local = downloads.local_path(url)
    assert local is not None, url  # only a find-links directory's wheels come without a hash
    return digests.sha256_file(local)


def find_links_files(project: str, directory: Path) -> list[WheelFile]:
    """Every wheel of a project in a local find-links directory."""
    prefix = project.replace("-", "_").lower() + "-"
    return [
        WheelFile(filename=path.name, url=path.as_uri(), sha256=None, requires_python=None)
        for path in sorted(directory.glob("*.whl"))
        if path.name.lower().startswith(prefix)
    ]


class _RangeReader(io.RawIOBase):
    """A seekable file over HTTP range requests, enough for zipfile to read one member."""

    def __init__(self, url: str, size: int) -> None:
        self.url, self.size, self.position = url, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = base + offset
        return self.position

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        if self.position >= self.size or len(buffer) == 0:
            return 0
        end = min(self.position + len(buffer), self.size) - 1
        chunk = _open(self.url, {"Range": f"bytes={self.position}-{end}"})
        buffer[: len(chunk)] = chunk
        self.position += len(chunk)
        return len(chunk)


def _remote_size(url: str) -> int:
    with downloads.stream(url, {"Range": "bytes=0-0"}, timeout=60) as response:
        content_range = response.headers.get("Content-Range", "")
        match = re.search(r"/(\d+)$", content_range)
        if not match:
            raise OSError(f"{url}: the server does not answer range requests")
        return int(match.group(1))


def _metadata_member(archive: zipfile.ZipFile) -> str:
    for name in archive.namelist():
        if name.count("/") == 1 and name.endswith(".dist-info/METADATA"):
            return name
    raise OSError("wheel has no .dist-info/METADATA")


def wheel_metadata(wheel: WheelFile) -> Message:
    """The wheel's METADATA, reading only the zip directory and that one member."""
    local = downloads.local_path(wheel.url)
    if local is not None:
        source: io.IOBase = local.open("rb")
    else:
        # A buffered reader turns zipfile's many small reads into a few range requests.
        source = io.BufferedReader(_RangeReader(wheel.url, _remote_size(wheel.url)), buffer_size=1 << 20)
    with source, zipfile.ZipFile(source) as archive:
        text = archive.read(_metadata_member(archive)).decode()
    return email.parser.Parser().parsestr(text)


def requirements(metadata: Message) -> Iterator[str]:
    """Requires-Dist entries that apply without extras."""
    for requirement in metadata.get_all("Requires-Dist") or []:
        if "extra ==" not in requirement:
            yield requirement
