"""The matrix sweep's record (images/sweep.json) and the table written from it (docs/matrix.md)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from builder import paths
from builder.assemble import sweep
from builder.errors import UserError
from builder.plan import matrix

ROW = sweep.SweepRow(
    cell="2.15.0-cu13.2-bookworm-runtime", platform="linux/amd64", build_id="af245e4ecc8cdb1b776c2175008c64ab",
    image_id="sha256:" + "f5" * 32, size_bytes=5_440_000_000, largest_layer_bytes=1_410_000_000, build_seconds=178.2,
    checks_passed=12, checks_total=14, status="pass", detail="12/14 checks passed", engine="Docker 20.10.24 (overlay2)",
    date="2026-12-06", dockerfile="",
)  # fmt: skip


def test_the_record_reads_back_what_it_wrote(tmp_path: Path) -> None:
    path = tmp_path / "sweep.json"
    sweep.write_record(path, {ROW.cell: ROW})
    assert sweep.read_record(path) == {ROW.cell: ROW}


@pytest.mark.parametrize(
    "text",
    ["[]", '{"a": 1}', json.dumps({"a": {**dataclasses.asdict(ROW), "extra": 1}}), "{", "\x00"],
)
def test_a_record_that_is_not_one_is_one_line_naming_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "sweep.json"
    path.write_text(text)
    with pytest.raises(UserError) as caught:
        sweep.read_record(path)
    assert str(path) in caught.value.line() and "\n" not in caught.value.line()


def test_the_table_lists_every_cell_swept_or_not_with_its_checks() -> None:
    grid = matrix.load_matrix(paths.PACKAGE.parent / "matrix.yaml")
    text = sweep.table(grid, {ROW.cell: ROW})
    rows = [line for line in text.split("## Rejected")[0].splitlines() if line.startswith("| 2.")]
    assert len(rows) == len(grid.cells)
    flagship = next(line for line in rows if line.startswith(f"| {ROW.cell} |"))
    assert "af245e4ecc8c" in flagship and "pass, 12/14" in flagship and "178 s" in flagship
    assert sum("not swept" in line for line in rows) == len(grid.cells) - 1


def test_a_row_swept_from_another_dockerfile_than_the_checkouts_is_marked_stale(tmp_path: Path) -> None:
    """The self-test's change moved every cell's Dockerfile after the first sweep's rows: a row
    says so, not only a build ID nobody can compare offline."""
    grid = matrix.load_matrix(paths.PACKAGE.parent / "matrix.yaml")
    current = sweep.dockerfile_sha256(grid.cell(ROW.cell))
    for dockerfile, stale in ((current, False), ("0" * 64, True), ("", True)):
        text = sweep.table(grid, {ROW.cell: dataclasses.replace(ROW, dockerfile=dockerfile)})
        flagship = next(line for line in text.splitlines() if line.startswith(f"| {ROW.cell} |"))
        assert ("*stale*: pass, 12/14" in flagship) == stale
    older = {k: v for k, v in dataclasses.asdict(ROW).items() if k != "dockerfile"}  # kept before this field
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({ROW.cell: older}))
    assert sweep.read_record(path)[ROW.cell].dockerfile == ""


def test_a_long_failure_keeps_its_last_lines_where_the_step_says_what_went_wrong() -> None:
    error = "The command '/bin/sh -c " + "x" * 600 + "' returned a non-zero code: 1 (link-cuda-home: no nvcc under /v)"
    kept = sweep._shortened(error)
    assert len(kept) <= 300 and kept.startswith("The command") and kept.endswith("no nvcc under /v)")


def test_the_table_lists_rejected_combinations_and_cells_swept_before_that_the_matrix_no_longer_has() -> None:
    grid = matrix.load_matrix(paths.PACKAGE.parent / "matrix.yaml")
    gone = dataclasses.replace(ROW, cell="2.6.0-cu12.4-bookworm-devel", status="build failed", detail="no nvcc | x")
    text = sweep.table(grid, {ROW.cell: ROW, gone.cell: gone})
    rejected = text.split("## Rejected combinations")[1].split("## Swept before")[0]
    assert all(f"| {r.name} | " in rejected for r in grid.rejected)
    assert "2.6.0-bookworm-devel | the devel flavor needs nvcc" in rejected
    former = text.split("## Swept before, no longer built")[1]
    assert f"| `{gone.cell}` | af245e4ecc8c | build failed: no nvcc \\| x |" in former
    assert gone.cell not in text.split("## Rejected combinations")[0]


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [("size_bytes", "5 GB", "size_bytes is not a whole number"), ("build_seconds", float("nan"), "build_seconds"),
     ("largest_layer_bytes", -5, "largest_layer_bytes is not a whole number of zero or more"),
     ("checks_total", True, "checks_total"), ("engine", ["Docker"], "engine is not a string"),
     ("detail", None, "detail is not a string")],
)  # fmt: skip
def test_a_row_with_the_right_keys_and_the_wrong_kinds_of_value_is_one_line(
    tmp_path: Path, field: str, value: object, says: str
) -> None:
    """Issue 57: such rows crashed `sweep` after a cell's build (and docs_tables wrote `nan GB`)."""
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({ROW.cell: {**dataclasses.asdict(ROW), field: value}}))
    with pytest.raises(UserError, match=says) as caught:
        sweep.read_record(path)
    assert "\n" not in caught.value.line()


def test_a_rows_text_cannot_add_lines_headings_or_cells_to_the_table() -> None:
    """Issue 57: a check's multi-line message, or an engine name with a pipe and a newline, added
    headings and broke rows in docs/matrix.md."""
    grid = matrix.load_matrix(paths.PACKAGE.parent / "matrix.yaml")
    hostile = dataclasses.replace(ROW, engine="Docker | x\n# Owned\n| a | b |", status="fail\n## Heading")
    former = dataclasses.replace(ROW, cell="gone|cell", detail="line one\n# Heading\n| x |")
    text = sweep.table(grid, {ROW.cell: hostile, former.cell: former})
    assert not any(line.startswith("# Owned") or line.startswith("## Heading") or line.startswith("# Heading")
                   for line in text.splitlines())  # fmt: skip
    row = next(line for line in text.splitlines() if line.startswith(f"| {ROW.cell} |"))
    assert row.count(" | ") == 9 and "\\|" in row  # ten cells, the pipe escaped
