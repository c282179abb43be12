"""Which file of each locked package a cell's image installs: the wheel pip inside the image
would pick (its tags, most preferred first), among those whose sha256 the lock holds."""

from __future__ import annotations

import functools
import urllib.error
import urllib.request
from pathlib import Path

from packaging import tags as wheel_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

from builder.config import platform
from builder.config.env import expand_env
from builder.errors import UserError
from builder.facts import pypi
from builder.lock.requirements import Lockfile
from builder.plan.cell import Cell
from builder.plan.matrix import Matrix
from builder.wheelhouse.fileref import FileRef


def target_tags(cell: Cell) -> list[wheel_tags.Tag]:
    """The wheel tags pip inside the cell's image accepts, most preferred first."""
    major, minor = (int(p) for p in cell.python.split(".")[:2])
    glibc_minor = int(cell.base.glibc.split(".")[1])
    arch = platform.of(cell.platform).wheel
    platforms = [f"manylinux_2_{n}_{arch}" for n in range(glibc_minor, 4, -1)]
    platforms += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}", f"linux_{arch}"]
    return [
        *wheel_tags.cpython_tags((major, minor), platforms=platforms),
        *wheel_tags.compatible_tags((major, minor), platforms=platforms),
    ]


@functools.cache  # one listing per project and index for the process's life
def listing(project: str, index_urls: tuple[str, ...], find_links: tuple[str, ...]) -> list[pypi.WheelFile]:
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


def choose(cell: Cell, grid: Matrix, lock: Lockfile) -> list[FileRef]:
    """The one wheel per locked package that the cell's image will install."""
    index = grid.index(cell.index)
    links = tuple(expand_env(p) for p in index.find_links)
    priority = {tag: rank for rank, tag in enumerate(target_tags(cell))}
    refs = []
    for package in lock.packages.values():
        best: tuple[int, FileRef] | None = None
        for wheel in listing(package.name, tuple(index.urls), links):
            name, version, _, file_tags = parse_wheel_filename(wheel.filename)
            if canonicalize_name(name) != package.name or str(version) != package.version:
                continue
            rank = min((priority[t] for t in file_tags if t in priority), default=None)
            if rank is None:
                continue
            digest = wheel.digest
            if digest not in package.hashes:
                continue
            if best is None or rank < best[0]:
                best = (rank, FileRef(package.name, wheel.filename, wheel.url, digest, wheel.size))
        if best is None:
            raise UserError(
                f"{lock.path}: no wheel of {package.name}=={package.version} with a locked hash fits "
                f"Python {cell.python} on glibc {cell.base.glibc}; run `python -m builder lock {cell.name}`"
            )
        refs.append(best[1])
    return sorted(refs, key=lambda r: r.filename)
