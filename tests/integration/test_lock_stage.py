"""The lock stage end to end, for real: `lock` resolves both CPU cells of a cut-down project
with uv against the index (torch's CPU wheel from its wheel directory) and Debian's pins with apt
in a base bootstrapped from the mirror, and what it writes passes `lock --check`, renders, and
holds the torch build the cell names. The index moves on, so the lines may differ from the
committed locks; their grammar, their checks and torch may not."""

from __future__ import annotations

import pytest

from builder.lock import debian, inputs
from builder.lock import requirements as lock
from builder.plan.matrix import load_matrix
from tests.unit.test_hostile_inputs import CELLS, Project, project, run

pytestmark = pytest.mark.integration
__all__ = ["project"]  # the cut-down project of the hostile-input tests


def test_lock_writes_locks_that_pass_the_check_and_render(project: Project, capsys: pytest.CaptureFixture[str]) -> None:
    for name in CELLS:
        for file in (lock.STACK_LOCK, lock.FLAVOR_LOCK, debian.DEBIAN_LOCK):
            (project.cell(name) / file).unlink(missing_ok=True)
    code, output = run(project, capsys, "lock", limit_s=900)
    assert code == 0, output[-3000:]
    code, output = run(project, capsys, "lock", "--check")
    assert code == 0, output[-3000:]
    assert run(project, capsys, "render")[0] == 0
    assert run(project, capsys, "render", "--check")[0] == 0
    grid = load_matrix(project.matrix)
    for name in CELLS:
        locks = inputs.read(grid.cell(name), grid)
        assert locks.problems == () and locks.stack is not None and locks.debian is not None
        assert locks.stack.packages["torch"].version == "2.13.0+cpu"
        assert all(package.hashes for package in locks.stack.packages.values())
        assert "gcc" in " ".join(locks.debian.common) and locks.debian.files  # every pin has its .deb and sha256
