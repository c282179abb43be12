"""`audit`: what each cell's locks hold that a security fix has since replaced.

Debian side: every locked package (the base's, the common layer's, the flavor's) against the
suite's security archive, read from its signed index exactly as `lock` reads the release (gpgv,
the Release's sha256, and its Valid-Until, so that a stale mirror does not read as "no fixes").
A package with a newer version there is a finding: the locked version and the fixed one.

Python side: every locked wheel against vulnerability records in OSV's format (the PyPI and OSV
services where reachable; an export given with `--osv DIR`, which the tests ship). A version
inside an advisory's affected ranges is a finding, with the first fixed version. A package torch
pins exactly (its Requires-Dist `==`) cannot move alone: the finding says it needs a new torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from debian.debian_support import Version as DebianVersion
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion
from packaging.version import Version as PythonVersion

from builder import confined
from builder.config import vex
from builder.errors import UserError
from builder.facts import pypi
from builder.lock import aptindex, header
from builder.lock.debian import DebianLock, fingerprint
from builder.lock.requirements import Lockfile, entry_text
from builder.plan.cell import BaseImage, Cell
from builder.plan.matrix import Matrix

SEVERITIES = ("low", "medium", "high", "critical")
# GitHub's advisories say MODERATE where CVSS says medium. A Debian security update states no
# severity: it counts as high (the archive published it as a security fix).
SEVERITY_NAMES = {"low": "low", "moderate": "medium", "medium": "medium", "high": "high", "critical": "critical"}
MAX_OSV_FILES, MAX_OSV_BYTES = 100_000, 4 << 20


@dataclass(frozen=True)
class Finding:
    cell: str
    ecosystem: str  # "deb" (Debian or Ubuntu) or "pypi"
    package: str
    locked: str
    fixed: str  # the version that fixes it ("" where no fixed version is known)
    advisory: str  # the advisory's id, or the security suite the fix is in
    severity: str  # one of SEVERITIES
    needs: str = ""  # what must move with it ("a new torch" for a package torch pins exactly)
    not_affected: str = ""  # vex.yaml's justification, where the team decided it does not apply

    def row(self) -> dict[str, str]:
        return asdict(self)


def rank(severity: str) -> int:
    return SEVERITIES.index(severity)


# ---------------------------------------------------------------- Debian


def security_sources(base: BaseImage) -> list[tuple[str, str]]:
    """(mirror, suite) where the base's distro publishes security fixes: Debian's separate archive
    where the matrix names it, Ubuntu's <suite>-security among the base's suites."""
    if base.security is not None:
        return [base.security]
    return [(base.mirror, suite) for suite in base.extra_suites if suite.endswith("-security")]


def newest_versions(index: aptindex.Index) -> dict[str, str]:
    """Each package's newest version in an index, by Debian's version order."""
    newest: dict[str, str] = {}
    for pin in index:
        name, _, version = pin.partition("=")
        if name not in newest or DebianVersion(version) > DebianVersion(newest[name]):
            newest[name] = version
    return newest


def debian_findings(cell: Cell, lock: DebianLock, security: aptindex.Index) -> list[Finding]:
    newest = newest_versions(security)
    found = []
    for pin in sorted({*lock.base, *lock.common, *lock.flavor}):
        name, _, version = pin.partition("=")
        if name in newest and DebianVersion(newest[name]) > DebianVersion(version):
            suite = cell.base.security[1] if cell.base.security else f"{cell.base.suite}-security"
            found.append(Finding(cell.name, "deb", name, version, newest[name], suite, "high"))
    return found


# ---------------------------------------------------------------- Python (OSV)


@dataclass(frozen=True)
class Range:
    """One affected range of an advisory: from `introduced` ("" for the first release) up to
    `fixed` (excluded), or up to `last_affected` (included), or open when neither is known."""

    introduced: str = ""
    fixed: str = ""
    last_affected: str = ""

    def holds(self, version: PythonVersion) -> bool:
        if self.introduced and version < PythonVersion(self.introduced):
            return False
        if self.fixed:
            return version < PythonVersion(self.fixed)
        if self.last_affected:
            return version <= PythonVersion(self.last_affected)
        return True


@dataclass(frozen=True)
class Advisory:
    id: str
    package: str  # canonical name
    severity: str
    ranges: tuple[Range, ...]
    versions: frozenset[str]


def read_osv(folder: Path, warn: Callable[[str], None] = lambda _: None) -> list[Advisory]:
    """Every PyPI advisory in an OSV export (one JSON record per file, as osv.dev's downloads
    give them). A file that is not an OSV record is one line to `warn`, naming it, and the rest
    still count; one that cannot be read whole (a link, over the cap, unreadable) is a UserError
    naming it; withdrawn records are left out."""
    if not folder.is_dir():
        raise UserError(f"--osv {folder}: not a folder; give a folder of OSV records (*.json)")
    files = sorted(folder.rglob("*.json"))
    if len(files) > MAX_OSV_FILES:
        raise UserError(f"--osv {folder}: {len(files)} files, more than {MAX_OSV_FILES}; give the PyPI export only")
    advisories = []
    for path in files:
        # A file that cannot be read whole (a link, over the cap, unreadable) refuses the audit:
        # counting it as no advisory would report a clean lock that was never checked.
        data = confined.read_bytes(path, MAX_OSV_BYTES)
        try:
            record = json.loads(data)
            advisories += list(_advisories(record))
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
            warn(f"{path}: not an OSV record (id, affected[].package, ranges); left out, the others still count")
    return advisories


def _parsed(version: str) -> bool:
    try:
        PythonVersion(version)
        return True
    except InvalidVersion:
        return False


def _ranges(entry: dict[str, Any]) -> Iterable[Range]:
    """The ranges of one OSV `ranges` entry, in event order; a range with a bound that is not a
    PEP 440 version is left out (it cannot be compared), the others stay."""
    introduced: str | None = None
    for event in entry.get("events", []):
        if "introduced" in event:
            introduced = "" if str(event["introduced"]) == "0" else str(event["introduced"])
            continue
        if introduced is None:
            continue
        if "fixed" in event:
            found = Range(introduced, fixed=str(event["fixed"]))
        elif "last_affected" in event:
            found = Range(introduced, last_affected=str(event["last_affected"]))
        elif "limit" in event:  # affected below the limit, no fix named
            found = Range(introduced, last_affected="")
        else:
            continue
        introduced = None
        if all(_parsed(bound) for bound in (found.introduced, found.fixed, found.last_affected) if bound):
            yield found
    if introduced is not None and (not introduced or _parsed(introduced)):
        yield Range(introduced)


def _advisories(record: Any) -> Iterable[Advisory]:
    ident = str(record["id"])
    if record.get("withdrawn"):
        return
    severity = _severity(record)
    for affected in record.get("affected", []):
        package = affected["package"]
        if str(package.get("ecosystem")) != "PyPI":
            continue
        ranges = [r for entry in affected.get("ranges", []) if entry.get("type") == "ECOSYSTEM" for r in _ranges(entry)]
        versions = frozenset(str(v) for v in affected.get("versions", []))
        yield Advisory(ident, canonicalize_name(str(package["name"])), severity, tuple(ranges), versions)


def _severity(record: dict[str, Any]) -> str:
    stated = str((record.get("database_specific") or {}).get("severity", "")).lower()
    return SEVERITY_NAMES.get(stated, "high")  # unstated: treated as high, so it is not missed


def _affects(advisory: Advisory, version: str) -> str | None:
    """The fix for `version` ("" if none is known) when it is affected, else None. The fix is the
    one of the range that holds the version (an advisory often covers several release lines:
    introduced 0, fixed 2.11.3, introduced 3.0.0, fixed 3.1.7), and never a version at or below
    the locked one: a fix must move a package up."""
    try:
        parsed = PythonVersion(version)
    except InvalidVersion:
        return None
    holding = [r for r in advisory.ranges if r.holds(parsed)]
    if not holding and version not in advisory.versions:
        return None
    fixes = sorted(
        (PythonVersion(r.fixed), r.fixed)
        for r in (holding or advisory.ranges)
        if r.fixed and PythonVersion(r.fixed) > parsed
    )
    return fixes[0][1] if fixes else ""


PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\]+)")


def locked_wheels(cell: Cell) -> dict[str, str]:
    """Canonical name -> version, for every package the cell's Python locks pin."""
    pins: dict[str, str] = {}
    for path in sorted(cell.directory.glob("*.lock")):
        if path.name == "debian.lock":
            continue
        for line in path.read_text().splitlines():
            match = PIN.match(line)
            if match:
                pins[canonicalize_name(match.group(1))] = match.group(2)
    return pins


