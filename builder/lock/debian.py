"""Debian packages at pinned versions, with their files' sha256: images/<cell>/debian.lock.

The distro's mirror serves the current point release, so `apt-get install python3` gives
different bytes from month to month, and a pinned version vanishes from it after the next
point release. `lock` records, for every package a cell's image holds:

- `base`: what the base has installed (the bootstrap installs exactly these);
- `common` and `flavor`: what apt installs on top, resolved in a container of the base against
  the mirror, the flavor's on top of the common set so that cells differing only in flavor
  share the common layer;
- `files`: each of those packages' path in the archive and sha256, from the suite's signed
  Packages index (see aptindex.py).

Builds then fetch each .deb once into the content-addressed cache, check it against `files`,
and install from a local repository the wheelhouse server offers (see wheelhouse/aptrepo.py): what
a layer holds no longer depends on what the mirror serves that day, and a rebuild needs no
mirror at all once the files are cached or bundled.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors

from builder import confined
from builder.config import flavor, grammar
from builder.engine import bases
from builder.errors import Location, UserError
from builder.lock import aptindex
from builder.lock.aptindex import ArchiveFile
from builder.lock.header import read_text, split, with_header
from builder.plan.cell import Cell

DEBIAN_LOCK = "debian.lock"
INST = re.compile(r"^Inst (\S+) (?:\[[^\]]*\] )?\((\S+) ")
GROUPS = ("base", "common", "flavor")
# The installed packages of a base, as `package=version` (half-installed or removed ones left out).
LIST_INSTALLED = ["dpkg-query", "--show", "--showformat=${db:Status-Status} ${Package}=${Version}\\n"]


@dataclass(frozen=True)
class DebianLock:
    common: tuple[str, ...]  # "package=version", for the shared system layer
    flavor: tuple[str, ...]  # what the flavor adds on top
    base: tuple[str, ...] = ()  # what the base holds: the bootstrap installs exactly these
    files: dict[str, ArchiveFile] = field(default_factory=dict)  # every pin above -> its .deb
    fingerprint: str | None = None
    content_matches: bool = True

    def text(self, fingerprint: str) -> str:
        body: dict[str, object] = {"base": list(self.base), "common": list(self.common), "flavor": list(self.flavor)}
        body["files"] = {pin: _file_text(self.files[pin]) for pin in sorted(self.files)}
        return with_header(fingerprint, json.dumps(body, indent=1) + "\n")

    def files_of(self, pins: tuple[str, ...]) -> list[ArchiveFile]:
        return [self.files[pin] for pin in pins]

    @classmethod
    def read(cls, path: Path) -> DebianLock:
        """Read and validate the pins: every entry is `package=version` by Debian's grammar."""
        text = read_text(path)
        header, body = split(text)
        try:
            data = json.loads(body)
        except json.JSONDecodeError as error:
            raise UserError(
                f"not the JSON `lock` writes ({error.msg}); run `python -m builder lock`",
                Location(path, error.lineno + 1),
            ) from None
        if not isinstance(data, dict) or set(data) != {*GROUPS, "files"}:
            raise UserError(
                'must hold exactly "base", "common" and "flavor" lists and "files"; run `python -m builder lock`', path
            )

        def line_of(value: str) -> Location:
            number = next((i for i, line in enumerate(text.splitlines(), 1) if json.dumps(value) in line), None)
            return Location(path, number)

        groups: list[tuple[str, ...]] = []
        for key in GROUPS:
            entries = data[key]
            if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
                raise UserError(f'"{key}" must be a list of "package=version" strings', path)
            for entry in entries:
                if not grammar.DEBIAN_PIN.matches(entry):
                    raise UserError(
                        f"{entry[:60]!r} is not a Debian pin; write {grammar.DEBIAN_PIN.hint}", line_of(entry)
                    )
            groups.append(tuple(entries))
        files = _read_files(data["files"], path, line_of)
        pinned = {pin for group in groups for pin in group}
        for pin in sorted(pinned ^ set(files)):
            where = "has no entry in" if pin in pinned else "is in no package list but in"
            raise UserError(f'{pin} {where} "files"; run `python -m builder lock`', line_of(pin))
        return cls(groups[1], groups[2], groups[0], files, header.fingerprint, header.content_matches)


SECURITY = "security"  # a file's source word in the lock: from the base's security archive


def _file_text(file: ArchiveFile) -> str:
    return f"{file.source + ' ' if file.source else ''}{file.path} {file.sha256}"


