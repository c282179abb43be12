"""`audit` (builder/lock/audit.py) without the network: OSV records (a real advisory, as a
fixture), Debian versions against a security index, Valid-Until, and the command's exit status."""

from __future__ import annotations

import io
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from builder import cli
from builder.errors import UserError
from builder.lock import aptindex, audit
from builder.lock.aptindex import ArchiveFile
from builder.lock.debian import DebianLock
from builder.plan.matrix import load_matrix

REPO = Path(__file__).resolve().parents[2]
OSV = REPO / "tests" / "fixtures" / "osv"
CELL = "2.13.0-cpu-bookworm-runtime"


@pytest.fixture
def cell(tmp_path: Path):  # type: ignore[no-untyped-def]
    """The CPU cell with its folder copied, so a test can pin other versions in its locks."""
    grid = load_matrix(REPO / "matrix.yaml")
    found = grid.cell(CELL)
    shutil.copytree(found.directory, tmp_path / "images" / CELL)
    return replace(found, images_root=tmp_path / "images")


def _pin(cell, name: str, version: str) -> None:  # type: ignore[no-untyped-def]
    lock = cell.directory / "requirements.lock"
    lines = [
        f"{name}=={version} \\" if line.startswith(f"{name}==") else line for line in lock.read_text().splitlines()
    ]
    lock.write_text("\n".join(lines) + "\n")


def test_a_real_advisory_flags_a_version_a_lock_could_hold_and_not_the_fixed_one(cell) -> None:  # type: ignore[no-untyped-def]
    advisories = audit.read_osv(OSV)
    assert [a.id for a in advisories] == ["GHSA-cpwx-vrp4-4pq7"]
    assert audit.locked_wheels(cell)["jinja2"] == "3.1.6"  # the shipped lock: fixed
    assert audit.python_findings(cell, advisories) == []
    _pin(cell, "jinja2", "3.1.5")  # what a lock from before March 2025 held
    [finding] = audit.python_findings(cell, advisories)
    assert (finding.package, finding.locked, finding.fixed, finding.advisory, finding.severity) == (
        "jinja2", "3.1.5", "3.1.6", "GHSA-cpwx-vrp4-4pq7", "medium",
    )  # fmt: skip
    assert finding.needs == ""  # torch does not pin jinja2 exactly: it can move alone


def test_a_package_torch_pins_exactly_is_reported_as_needing_a_new_torch(tmp_path: Path) -> None:
    cuda = load_matrix(REPO / "matrix.yaml").cell("2.15.0-cu13.2-bookworm-runtime")
    locked = audit.locked_wheels(cuda)
    pinned = sorted(name for name in cuda.torch.pins if name in locked)  # nvidia-* at torch's exact pins
    assert pinned, "torch's CUDA wheel pins its CUDA libraries exactly"
    record = {"id": "TEST-1", "affected": [{"package": {"ecosystem": "PyPI", "name": pinned[0]},
                                            "versions": [locked[pinned[0]]]}]}  # fmt: skip
    (tmp_path / "osv").mkdir()
    (tmp_path / "osv" / "TEST-1.json").write_text(json.dumps(record))
    [finding] = audit.python_findings(cuda, audit.read_osv(tmp_path / "osv"))
    assert finding.needs == "a new torch" and finding.fixed == "" and finding.severity == "high"


def test_an_osv_file_that_is_not_a_record_is_one_line_naming_it_and_the_rest_still_count(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text('{"affected": "x"}')
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)  # nesting past the parser's depth
    shutil.copy(OSV / "GHSA-cpwx-vrp4-4pq7.json", tmp_path / "good.json")
    said: list[str] = []
    advisories = audit.read_osv(tmp_path, said.append)
    assert [a.id for a in advisories] == ["GHSA-cpwx-vrp4-4pq7"]
    assert len(said) == 2 and "bad.json: not an OSV record" in said[0] and "deep.json" in said[1]
    with pytest.raises(UserError, match="not a folder"):
        audit.read_osv(tmp_path / "missing")