def python_findings(cell: Cell, advisories: list[Advisory]) -> list[Finding]:
    torch_pins = {canonicalize_name(name) for name in cell.torch.pins}
    found = []
    for name, version in sorted(locked_wheels(cell).items()):
        for advisory in (a for a in advisories if a.package == name):
            fixed = _affects(advisory, version.split("+", 1)[0] if name == "torch" else version)
            if fixed is None:
                continue
            needs = "a new torch" if name in torch_pins else ""
            found.append(Finding(cell.name, "pypi", name, version, fixed, advisory.id, advisory.severity, needs))
    return found


# ---------------------------------------------------------------- update --security


def with_debian_fixes(lock: DebianLock, findings: list[Finding], security: aptindex.Index) -> DebianLock:
    """The lock with exactly the packages `findings` name moved to their fixed versions (files
    from the security archive's signed index); every other pin stays as it is."""
    moves = {f.package: f.fixed for f in findings if f.ecosystem == "deb"}

    def moved(pins: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(sorted(f"{name}={moves.get(name, version)}" for name, version in (p.split("=", 1) for p in pins)))

    files = {pin: file for pin, file in lock.files.items() if pin.split("=", 1)[0] not in moves}
    for name, version in moves.items():
        pin = f"{name}={version}"
        if pin not in security:
            raise UserError(f"{pin} is not in the security archive's index any more; run `python -m builder audit`")
        files[pin] = security[pin]
    return DebianLock(moved(lock.common), moved(lock.flavor), moved(lock.base), files)


def with_python_fix(text: str, name: str, locked: str, fixed: str, hashes: list[str]) -> str:
    """A Python lock's text with one package moved from `locked` to `fixed` (with the sha256 of
    each of that version's files): the entry's lines replaced, every other line as it was, and
    the header's content digest made again."""
    found_header, body = header.split(text)
    lines = body.splitlines(keepends=True)
    start = next(
        (i for i, line in enumerate(lines)
         if (m := PIN.match(line)) and canonicalize_name(m.group(1)) == name and m.group(2) == locked),
        None,
    )  # fmt: skip
    if start is None or not hashes or found_header.fingerprint is None:
        raise UserError(f"{name}=={locked} is not in the lock, or {fixed} has no files to hash")
    end = start + 1
    while end < len(lines) and lines[end].startswith("    --hash="):
        end += 1
    entry = entry_text(lines[start].split("==", 1)[0], fixed, sorted(hashes))  # the name as the lock spells it
    return header.with_header(found_header.fingerprint, "".join([*lines[:start], entry, *lines[end:]]))


def move_python(grid: Matrix, cell: Cell, findings: list[Finding], report: Callable[[str], None]) -> list[Finding]:
    """Each Python finding that can move alone, moved in the lock that pins it to the fixed
    version (every file of that version, by the sha256 the cell's index lists); one torch pins
    exactly is listed, not moved."""
    moved = []
    for finding in findings:
        if finding.needs or not finding.fixed:
            report(f"{cell.name}: {finding.package} {finding.locked} ({finding.advisory}) "
                          f"needs {finding.needs or 'a fixed release'}; not moved")  # fmt: skip
            continue
        hashes = file_hashes(grid, cell, finding.package, finding.fixed)
        for path in sorted(cell.directory.glob("*.lock")):
            if path.name == "debian.lock" or f"\n{finding.package}=={finding.locked} " not in f"\n{path.read_text()}":
                continue
            text = with_python_fix(path.read_text(), finding.package, finding.locked, finding.fixed, hashes)
            confined.write_text(path, text)
            Lockfile.read(path)  # the moved lock still reads as a lock
            moved.append(finding)
    return moved


def file_hashes(grid: Matrix, cell: Cell, name: str, version: str) -> list[str]:
    for url in grid.spec.indexes[cell.index].urls:
        files = [f for f in pypi.index_files(name, url, suffix="") if _version_of(f.filename) == version]
        if files and all(f.sha256 for f in files):
            return [str(f.sha256) for f in files]
    raise UserError(f"{cell.name}: {name} {version} has no files with sha256 on its index; lock the cell again")


def _version_of(filename: str) -> str | None:
    try:
        if filename.endswith(".whl"):
            return str(parse_wheel_filename(filename)[1])
        return str(parse_sdist_filename(filename)[1])
    except (InvalidWheelFilename, InvalidSdistFilename):
        return None


def apply_fixes(
    grid: Matrix, cells: list[Cell], advisories: list[Advisory], report: Callable[[str], None]
) -> list[Cell]:
    """`update --security`: in each cell, the Debian packages with a newer version in the
    security archive and the Python packages the advisories name moved to their fixes, every
    other pin left as it is; returns the cells that moved. What has no fix is reported, not
    moved. All or nothing: when anything fails (a stale index, a fix whose files the index does
    not list), every lock is put back as it was, so no run leaves half its fixes behind."""
    before = {path: confined.read_bytes(path) for cell in cells for path in sorted(cell.directory.glob("*.lock"))}
    try:
        return _apply_fixes(grid, cells, advisories, report)
    except BaseException:
        for path, data in before.items():
            if confined.read_bytes(path) != data:
                confined.write_text(path, data.decode())
        raise


def _apply_fixes(
    grid: Matrix, cells: list[Cell], advisories: list[Advisory], report: Callable[[str], None]
) -> list[Cell]:
    archives = SecurityArchives()
    changed = []
    for cell in cells:
        lock_file = cell.file("debian.lock")
        locked = DebianLock.read(lock_file) if lock_file.exists() else None
        security = archives.of(cell) if locked is not None else {}
        findings = debian_findings(cell, locked, security) if locked is not None else []
        if findings and locked is not None:
            confined.write_text(lock_file, with_debian_fixes(locked, findings, security).text(fingerprint(cell)))
        python = move_python(grid, cell, python_findings(cell, advisories), report) if advisories else []
        if findings or python:
            changed.append(cell)
            report(f"{cell.name}: " + ", ".join(f"{f.package} {f.locked} -> {f.fixed}" for f in [*findings, *python]))
    return changed


class SecurityArchives:
    """Each base's security suites, read once per run from their signed indexes."""

    def __init__(self) -> None:
        self.read: dict[tuple[str, str, str, str], aptindex.Index] = {}

    def of(self, cell: Cell) -> aptindex.Index:
        found: aptindex.Index = {}
        for mirror, suite in security_sources(cell.base):
            key = (mirror, suite, cell.base.name, cell.base.arch)
            if key not in self.read:
                self.read[key] = aptindex.suite_index(cell.base, mirror, suite)
            found.update(self.read[key])
        return found


def findings_of(
    cells: list[Cell], advisories: list[Advisory], decisions: tuple[vex.Decision, ...] = ()
) -> list[Finding]:
    """`audit`: every cell's Debian findings (against its security archive) and Python ones,
    each marked with vex.yaml's justification where a reviewed decision covers it."""
    archives, found = SecurityArchives(), []
    for cell in cells:
        lock_file = cell.file("debian.lock")
        if lock_file.exists():
            found += debian_findings(cell, DebianLock.read(lock_file), archives.of(cell))
        found += python_findings(cell, advisories)
    return [with_decision(f, decisions) for f in found]


def with_decision(finding: Finding, decisions: tuple[vex.Decision, ...]) -> Finding:
    decision = next(
        (d for d in decisions if d.covers(finding.cell, finding.package, finding.advisory, finding.ecosystem)), None
    )
    return replace(finding, not_affected=decision.justification) if decision else finding
