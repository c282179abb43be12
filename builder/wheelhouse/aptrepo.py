"""Local apt repositories on the wheelhouse server: the locked .debs, from the cache.

Each set of packages (a base's, a cell's common set, a flavor's) becomes a flat repository at
`apt/<key>/` (served.apt_repository). Its Packages index is written here from the .deb files
themselves (their control fields, then Filename, Size and SHA256 of the verified file), so it is
a function of the files alone: the same files give the same bytes on any machine, online or
offline. apt inside a build (and mmdebstrap bootstrapping a base) downloads each .deb from the
content-addressed cache and checks it against that SHA256; the builder checked each file against
debian.lock before serving it. The repository is unsigned (`[trusted=yes]`): its only source is
this server, and what it lists was checked against the lock, which came from the archive's
signed index (lock/aptindex.py).
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Iterable
from pathlib import Path

from debian import debfile

from builder.lock.aptindex import ArchiveFile
from builder.plan.cell import BaseImage
from builder.wheelhouse import served
from builder.wheelhouse.fileref import FileRef
from builder.wheelhouse.wheelhouse import Wheelhouse


def _stanza(house: Wheelhouse, deb: Path, sha256: str) -> str:
    control = debfile.DebFile(str(deb)).debcontrol()
    control["Filename"] = served.blob_path(sha256, deb.name)
    control["Size"] = str(deb.stat().st_size)
    control["SHA256"] = sha256
    return str(control.dump())


def packages_index(house: Wheelhouse, debs: list[tuple[Path, str]]) -> str:
    """The Packages index of cached .debs, in path order (the same files give the same bytes)."""
    return "\n".join(_stanza(house, deb, sha256) for deb, sha256 in sorted(debs, key=lambda d: d[0].name))


def release_file(base: BaseImage, packages: bytes) -> str:
    """The repository's Release: the suite's name, which mmdebstrap matches to find the base's
    essential packages, and the Packages index's sha256, which apt checks."""
    digest = hashlib.sha256(packages).hexdigest()
    return (
        f"Suite: {base.suite}\nCodename: {base.suite}\nArchitectures: {base.arch} all\nComponents: main\n"
        f"SHA256:\n {digest} {len(packages)} Packages\n"
    )


def fetch(house: Wheelhouse, base: BaseImage, files: Iterable[ArchiveFile]) -> list[tuple[Path, str]]:
    """Each .deb in the cache, checked against its locked sha256 (downloaded from the base's
    mirror, or its security archive, only when missing)."""
    refs = [
        FileRef(
            posixpath.basename(f.path), posixpath.basename(f.path), f"{base.mirror_of(f.source)}/{f.path}", f.sha256
        )
        for f in files
    ]
    return [(house.fetch(ref), ref.sha256) for ref in refs]


def publish(house: Wheelhouse, base: BaseImage, files: list[ArchiveFile]) -> str:
    """Serve the locked .debs as a repository; returns its path under the server root."""
    where = served.apt_repository(files)
    debs = fetch(house, base, files)
    packages = packages_index(house, debs).encode()
    house.place(packages, house.root / where / "Packages")
    house.place(release_file(base, packages).encode(), house.root / where / "Release")
    house.allow([where + "Packages", where + "Release", *(served.blob_path(sha, deb.name) for deb, sha in debs)])
    return where


def sources_line(url: str, repository: str) -> str:
    """The sources.list line of a repository the wheelhouse server offers at `url`."""
    return f"deb [trusted=yes] {url} {repository}"
