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
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from builder import confined, digests, paths
from builder.assemble import build
from builder.config import grammar
from builder.errors import UserError
from builder.lock.debian import DEBIAN_LOCK
from builder.lock.inputs import CellLocks
from builder.lock.requirements import FLAVOR_LOCK, STACK_LOCK
from builder.plan.cell import RECORDED_IMAGE_ID_FILE, Cell
from builder.plan.matrix import Matrix
from builder.steps import Report
from builder.wheelhouse import aptrepo, served, wheelhouse

MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 16 << 20  # a cell's manifest is about 50 KB
MAX_FILES = 20_000  # a cell's bundle holds a few hundred files
CELL_NAME = grammar.Grammar(r"[a-z0-9][a-z0-9.+_-]{0,127}", "a cell name such as 2.13.0-cpu-bookworm-runtime")
# The files of a cell's folder a bundle carries, each compared with the repository's.
CELL_FILES = (STACK_LOCK, FLAVOR_LOCK, DEBIAN_LOCK, "Dockerfile", "spec.json", RECORDED_IMAGE_ID_FILE)
CACHE = "cache"  # the wheelhouse's layout: locks/<key>/ pages and sha256/<xx>/<hash>/<file>
SHIPPED = {"templates": paths.TEMPLATES, "data": paths.DATA, "image": paths.IMAGE}


@dataclass(frozen=True)
class Bundle:
    root: Path
    cell: str
    files: dict[str, str]  # path under root -> sha256


def _files_under(folder: Path) -> Iterator[Path]:
    """The regular files below `folder`, in order; a symbolic link anywhere below it is refused
    (a bundle arrives on a disk: a link in it could point anywhere on the machine that opens it)."""
    found = []
    for directory, folders, names in os.walk(folder, followlinks=False):
        folders[:] = sorted(f for f in folders if f != "__pycache__")
        for name in [*names, *folders]:
            if os.path.islink(os.path.join(directory, name)):
                raise UserError("is a symbolic link; a bundle holds files only: make it again", Path(directory, name))
        found += [Path(directory, name) for name in names]
    return iter(sorted(found))


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
        page = served.lock_page(lock, cell)
        for name in ("index.html", lock.path.name):
            found[page + name] = digests.sha256_file(house.root / page / name)
        for where, sha256 in house.cached_files(lock, page) or []:
            found[where] = sha256
    assert locks.debian is not None  # preflight refuses a cell without its debian.lock
    debs = aptrepo.fetch(house, cell.base, locks.debian.files.values())
    found.update({served.blob_path(sha256, deb.name): sha256 for deb, sha256 in debs})
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
    # As the matrix names it, without resolving links: images/ itself may be one.
    cell_folder = Path(os.path.relpath(cell.directory, grid.path.parent)).as_posix()
    for path in _files_under(cell.directory):
        name = path.relative_to(cell.directory).as_posix()
        add(cell.file(name), f"{cell_folder}/{name}")
    for name, folder in SHIPPED.items():
        for path in _files_under(folder):
            add(path, f"{name}/{path.relative_to(folder).as_posix()}")
    report(f"{cell.name}: copying {len(cache)} cache files")
    for where, sha256 in sorted(cache.items()):
        add(confined.inside(house.root, where), f"{CACHE}/{where}", sha256)
    manifest = {"cell": cell.name, "builder": {"version": _version(), "commit": _commit()}, "files": files}
    (partial / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    if output.exists():
        output.rmdir()  # empty, as checked above
    partial.rename(output)
    return Bundle(output, cell.name, files)


def _manifest(root: Path) -> dict[str, object]:
    path = root / MANIFEST
    if not os.path.lexists(path):
        raise UserError(f"{root} is not a bundle: it has no {MANIFEST}; make one with `python -m builder bundle`")
    try:
        data = json.loads(confined.read_bytes(path, MAX_MANIFEST_BYTES))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError("is not the JSON `bundle` writes; make the bundle again", path) from None
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict) or not isinstance(data.get("cell"), str):
        raise UserError('must hold "cell" and "files"; make the bundle again', path)
    if not CELL_NAME.matches(data["cell"]):
        raise UserError(f"cell {data['cell'][:80]!r} is not a cell name; make the bundle again", path)
    if len(data["files"]) > MAX_FILES:
        raise UserError(f"lists more than {MAX_FILES} files; a cell's bundle holds a few hundred", path)
    for name, sha256 in data["files"].items():
        confined.name_parts(name, path)  # absolute, `..`, `.` and `//` are refused
        if not isinstance(sha256, str) or not grammar.SHA256.matches(sha256):
            raise UserError(f"files.{name}: {str(sha256)[:80]!r} is not a sha256 ({grammar.SHA256.hint})", path)
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
        path = confined.inside(root, name)
        if not path.is_file():
            raise UserError(f"{root / name}: listed in {MANIFEST} but missing; make the bundle again")
        if digests.sha256_file(path) != sha256:
            raise UserError(f"{path} does not match its sha256 in {MANIFEST}: altered since `bundle` wrote it")
    builder = data.get("builder")
    _same_builder(root, listed, str(builder.get("commit", "")) if isinstance(builder, dict) else "")
    return Bundle(root, str(data["cell"]), listed)


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