def _advisory(tmp_path: Path, events: list[dict[str, str]], **extra: object) -> audit.Advisory:
    record = {"id": "TEST-2", **extra, "affected": [{"package": {"ecosystem": "PyPI", "name": "jinja2"},
              "ranges": [{"type": "ECOSYSTEM", "events": events}]}]}  # fmt: skip
    folder = tmp_path / "osv"
    folder.mkdir(exist_ok=True)
    (folder / "TEST-2.json").write_text(json.dumps(record))
    found = audit.read_osv(folder)
    assert len(found) <= 1
    return found[0] if found else audit.Advisory("none", "jinja2", "high", (), frozenset())


BRANCHES = [{"introduced": "0"}, {"fixed": "2.11.3"}, {"introduced": "3.0.0"}, {"fixed": "3.1.7"}]


def test_the_fix_comes_from_the_range_that_holds_the_locked_version_and_never_moves_down(tmp_path: Path) -> None:
    advisory = _advisory(tmp_path, BRANCHES)
    assert audit._affects(advisory, "3.1.6") == "3.1.7"  # not 2.11.3: that would move jinja2 down
    assert audit._affects(advisory, "2.10") == "2.11.3"
    assert audit._affects(advisory, "2.11.3") is None and audit._affects(advisory, "3.1.7") is None
    listed = audit.Advisory("L", "jinja2", "high", advisory.ranges, frozenset({"3.1.8"}))
    assert audit._affects(listed, "3.1.8") == ""  # listed as affected, no fix above it: none known


def test_last_affected_closes_its_range_and_a_withdrawn_record_moves_nothing(tmp_path: Path) -> None:
    closed = _advisory(tmp_path, [{"introduced": "3.0.0"}, {"last_affected": "3.1.4"}])
    assert audit._affects(closed, "3.1.4") == "" and audit._affects(closed, "3.1.5") is None
    withdrawn = _advisory(tmp_path, BRANCHES, withdrawn="2026-01-01T00:00:00Z")
    assert withdrawn.id == "none"


def test_one_version_that_is_not_pep_440_leaves_the_other_ranges_counting(tmp_path: Path) -> None:
    advisory = _advisory(tmp_path, [{"introduced": "0"}, {"fixed": "not-a-version"}, {"introduced": "3.0.0"},
                                    {"fixed": "3.1.7"}])  # fmt: skip
    assert audit._affects(advisory, "3.1.6") == "3.1.7"


def test_a_locked_debian_package_with_a_newer_security_version_is_a_finding(cell) -> None:  # type: ignore[no-untyped-def]
    lock = DebianLock.read(cell.directory / "debian.lock")
    openssl = next(pin for pin in lock.common + lock.base if pin.startswith("libssl3="))
    locked = openssl.split("=", 1)[1]
    security = {
        f"libssl3={locked}+fix1": ArchiveFile("pool/updates/x.deb", "0" * 64),
        "libfoo=1": ArchiveFile("p", "0" * 64),
    }
    [finding] = audit.debian_findings(cell, lock, security)
    assert (finding.package, finding.locked, finding.fixed, finding.advisory) == (
        "libssl3", locked, f"{locked}+fix1", "bookworm-security",
    )  # fmt: skip
    older = {f"libssl3={locked}~older": ArchiveFile("p", "0" * 64)}  # Debian's ~ sorts before: not newer
    assert audit.debian_findings(cell, lock, older) == []


def test_a_signed_index_past_its_valid_until_is_refused() -> None:
    release = "Origin: Debian\nSuite: stable-security\nValid-Until: Sat, 05 Dec 2026 12:00:00 UTC\n"
    aptindex.check_valid_until(release, "x/InRelease", now=1_796_000_000)  # 2026-12-01: still valid
    with pytest.raises(UserError, match=r"x/InRelease expired on Sat, 05 Dec 2026 12:00:00 UTC \(Valid-Until\)"):
        aptindex.check_valid_until(release, "x/InRelease", now=1_797_000_000)  # 2026-12-13
    aptindex.check_valid_until("Origin: Debian\nSuite: stable\n", "y", now=4_000_000_000)  # none stated: no limit


