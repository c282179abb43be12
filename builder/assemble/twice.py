"""verify-repro: build a cell twice from nothing and compare the two images."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import docker

from builder.assemble import build
from builder.errors import UserError
from builder.plan.cell import Cell
from builder.plan.matrix import Matrix
from builder.repro.verify import Verdict, compare
from builder.wheelhouse.wheelhouse import Wheelhouse

Progress = Callable[[str], AbstractContextManager[Callable[[str], None]]]


def build_once(
    engine: docker.DockerClient, grid: Matrix, cell: Cell, house: Wheelhouse, progress: Progress
) -> build.BuildResult:
    """Build the cell without cache (its intermediate steps removed after); the result has the
    image ID, the build ID (the inputs it was built from) and the base's ID."""
    locks = build.preflight(cell, grid)
    with progress(f"{cell.name}: building without cache") as report:
        result = build.build_cell(engine, grid, locks, house, report, build.BuildOptions(no_cache=True))
    build.discard_intermediates(engine, [result])
    if result.state is not build.BuildState.BUILT:
        raise UserError(f"{cell.name}: the build failed: {result.detail}")
    return result


def build_twice(
    engine: docker.DockerClient, grid: Matrix, cell: Cell, house: Wheelhouse, progress: Progress
) -> tuple[Verdict, build.BuildResult]:
    """Build the cell twice without cache (each build's intermediate steps removed before the
    next, so the second reuses nothing) and compare the two images; returns the verdict and the
    first build."""
    first, second = (build_once(engine, grid, cell, house, progress) for _ in (1, 2))
    return compare(engine, cell.name, first.image_id, second.image_id), first
