"""Debian packages at pinned versions: images/<cell>/debian.lock.

The distro's mirror serves the current point release, so `apt-get install python3` gives
different bytes from month to month. `lock` resolves the cell's system packages (and every
dependency apt pulls in) in a container of the cell's base, against the mirror, and records
`package=version` for each; the Dockerfile installs exactly those. When the mirror has moved
on, the build fails and says to lock again, instead of silently building something else.

The common packages and the flavor's are resolved in two steps, the flavor's on top of the
common set, so that cells differing only in flavor share the common layer.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from builder.engine import bases
from builder.errors import Location, UserError
from builder.lock.header import read_text, split, with_header
from builder.plan.cell import Cell
from builder.spec import flavor, grammar

DEBIAN_LOCK = "debian.lock"
INST = re.compile(r"^Inst (\S+) (?:\[[^\]]*\] )?\((\S+) ")


@dataclass(frozen=True)
class DebianLock:
    common: tuple[str, ...]  # "package=version", for the shared system layer
    flavor: tuple[str, ...]  # what the flavor adds on top
    fingerprint: str | None = None
    content_matches: bool = True

    def text(self, fingerprint: str) -> str:
        body = {"common": list(self.common), "flavor": list(self.flavor)}
        return with_header(fingerprint, json.dumps(body, indent=1) + "\n")

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
        if not isinstance(data, dict) or set(data) != {"common", "flavor"}:
            raise UserError('must hold exactly "common" and "flavor" lists; run `python -m builder lock`', path)
        groups: list[tuple[str, ...]] = []
        for key in ("common", "flavor"):
            entries = data[key]
            if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
                raise UserError(f'"{key}" must be a list of "package=version" strings', path)
            for entry in entries:
                if not grammar.DEBIAN_PIN.matches(entry):
                    number = next((i for i, line in enumerate(text.splitlines(), 1) if json.dumps(entry) in line), None)
                    raise UserError(
                        f"{entry[:60]!r} is not a Debian pin; write {grammar.DEBIAN_PIN.hint}", Location(path, number)
                    )
            groups.append(tuple(entries))
        return cls(groups[0], groups[1], header.fingerprint, header.content_matches)


def fingerprint(cell: Cell) -> str:
    table = flavor.load()
    base: list[object] = [cell.base.distro, cell.base.suite, cell.base.mirror, list(cell.base.components)]
    if cell.base.include or cell.base.extra_suites:  # only where set: other bases' fingerprints stay as they were
        base += [list(cell.base.include), list(cell.base.extra_suites)]
    if cell.base.arch != "amd64":
        base.append(cell.base.arch)
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


def resolve(engine: docker.DockerClient, cell: Cell, epoch: int, memo: dict[tuple[str, ...], list[str]]) -> DebianLock:
    """Resolve the cell's Debian packages against the mirror, in a container of its bases.

    `memo` shares resolutions between cells of one base (runtime and devel share the common set).
    """
    image = bases.ensure(engine, cell.base, epoch, lambda _: None)
    table = flavor.load()

    def simulated(packages: list[str]) -> list[str]:
        key = (image, *packages)
        if key not in memo:
            memo[key] = _simulate(engine, image, packages)
        return memo[key]

    shared = list(table.common_system(cell.python))
    common = simulated(shared)
    extra = list(table.flavors[cell.flavor].system)
    together = simulated([*shared, *extra]) if extra else common
    return DebianLock(tuple(common), tuple(p for p in together if p not in set(common)))


def lock_path(directory: Path) -> Path:
    return directory / DEBIAN_LOCK


def lock_cells(cells: list[Cell], epoch: int, engine: docker.DockerClient) -> Iterator[tuple[Cell, Path]]:
    """Pin each cell's Debian packages (needs the engine: apt resolves inside the base)."""
    memo: dict[tuple[str, ...], list[str]] = {}
    for cell in cells:
        resolved = resolve(engine, cell, epoch, memo)
        path = lock_path(cell.directory)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(resolved.text(fingerprint(cell)))
        yield cell, path