def test_audit_exits_1_at_the_fail_on_severity_and_0_below_it(
    cell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(audit, "security_sources", lambda base: [])  # the Debian side needs the network
    fake = {"cells": [cell], "select": lambda s, n: [cell], "path": tmp_path / "matrix.yaml"}
    monkeypatch.setattr("builder.commands.audit.grid_of", lambda args: type("G", (), fake)())
    _pin(cell, "jinja2", "3.1.5")
    assert cli.main(["audit", CELL, "--osv", str(OSV)]) == 0  # moderate, below the default (high)
    assert "GHSA-cpwx-vrp4-4pq7" in capsys.readouterr().out
    assert cli.main(["audit", CELL, "--osv", str(OSV), "--fail-on", "medium", "--json"]) == 1
    [row] = json.loads(capsys.readouterr().out)
    assert row["package"] == "jinja2" and row["fixed"] == "3.1.6" and row["not_affected"] == ""
    # The team reviewed it (vex.yaml beside the matrix): listed with its reason, and no failure.
    (tmp_path / "vex.yaml").write_text(
        "statements:\n  - vulnerability: GHSA-cpwx-vrp4-4pq7\n    package: jinja2\n"
        "    justification: vulnerable_code_not_in_execute_path\n    impact: no template comes from untrusted input\n"
    )
    assert cli.main(["audit", CELL, "--osv", str(OSV), "--fail-on", "medium", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["not_affected"] == "vulnerable_code_not_in_execute_path"


def test_advisory_text_reaches_the_pull_request_body_and_the_terminal_inert() -> None:
    """Issue 35: the audit's table is the security job's pull request body, and OSV writes its text."""
    from builder.commands import audit as audit_command
    from builder.terminal import SafeConsole

    hostile = audit.Finding(
        "cell", "pypi", "jinja2", "3.1.6", "3.1.7",
        "GHSA-x [link](https://evil.invalid) <img src=x> @org/team #1 ![i](x) | cell\n\x1b[2Jwiped [/red]",
        "high",
    )  # fmt: skip
    body = audit_command._markdown([hostile], 1, True)
    [row] = [line for line in body.splitlines() if line.startswith("| cell | jinja2")]
    assert row.count(" | ") == 6  # one row of seven cells: no cell break came out of the text
    for raw in ("[link](", "<img", " @org", " #1", "![", "\n", "\x1b"):
        assert raw not in row, raw
    # no bare link GitHub would make: a zero-width space breaks it
    assert "\\[link\\]\\(https:/&#8203;/evil.invalid\\)" in row and "&lt;img src=x&gt;" in row and "\\@org/team" in row
    console = SafeConsole(file=io.StringIO(), width=300)
    console.print(hostile.advisory)  # Rich markup in it is text, its escape sequence is shown
    printed = console.file.getvalue()  # type: ignore[attr-defined]
    assert "\\x1b[2J" in printed and "[/red]" in printed and "\x1b" not in printed


def test_a_security_index_without_valid_until_is_refused_past_a_week_of_its_date() -> None:
    """Issue 35: Ubuntu's security Release states no Valid-Until, so a stale mirror read as 'no fixes'."""
    week = aptindex.SECURITY_INDEX_MAX_AGE_S
    release = "Origin: Ubuntu\nSuite: jammy-security\nDate: Tue, 01 Dec 2026 00:00:00 UTC\n"
    dated = 1_796_083_200  # that Date
    aptindex.check_valid_until(release, "u/InRelease", now=dated + 86400, max_age_s=week)
    with pytest.raises(UserError, match=r"u/InRelease is dated .* \(10 days ago\) and states no Valid-Until"):
        aptindex.check_valid_until(release, "u/InRelease", now=dated + 10 * 86400, max_age_s=week)
    with pytest.raises(UserError, match="states neither Valid-Until nor a readable Date"):
        aptindex.check_valid_until("Origin: Ubuntu\nDate: soon\n", "v/InRelease", now=dated, max_age_s=week)
    aptindex.check_valid_until(release, "u/InRelease", now=dated + 400 * 86400)  # a release suite: no age limit


def test_update_security_is_all_or_nothing_a_failure_puts_every_lock_back(
    cell,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    """Issue 35: a fix that failed half way left the fixes before it written."""
    _pin(cell, "jinja2", "3.1.5")
    locked = audit.locked_wheels(cell)
    # A package moved after jinja2, so that the first fix is already written when the second fails.
    other = next(name for name in sorted(locked) if name > "jinja2" and name != "torch" and name not in cell.torch.pins)
    record = {"id": "TEST-2", "affected": [{"package": {"ecosystem": "PyPI", "name": other},
              "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "999.0"}]}]}]}  # fmt: skip
    (tmp_path / "osv").mkdir()
    shutil.copy(OSV / "GHSA-cpwx-vrp4-4pq7.json", tmp_path / "osv")
    (tmp_path / "osv" / "TEST-2.json").write_text(json.dumps(record))
    advisories = audit.read_osv(tmp_path / "osv")
    before = {p: p.read_bytes() for p in cell.directory.glob("*.lock")}

    def hashes(grid: object, found_cell: object, name: str, version: str) -> list[str]:
        if name == "jinja2":
            return ["a" * 64]  # the first fix goes through and is written
        raise UserError(f"{name} {version} has no files with sha256 on its index; lock the cell again")

    monkeypatch.setattr(audit, "file_hashes", hashes)
    monkeypatch.setattr(audit.SecurityArchives, "of", lambda self, c: {})
    grid = load_matrix(REPO / "matrix.yaml")
    with pytest.raises(UserError, match=r"999\.0 has no files with sha256"):
        audit.apply_fixes(grid, [cell], advisories, lambda line: None)
    assert {p: p.read_bytes() for p in cell.directory.glob("*.lock")} == before


@pytest.mark.parametrize("how", ["link", "over the cap", "unreadable"])
def test_an_osv_file_that_cannot_be_read_whole_refuses_the_audit_naming_it(tmp_path: Path, how: str) -> None:
    """Issue 47: such a file was left out silently and audit said 0 findings: it failed open."""
    shutil.copy(OSV / "GHSA-cpwx-vrp4-4pq7.json", tmp_path / "good.json")
    odd = tmp_path / "odd.json"
    if how == "link":
        odd.symlink_to(tmp_path / "good.json")
    elif how == "over the cap":
        odd.write_bytes(b" " * (audit.MAX_OSV_BYTES + 1))
    else:
        odd.mkdir()  # a folder named like a record: no file to read
    with pytest.raises(UserError) as caught:
        audit.read_osv(tmp_path)
    assert "odd.json" in caught.value.line() and "\n" not in caught.value.line()


def test_an_ubuntu_security_suite_among_the_bases_own_suites_is_held_to_the_age_limit() -> None:
    """Issue 47: jammy-security read through `extra_suites` (not as the security archive) took an
    index dated two years back, since the age limit applied only to the security archive."""
    grid = load_matrix(REPO / "matrix.yaml")
    ubuntu = next(cell.base for cell in grid.cells if cell.base.distro == "ubuntu")
    debian = next(cell.base for cell in grid.cells if cell.base.distro == "debian")
    assert aptindex.is_age_limited(ubuntu, "jammy-security", "")
    assert aptindex.is_age_limited(ubuntu, "noble-security", "security")
    assert not aptindex.is_age_limited(ubuntu, "jammy", "")  # a release suite: dated once, valid for years
    assert not aptindex.is_age_limited(debian, "bookworm-security", "security")  # states its Valid-Until
