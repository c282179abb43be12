"""`audit` against the real security archive: Debian's bookworm-security, read from its signed
index (gpgv against debian-archive-keyring, the Release's sha256, Valid-Until). Needs the mirror,
no engine."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from debian.debian_support import Version

from builder import cli
from builder.lock import aptindex, audit, debian
from builder.lock.debian import DebianLock
from builder.plan.matrix import load_matrix

pytestmark = pytest.mark.network

REPO = Path(__file__).resolve().parents[2]
CELL = "2.13.0-cpu-bookworm-runtime"


def test_a_lock_from_before_a_security_update_is_flagged_and_one_with_the_update_is_clean(tmp_path: Path) -> None:
    grid = load_matrix(REPO / "matrix.yaml")
    cell = grid.cell(CELL)
    shutil.copytree(cell.directory, tmp_path / CELL)
    cell = replace(cell, images_root=tmp_path)
    [(mirror, suite)] = audit.security_sources(cell.base)
    assert (mirror, suite) == ("http://deb.debian.org/debian-security", "bookworm-security")
    security = aptindex.suite_index(cell.base, mirror, suite)  # signed, checked, and still valid
    newest = audit.newest_versions(security)
    assert "libssl3" in newest  # OpenSSL has had security updates in every Debian release
    lock_path = cell.directory / "debian.lock"
    locked = DebianLock.read(lock_path)
    ours = next(pin for pin in locked.common + locked.base if pin.startswith("libssl3="))

    def with_libssl3(version: str) -> DebianLock:
        text = lock_path.read_text().replace(f'"{ours}"', f'"libssl3={version}"')
        lock_path.write_text(text)
        return DebianLock.read(lock_path)

    older = with_libssl3("3.0.11-1~deb12u1")  # an OpenSSL older than the archive's fix
    findings = [f for f in audit.debian_findings(cell, older, security) if f.package == "libssl3"]
    assert [(f.locked, f.fixed) for f in findings] == [("3.0.11-1~deb12u1", newest["libssl3"])]
    ours = "libssl3=3.0.11-1~deb12u1"
    current = with_libssl3(newest["libssl3"])
    assert not [f for f in audit.debian_findings(cell, current, security) if f.package == "libssl3"]
    json.dumps([f.row() for f in audit.debian_findings(cell, current, security)])  # the --json form


def test_update_security_moves_only_the_packages_audit_names_in_only_their_cell(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A copy of the project whose one cell pins the release's OpenSSL, older than the security
    archive's: `update --security` moves exactly those packages back to the fix and renders that
    cell; no other cell's files change, so no other build ID does.

    The archive moves on between commits (a fix for trixie's OpenSSL landed after the locks were
    written, and this test then saw eight cells move for a reason of the archive's own), so the
    copy is first brought up to today's archive, and that state is what the one cell must return to."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(REPO / "matrix.yaml", project / "matrix.yaml")
    shutil.copytree(REPO / "images", project / "images")
    assert cli.main(["--matrix", str(project / "matrix.yaml"), "update", "--security"]) == 0
    capsys.readouterr()
    before = {p: p.read_bytes() for p in (project / "images").rglob("*") if p.is_file()}
    grid = load_matrix(project / "matrix.yaml")
    cell = grid.cell(CELL)
    lock_path = cell.directory / "debian.lock"
    locked = DebianLock.read(lock_path)
    release = aptindex.archive_index(replace(cell.base, security=None))  # the release suite alone
    moved = {}
    for pin in (*locked.base, *locked.common, *locked.flavor):
        name, _, version = pin.partition("=")
        if name not in ("libssl3", "openssl"):
            continue
        older = max((p for p in release if p.startswith(f"{name}=")), key=lambda p: Version(p.split("=", 1)[1]))
        if Version(older.split("=", 1)[1]) >= Version(version):
            pytest.fail(f"{pin} is not from the security archive: run `python -m builder lock --debian-only`")
        moved[pin] = older
    assert any(pin.startswith("libssl3=") for pin in moved)

    def swap(pins: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(sorted(moved.get(pin, pin) for pin in pins))

    files = {moved.get(pin, pin): release[moved[pin]] if pin in moved else f for pin, f in locked.files.items()}
    older_lock = DebianLock(swap(locked.common), swap(locked.flavor), swap(locked.base), files)
    lock_path.write_text(older_lock.text(debian.fingerprint(cell)))
    assert cli.main(["--matrix", str(project / "matrix.yaml"), "update", "--security"]) == 0
    assert f"{CELL}: " in capsys.readouterr().err
    after = {p: p.read_bytes() for p in (project / "images").rglob("*") if p.is_file()}
    others = [p for p in after if cell.directory not in p.parents]
    assert [p for p in others if after[p] != before[p]] == []  # no other cell's lock or Dockerfile: no other build ID
    assert after[lock_path] == before[lock_path]  # the lock came back to today's archive, byte for byte
    assert after[cell.directory / "Dockerfile"] == before[cell.directory / "Dockerfile"]


def test_update_security_moves_a_python_package_an_advisory_names_to_its_fix_and_nothing_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CPU cell's lock with Jinja2 3.1.5 (real files and hashes from PyPI), against the real
    advisory GHSA-cpwx-vrp4-4pq7: `update --security --osv` moves exactly Jinja2 to 3.1.6, and
    the lock comes back as committed."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(REPO / "matrix.yaml", project / "matrix.yaml")
    shutil.copytree(REPO / "images", project / "images")
    grid = load_matrix(project / "matrix.yaml")
    cell = grid.cell(CELL)
    lock_path = cell.directory / "requirements.lock"
    committed = lock_path.read_text()
    older = audit.with_python_fix(
        committed, "jinja2", "3.1.6", "3.1.5", audit.file_hashes(grid, cell, "jinja2", "3.1.5")
    )
    lock_path.write_text(older)
    osv = REPO / "tests" / "fixtures" / "osv"
    assert (
        cli.main(
            [
                "--matrix",
                str(project / "matrix.yaml"),
                "audit",
                CELL,
                "--osv",
                str(osv),
                "--fail-on",
                "medium",
                "--json",
            ]
        )
        == 1
    )
    capsys.readouterr()
    assert cli.main(["--matrix", str(project / "matrix.yaml"), "update", "--security", CELL, "--osv", str(osv)]) == 0
    assert "jinja2 3.1.5 -> 3.1.6" in capsys.readouterr().err
    assert lock_path.read_text() == committed
