"""vex.yaml (builder/config/vex.py): reviewed not-affected findings, read as hostile input, shown
by `audit` with their reason, and turned into one signed OpenVEX document per image."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.config import vex
from builder.errors import UserError
from builder.lock import audit
from builder.plan.matrix import load_matrix
from builder.publish import provenance

REPO = Path(__file__).resolve().parents[2]
IMPACT = "impact: the images never render templates from untrusted input"
GOOD = """\
statements:
  - vulnerability: GHSA-cpwx-vrp4-4pq7
    package: jinja2
    cells: ["2.13.0-*"]
    justification: vulnerable_code_not_in_execute_path
    impact: the images never render templates from untrusted input
"""


def _file(tmp_path: Path, text: str) -> Path:
    (tmp_path / "vex.yaml").write_text(text)
    return tmp_path / "matrix.yaml"


def test_a_reviewed_decision_covers_its_advisory_package_and_cells_only(tmp_path: Path) -> None:
    [decision] = vex.load(_file(tmp_path, GOOD))
    assert decision.covers("2.13.0-cpu-bookworm-runtime", "Jinja2", "GHSA-cpwx-vrp4-4pq7")
    assert not decision.covers("2.15.0-cu13.2-bookworm-runtime", "jinja2", "GHSA-cpwx-vrp4-4pq7")
    assert not decision.covers("2.13.0-cpu-bookworm-runtime", "jinja2", "GHSA-other-0000")
    assert vex.load(tmp_path / "elsewhere" / "matrix.yaml") == ()  # no file: no decisions


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (("vulnerable_code_not_in_execute_path", "it_is_fine"), "justification"),
        ((IMPACT, 'impact: "\\e[2J clears the screen"'), "impact"),  # YAML's escape for ESC
        (("package: jinja2", "package: jinja2; rm -rf /"), "package"),
        (("    cells:", "    owner: me\n    cells:"), "unknown key 'owner'"),
        (("GHSA-cpwx-vrp4-4pq7", "bookworm-security"), "not a suite"),  # would cover every Debian fix
    ],
)  # fmt: skip
def test_a_statement_that_is_not_one_is_one_line_with_its_place(
    tmp_path: Path, edit: tuple[str, str], needle: str
) -> None:
    with pytest.raises(UserError) as caught:
        vex.load(_file(tmp_path, GOOD.replace(*edit)))
    line = caught.value.line()
    assert "vex.yaml" in line and needle in line and "\n" not in line and "\x1b" not in line


def test_a_control_character_written_raw_is_one_line_too(tmp_path: Path) -> None:
    with pytest.raises(UserError) as caught:
        vex.load(_file(tmp_path, GOOD.replace("never render", "never\x1b[2J render")))
    assert "malformed YAML" in caught.value.line() and "\n" not in caught.value.line()


def test_audit_lists_a_covered_finding_as_not_affected_and_openvex_says_why(tmp_path: Path) -> None:
    grid = load_matrix(REPO / "matrix.yaml")
    cell = grid.cell("2.13.0-cpu-bookworm-runtime")
    decisions = vex.load(_file(tmp_path, GOOD))
    finding = audit.Finding(cell.name, "pypi", "jinja2", "3.1.5", "3.1.6", "GHSA-cpwx-vrp4-4pq7", "medium")
    assert audit.with_decision(finding, decisions).not_affected == "vulnerable_code_not_in_execute_path"
    assert audit.with_decision(finding, ()).not_affected == ""
    subject = provenance.Subject("127.0.0.1:5000/torch", "sha256:" + "a" * 64, "sha256:" + "b" * 64, "c" * 32)
    statement = provenance.openvex_statement(subject, list(decisions), {"jinja2"}, cell, 1733097600)
    document = statement["predicate"]
    assert (
        statement["predicateType"] == "https://openvex.dev/ns/v0.2.0"
        and document["timestamp"] == "2024-12-02T00:00:00Z"
    )
    [entry] = document["statements"]
    assert entry["status"] == "not_affected" and entry["justification"] == "vulnerable_code_not_in_execute_path"
    assert entry["products"][0]["@id"] == f"pkg:oci/torch@sha256:{'a' * 64}?repository_url=127.0.0.1:5000/torch"
    assert entry["products"][0]["subcomponents"] == [{"@id": "pkg:pypi/jinja2"}]


def test_a_decision_never_covers_a_debian_finding_whose_advisory_is_a_suite(tmp_path: Path) -> None:
    """Issue 47: a statement naming bookworm-security silenced every Debian fix of its package."""
    [decision] = vex.load(_file(tmp_path, GOOD))
    cell = "2.13.0-cpu-bookworm-runtime"
    assert decision.covers(cell, "jinja2", "GHSA-cpwx-vrp4-4pq7", "pypi")
    assert not decision.covers(cell, "jinja2", "GHSA-cpwx-vrp4-4pq7", "deb")  # the ecosystem counts too
    finding = audit.Finding(cell, "deb", "jinja2", "1", "2", "GHSA-cpwx-vrp4-4pq7", "high")
    assert audit.with_decision(finding, (decision,)).not_affected == ""
