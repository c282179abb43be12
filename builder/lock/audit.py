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
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from debian.debian_support import Version as DebianVersion
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion
from packaging.version import Version as PythonVersion

from builder.errors import UserError
from builder.lock import aptindex
from builder.lock.debian import DebianLock
from builder.plan.cell import BaseImage, Cell

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


def debian_findings(cell: Cell, lock: DebianLock, security: aptindex.Index) -> list[Finding]:
    newest: dict[str, str] = {}
    for pin in security:
        name, _, version = pin.partition("=")
        if name not in newest or DebianVersion(version) > DebianVersion(newest[name]):
            newest[name] = version
    found = []
    for pin in sorted({*lock.base, *lock.common, *lock.flavor}):
        name, _, version = pin.partition("=")
        if name in newest and DebianVersion(newest[name]) > DebianVersion(version):
            suite = cell.base.security[1] if cell.base.security else f"{cell.base.suite}-security"
            found.append(Finding(cell.name, "deb", name, version, newest[name], suite, "high"))
    return found


# ---------------------------------------------------------------- Python (OSV)


@dataclass(frozen=True)
class Advisory:
    id: str
    package: str  # canonical name
    severity: str
    ranges: tuple[tuple[str, str], ...]  # (introduced, fixed), "" where open
    versions: frozenset[str]


def read_osv(folder: Path) -> list[Advisory]:
    """Every PyPI advisory in an OSV export (one JSON record per file, as osv.dev's downloads
    give them); a file that is not an OSV record is one line naming it."""
    if not folder.is_dir():
        raise UserError(f"--osv {folder}: not a folder; give a folder of OSV records (*.json)")
    files = sorted(folder.rglob("*.json"))
    if len(files) > MAX_OSV_FILES:
        raise UserError(f"--osv {folder}: {len(files)} files, more than {MAX_OSV_FILES}; give the PyPI export only")
    advisories = []
    for path in files:
        data = path.read_bytes()[: MAX_OSV_BYTES + 1]
        try:
            record = json.loads(data) if len(data) <= MAX_OSV_BYTES else None
            advisories += list(_advisories(record))
        except (ValueError, TypeError, KeyError, AttributeError):
            raise UserError("is not an OSV record (id, affected[].package, ranges); remove it", path) from None
    return advisories


def _advisories(record: Any) -> Iterable[Advisory]:
    ident = str(record["id"])
    severity = _severity(record)
    for affected in record.get("affected", []):
        package = affected["package"]
        if str(package.get("ecosystem")) != "PyPI":
            continue
        ranges = []
        for entry in affected.get("ranges", []):
            if entry.get("type") != "ECOSYSTEM":
                continue
            introduced = ""
            for event in entry.get("events", []):
                if "introduced" in event:
                    introduced = "" if event["introduced"] == "0" else str(event["introduced"])
                elif "fixed" in event:
                    ranges.append((introduced, str(event["fixed"])))
                    introduced = None  # type: ignore[assignment]
            if introduced is not None:
                ranges.append((introduced, ""))
        versions = frozenset(str(v) for v in affected.get("versions", []))
        yield Advisory(ident, canonicalize_name(str(package["name"])), severity, tuple(ranges), versions)


def _severity(record: dict[str, Any]) -> str:
    stated = str((record.get("database_specific") or {}).get("severity", "")).lower()
    return SEVERITY_NAMES.get(stated, "high")  # unstated: treated as high, so it is not missed


def _affects(advisory: Advisory, version: str) -> str | None:
    """The fixed version ("" if none) when `version` is affected, else None."""
    if version in advisory.versions:
        return next((fixed for _, fixed in advisory.ranges if fixed), "")
    try:
        parsed = PythonVersion(version)
        for introduced, fixed in advisory.ranges:
            if (not introduced or parsed >= PythonVersion(introduced)) and (not fixed or parsed < PythonVersion(fixed)):
                return fixed
    except InvalidVersion:
        return None
    return None


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