def _read_files(entries: object, path: Path, line_of: Callable[[str], Location]) -> dict[str, ArchiveFile]:
    """ "files": each pin's archive path and sha256, after the word `security` for a file of the
    base's security archive, checked by their grammars (they reach a Packages index the builds'
    apt reads, and name the files the cache fetches)."""
    if not isinstance(entries, dict):
        raise UserError('"files" must map each "package=version" to "pool/<path>.deb <sha256>"', path)
    files = {}
    for pin, value in entries.items():
        fields = value.split(" ") if isinstance(value, str) else []
        source = fields.pop(0) if len(fields) == 3 and fields[0] == SECURITY else ""
        if len(fields) != 2 or not grammar.DEBIAN_POOL_PATH.matches(fields[0]) or not grammar.SHA256.matches(fields[1]):
            shown = str(value)[:80]
            raise UserError(
                f"{pin}: {shown!r} is not an archive file; write {grammar.DEBIAN_POOL_PATH.hint}, a space and its "
                f"sha256 ({grammar.SHA256.hint}), after the word {SECURITY} for the security archive's",
                line_of(pin),
            )
        files[pin] = ArchiveFile(fields[0], fields[1], source)
    return files


def fingerprint(cell: Cell) -> str:
    table = flavor.load()
    base: list[object] = [cell.base.distro, cell.base.suite, cell.base.mirror, list(cell.base.components)]
    if cell.base.include or cell.base.extra_suites:  # only where set: other bases' fingerprints stay as they were
        base += [list(cell.base.include), list(cell.base.extra_suites)]
    if cell.base.arch != "amd64":
        base.append(cell.base.arch)
    if cell.base.hooks:
        base.append(["hooks", *cell.base.hooks])
    if cell.base.security:
        base.append(["security", *cell.base.security])
    inputs = {
        "base": base,
        "common": list(table.common_system(cell.python)),
        "flavor": list(table.flavors[cell.flavor].system),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def parse_simulation(output: str) -> list[str]:
    """`package=version` for every package `apt-get install --simulate` would install."""
    return sorted(f"{m.group(1)}={m.group(2)}" for line in output.splitlines() if (m := INST.match(line)))


def _simulate(engine: docker.DockerClient, image: str, packages: list[str]) -> list[str]:
    script = "apt-get update -qq >/dev/null && apt-get install --simulate --no-install-recommends " + " ".join(packages)
    try:
        output: bytes = engine.containers.run(image, ["sh", "-c", script], remove=True, network_mode="host")
    except docker.errors.ContainerError as error:
        detail = (error.stderr or b"").decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise UserError(f"apt could not resolve {' '.join(packages)} in {image}: {detail[0]}") from None
    return parse_simulation(output.decode())


def _installed(engine: docker.DockerClient, image: str) -> list[str]:
    output: bytes = engine.containers.run(image, LIST_INSTALLED, remove=True, network_mode="none")
    return sorted(line.split(" ", 1)[1] for line in output.decode().splitlines() if line.startswith("installed "))


@dataclass
class Memo:
    """What cells of one base share while locking: apt's resolutions and the archive's index."""

    resolved: dict[tuple[str, ...], list[str]] = field(default_factory=dict)
    indexes: dict[tuple[str, str], aptindex.Index] = field(default_factory=dict)


def resolve(engine: docker.DockerClient, cell: Cell, epoch: int, memo: Memo) -> DebianLock:
    """Resolve the cell's Debian packages against the mirror, in a container of its base, and
    find every package's file (the base's own included) in the archive's signed index."""
    image = bases.ensure(engine, cell.base, epoch, lambda _: None)
    table = flavor.load()

    def resolved(packages: list[str]) -> list[str]:
        key = (image, *packages)
        if key not in memo.resolved:
            memo.resolved[key] = _simulate(engine, image, packages) if packages else _installed(engine, image)
        return memo.resolved[key]

    installed = resolved([])
    shared = list(table.common_system(cell.python))
    common = resolved(shared)
    extra = list(table.flavors[cell.flavor].system)
    together = resolved([*shared, *extra]) if extra else common
    key = (cell.base.name, cell.base.arch)
    if key not in memo.indexes:
        memo.indexes[key] = aptindex.archive_index(cell.base)
    flavor_only = tuple(p for p in together if p not in set(common))
    files = aptindex.files_of(memo.indexes[key], {*installed, *common, *flavor_only}, cell.base)
    return DebianLock(tuple(common), flavor_only, tuple(installed), files)


def lock_path(directory: Path) -> Path:
    return directory / DEBIAN_LOCK


def lock_cells(cells: list[Cell], epoch: int, engine: docker.DockerClient) -> Iterator[tuple[Cell, Path]]:
    """Pin each cell's Debian packages (needs the engine: apt resolves inside the base)."""
    memo = Memo()
    for cell in cells:
        resolved = resolve(engine, cell, epoch, memo)
        path = cell.file(DEBIAN_LOCK)
        path.parent.mkdir(parents=True, exist_ok=True)
        confined.write_text(path, resolved.text(fingerprint(cell)))
        yield cell, path
