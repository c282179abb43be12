"""Tools the builder runs where the machine lacks them (data/tools.yaml): Debian packages,
pinned by archive path and sha256, fetched into the cache by that sha256 and unpacked there
(`dpkg-deb -x`), never installed. A tool on PATH is used first.

Why Debian's packages: they are built from source by Debian, listed with their sha256 in a
signed index, and reachable from every hosted runner; the `soci` CLI that `publish.soci` needs
has no Ubuntu 24.04 package at all."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from builder.config import platform as platforms
from builder.config import tools as tool_specs
from builder.engine import debfile
from builder.errors import UserError
from builder.wheelhouse import wheelhouse
from builder.wheelhouse.fileref import FileRef

TOOLS_FILE = tool_specs.TOOLS_FILE


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    binaries: tuple[str, ...]
    debs: dict[str, FileRef]  # by dpkg's architecture

    def deb_for(self, architecture: str) -> FileRef:
        if architecture not in self.debs:
            raise UserError(f"data/tools.yaml pins no {architecture} .deb of {self.name}; add one there")
        return self.debs[architecture]


@cache
def load(path: Path = tool_specs.TOOLS_FILE) -> dict[str, Package]:
    spec = tool_specs.spec(path)
    mirror = spec.mirror.rstrip("/")
    return {
        name: Package(
            name,
            tool.version,
            tuple(tool.binaries),
            {
                arch: FileRef(name, deb.path.rsplit("/", 1)[-1], f"{mirror}/{deb.path}", deb.sha256)
                for arch, deb in tool.debs.items()
            },
        )
        for name, tool in spec.tools.items()
    }


def unpacked(package: Package, ref: FileRef, deb: Path) -> Path:
    """The package's files, unpacked once from its checked .deb into the cache; their root."""
    return debfile.unpacked(deb, debfile.tool_root(package.name, package.version, ref.sha256), package.version)


def binary(name: str, package_name: str, house: wheelhouse.Wheelhouse | None = None) -> str:
    """`name` from PATH, else from its pinned package (`pinned`)."""
    return shutil.which(name) or pinned(name, package_name, house)


def pinned(name: str, package_name: str, house: wheelhouse.Wheelhouse | None = None) -> str:
    """`name` from its package as data/tools.yaml pins it (`from_package`)."""
    return from_package(load()[package_name], name, house)


def from_package(package: Package, name: str, house: wheelhouse.Wheelhouse | None = None) -> str:
    """`name` from `package`'s .deb for this machine: fetched into the wheelhouse's cache by its
    sha256 (or found there) and unpacked."""
    if name not in package.binaries:
        raise UserError(
            f"data/tools.yaml: {package.name} lists no binary {name!r} (it lists {', '.join(package.binaries)})"
        )
    ref = package.deb_for(platforms.host().debian)
    deb = (house or wheelhouse.Wheelhouse()).fetch(ref)
    path = unpacked(package, ref, deb) / "usr" / "bin" / name
    if not path.is_file():
        raise UserError(
            f"{package.name} {package.version} has no usr/bin/{name}; data/tools.yaml names the wrong package"
        )
    return str(path)
