"""`build` on the real engine: one pass over each cell's inputs, and the self-test of a cell with
a recorded image ID is not skipped."""

from __future__ import annotations

import collections

import pytest

from builder import cli
from builder.lock import inputs
from tests.integration.conftest import BuiltCell

pytestmark = pytest.mark.integration


def test_a_build_reads_and_checks_each_cells_inputs_once(
    built: BuiltCell, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    reads: collections.Counter[str] = collections.Counter()
    original = inputs.read

    def counted(cell, grid):  # type: ignore[no-untyped-def]
        reads[cell.name] += 1
        return original(cell, grid)

    monkeypatch.setattr(inputs, "read", counted)
    # The image is in the engine already: a no-op rebuild, then the self-test (its earlier report, or a run).
    code = cli.main(["--matrix", str(built.grid.path), "build", built.cell.name])
    output = capsys.readouterr().out
    assert code == 0, output[-3000:]
    assert reads == {built.cell.name: 1}
    assert "unchanged" in output and "self-test pass" in output  # the recorded-ID note did not skip it
