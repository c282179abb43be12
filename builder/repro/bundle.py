"""Everything one cell's rebuild needs, in one folder: `bundle CELL --output DIR`.

A bundle holds the matrix, the cell's folder (locks, Dockerfile, spec, recorded image ID), the
builder's templates, data and self-test, and the cache files the build reads: each lock's
find-links page, every wheel, and every .deb of the base and the image (debian.lock's `files`).
manifest.json lists each file with its sha256. `build --offline --bundle DIR CELL` checks every
file against the manifest, copies the cache files into the (possibly empty) cache, and builds
with no index, no mirror and no registry: the wheels' pages name each file by its hash, the base
is bootstrapped from its locked .debs, and apt and pip in the build read only the wheelhouse
server on loopback.

The bundle does not carry the builder's code: it records the commit and version that made it,
and an offline build refuses when this builder's templates, data or self-test differ from the
bundle's (check out that commit to rebuild).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from builder import digests, paths
from builder.build import aptrepo, build, wheelhouse
from builder.errors import UserError
from builder.plan.cell import Cell
from builder.plan.matrix import Matrix
from builder.render import served

MANIFEST = "manifest.json"
CACHE = "cache"  # the wheelhouse's layout: locks/<key>/ pages and sha256/<xx>/<hash>/<file>
SHIPPED = {"templates": paths.TEMPLATES, "data": paths.DATA, "image": paths.IMAGE}
Report = Callable[[str], None]


@dataclass(frozen=True)
class Bundle:
    root: Path
    cell: str
    matrix: Path
    files: dict[str, str]  # path under root -> sha256


def _files_under(folder: Path) -> Iterator[Path]:
    return (path for path in sorted(folder.rglob("*")) if path.is_file() and "__pycache__" not in path.parts)


def _version() -> str:
    try:
        return importlib.metadata.version("torch-images")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _commit() -> str:
    """The builder's git commit, where it runs from a checkout ("" elsewhere)."""
    result = subprocess.run(
        ["git", "-C", str(paths.PACKAGE.parent), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return result.stdout.strip() if result.returncode == 0 else ""


def _cache_files(grid: Matrix, cell: Cell, house: wheelhouse.Wheelhouse) -> dict[str, str]:
    """The cache files a build of the cell reads (fetched first where missing), by path under
    the cache root, with their sha256."""
    locks = build.preflight(cell, grid)
    house.prepare(cell, grid, locks.python_locks)
    found: dict[str, str] = {}
    for lock in locks.python_locks:
        page = served.lock_page(lock)
        for name in ("index.html", lock.path.name):
            found[page + name] = digests.sha256_file(house.root / page / name)
        for where, sha256 in house.cached_files(lock) or []:
            found[where] = sha256
    assert locks.debian is not None  # preflight refuses a cell without its debian.lock
    debs = aptrepo.fetch(house, cell.base, locks.debian.files.values())
    found.update({house.blob_path(sha256, deb.name): sha256 for deb, sha256 in debs})
    return found


def gather(grid: Matrix, cell: Cell, output: Path, house: wheelhouse.Wheelhouse, report: Report) -> Bundle:
    """Write the cell's bundle into `output`, a new or empty folder (nothing is overwritten)."""
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise UserError(f"{output} exists and is not an empty folder; give a new folder for the bundle")
    report(f"{cell.name}: gathering the wheels and .debs its build reads")
    cache = _cache_files(grid, cell, house)
    # Written beside the output and renamed when complete: a failed run leaves no half bundle.
    partial = output.with_name(output.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    files: dict[str, str] = {}

    def add(source: Path, name: str, sha256: str | None = None) -> None:
        target = partial / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        files[name] = sha256 or digests.sha256_file(target)

    add(grid.path, "matrix.yaml")
    cell_folder = cell.directory.resolve().relative_to(grid.path.resolve().parent).as_posix()
    for path in _files_under(cell.directory):
        add(path, f"{cell_folder}/{path.relative_to(cell.directory).as_posix()}")
    for name, folder in SHIPPED.items():
        for path in _files_under(folder):
            add(path, f"{name}/{path.relative_to(folder).as_posix()}")
    report(f"{cell.name}: copying {len(cache)} cache files")
    for where, sha256 in sorted(cache.items()):
        add(house.root / where, f"{CACHE}/{where}", sha256)
    manifest = {"cell": cell.name, "builder": {"version": _version(), "commit": _commit()}, "files": files}
    (partial / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    if output.exists():
        output.rmdir()  # empty, as checked above
    partial.rename(output)
    return Bundle(output, cell.name, output / "matrix.yaml", files)


def _manifest(root: Path) -> dict[str, object]:
    path = root / MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(
            f"{root} is not a bundle: it has no {MANIFEST}; make one with `python -m builder bundle`"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError("is not the JSON `bundle` writes; make the bundle again", path) from None
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict) or not isinstance(data.get("cell"), str):
        raise UserError('must hold "cell" and "files"; make the bundle again', path)
    return data


def open_bundle(root: Path, report: Report) -> Bundle:
    """The bundle, after every file was checked against its manifest: a file altered, missing or
    added is refused with one line naming it."""
    data = _manifest(root)
    listed: dict[str, str] = data["files"]  # type: ignore[assignment]
    report(f"{root}: checking {len(listed)} files against {MANIFEST}")
    present = {path.relative_to(root).as_posix() for path in _files_under(root)} - {MANIFEST}
    for name in sorted(present - set(listed)):
        raise UserError(f"{root / name} is not in the bundle's {MANIFEST}; remove it or make the bundle again")
    for name, sha256 in sorted(listed.items()):
        path = root / name
        if ".." in Path(name).parts or Path(name).is_absolute() or not path.is_file():
            raise UserError(f"{root / name}: listed in {MANIFEST} but missing; make the bundle again")
        if digests.sha256_file(path) != sha256:
            raise UserError(f"{path} does not match its sha256 in {MANIFEST}: altered since `bundle` wrote it")
    builder = data.get("builder")
    _same_builder(root, listed, str(builder.get("commit", "")) if isinstance(builder, dict) else "")
    return Bundle(root, str(data["cell"]), root / "matrix.yaml", listed)


def _same_builder(root: Path, listed: dict[str, str], commit: str) -> None:
    """The templates, data and self-test the bundle was made with must be this builder's."""
    for name, folder in SHIPPED.items():
        ours = {f"{name}/{p.relative_to(folder).as_posix()}": p for p in _files_under(folder)}
        theirs = {n for n in listed if n.startswith(name + "/")}
        differing = sorted(theirs ^ set(ours)) or [n for n in sorted(ours) if digests.sha256_file(ours[n]) != listed[n]]
        if differing:
            raise UserError(
                f"{root / differing[0]}: this builder's {differing[0]} differs from the bundle's; rebuild with the "
                f"builder at commit {commit or 'the bundle was made with'}"
            )


def import_cache(bundle: Bundle, house: wheelhouse.Wheelhouse) -> int:
    """Copy the bundle's cache files into the wheelhouse (those not there already); returns how many."""
    copied = 0
    for name in sorted(n for n in bundle.files if n.startswith(CACHE + "/")):
        target = house.root / name.removeprefix(CACHE + "/")
        if target.is_file() and digests.sha256_file(target) == bundle.files[name]:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".part-{target.name}")
        shutil.copyfile(bundle.root / name, partial)
        os.replace(partial, target)
        copied += 1
    return copied
