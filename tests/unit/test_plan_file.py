"""images/plan.json: every cell's tags, aliases and platform, written by `render` and checked for
drift by `render --check`, so that a moving tag shows in review."""

from __future__ import annotations

import json

import pytest

from tests.unit.test_hostile_inputs import CELL, Project, project, run

__all__ = ["project"]  # the fixture, shared with test_hostile_inputs


def test_the_plan_file_lists_each_cells_tags_and_a_moved_alias_is_drift(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = json.loads((project.root / "images" / "plan.json").read_text())
    runtime = next(c for c in plan["cells"] if c["cell"] == CELL)
    assert runtime["tag"] == "2.13.0-cpu-py3.11-bookworm-runtime" and runtime["platform"] == "linux/amd64"
    assert "latest" in runtime["aliases"]  # the cut-down project's flagship
    project.edit(project.matrix, '"{torch_minor}-{cuda_tag}-{flavor}"', '"{torch_minor}-{cuda_tag}-{flavor}-moved"')
    code, output = run(project, capsys, "render", "--check")
    assert code == 1 and f"{project.root / 'images' / 'plan.json'} differs from the plan of matrix.yaml" in output
    assert run(project, capsys, "render")[0] == 0
    moved = json.loads((project.root / "images" / "plan.json").read_text())
    assert any(alias.endswith("-moved") for c in moved["cells"] for alias in c["aliases"])
    assert run(project, capsys, "render", "--check")[0] == 0