def check_against_repository(bundle: Bundle, cell: Cell, locks: CellLocks) -> None:
    """The bundle must hold what this repository commits for its cell: the same locks, Dockerfile,
    spec and recorded image and build IDs, and in its cache only the files those locks name (each
    under its own sha256) and those locks' pages. Its manifest alone proves nothing: whoever
    changes a file can change its line too."""
    theirs = {
        Path(name).name: sha256
        for name, sha256 in bundle.files.items()
        if Path(name).parent.name == cell.name and name.split("/", 1)[0] not in {CACHE, *SHIPPED}
    }
    ours = {name: digests.sha256_file(cell.file(name)) for name in CELL_FILES if os.path.lexists(cell.file(name))}
    for name in sorted(set(ours) | set(theirs)):
        if ours.get(name) != theirs.get(name):
            state = "is missing from the bundle" if name not in theirs else (
                "is not in this repository" if name not in ours else "differs from this repository's"
            )  # fmt: skip
            raise UserError(
                f"{bundle.root}: the bundle's {cell.name}/{name} {state}; a bundle rebuilds exactly what the "
                "repository commits: make it again from this checkout, or check out the commit it was made from"
            )
    allowed = _cache_names(locks)
    for name, sha256 in sorted(bundle.files.items()):
        if name.startswith(CACHE + "/"):
            _check_cache_file(bundle.root, name, sha256, allowed)


def _check_cache_file(root: Path, name: str, sha256: str, allowed: _CacheNames) -> None:
    """A cache file of the bundle is a wheel or .deb the locks name, under its own sha256, or a
    lock (byte for byte the repository's) or its find-links page."""
    where = name.removeprefix(CACHE + "/")
    blob = BLOB.fullmatch(where)
    if blob is not None:
        if blob.group("hash") == sha256 and blob.group("prefix") == sha256[:2] and sha256 in allowed.hashes:
            return
        raise UserError(f"{root / name}: not a file the cell's locks name, under its own sha256; make the bundle again")
    if where in allowed.pages and allowed.pages[where] == sha256:
        return
    if where.endswith("/index.html") and where.removesuffix("index.html") in allowed.page_folders:
        _check_page(root / name, allowed)
        return
    raise UserError(f"{root / name}: not a file of the cell's locks; make the bundle again")


BLOB = re.compile(r"sha256/(?P<prefix>[0-9a-f]{2})/(?P<hash>[0-9a-f]{64})/[A-Za-z0-9][A-Za-z0-9._+~%-]*")
PAGE_HREF = re.compile(r'href="\.\./\.\./sha256/[0-9a-f]{2}/([0-9a-f]{64})/')


@dataclass(frozen=True)
class _CacheNames:
    hashes: frozenset[str]  # every wheel and .deb the cell's locks name
    pages: dict[str, str]  # locks/<key>/<lock name> -> the lock's sha256
    page_folders: frozenset[str]  # locks/<key>/ of each lock: where its find-links page lives


def _cache_names(locks: CellLocks) -> _CacheNames:
    hashes = {h for lock in locks.python_locks for package in lock.packages.values() for h in package.hashes}
    if locks.debian is not None:
        hashes |= {file.sha256 for file in locks.debian.files.values()}
    pages = {served.lock_page(lock, locks.cell) + lock.path.name: lock.sha256 for lock in locks.python_locks}
    folders = frozenset(served.lock_page(lock, locks.cell) for lock in locks.python_locks)
    return _CacheNames(frozenset(hashes), pages, folders)


def _check_page(path: Path, allowed: _CacheNames) -> None:
    """A lock's find-links page may link only the files the cell's locks name."""
    text = confined.read_bytes(path, MAX_MANIFEST_BYTES).decode(errors="replace")
    stray = next((h for h in PAGE_HREF.findall(text) if h not in allowed.hashes), None)
    if stray is not None or "href=" in PAGE_HREF.sub("", text):
        raise UserError(f"{path}: links a file the cell's locks do not name; make the bundle again")


def import_cache(bundle: Bundle, house: wheelhouse.Wheelhouse) -> int:
    """Copy the bundle's cache files into the wheelhouse (those not there already); returns how many.
    Run after check_against_repository: only the files the cell's locks name are in the list."""
    copied = 0
    for name in sorted(n for n in bundle.files if n.startswith(CACHE + "/")):
        target = confined.inside(house.root, name.removeprefix(CACHE + "/"))
        if target.is_file() and digests.sha256_file(target) == bundle.files[name]:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".part-{target.name}")
        shutil.copyfile(confined.inside(bundle.root, name), partial, follow_symlinks=False)
        os.replace(partial, target)
        copied += 1
    return copied
