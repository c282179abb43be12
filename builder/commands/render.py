"""`python -m builder render`: images/<cell>/Dockerfile and spec.json, and images/plan.json."""

from __future__ import annotations

import argparse

from builder.commands.common import (
    NEEDS_NOTHING,
    Register,
    console,
    grid_of,
)
from builder.plan import matrix
from builder.render import render


def add(register: Register) -> None:
    render_cmd = register(
        "render",
        "write images/<cell>/Dockerfile and spec.json from templates/ and the locks",
        NEEDS_NOTHING + " Removes folders of cells the matrix no longer has.",
    )
    render_cmd.add_argument(
        "--check", action="store_true", help="fail when images/ differs from a fresh render; writes nothing"
    )
    render_cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    grid = grid_of(args)
    if args.check:
        problems = render.drift(grid.cells, grid) + render.plan_drift(grid) + render.orphans(grid)
        for problem in problems:
            print(problem)
        if problems:
            print(f"{grid.images_dir} does not match {grid.path.name} and templates/; run `python -m builder render`")
        return 1 if problems else 0
    return rendered(grid)


def rendered(grid: matrix.Matrix) -> int:
    written = render.render(grid.cells, grid)
    removed = render.remove_orphans(grid)
    console.print(
        f"rendered {len(grid.cells)} cells into {grid.images_dir}, {len(written)} files changed"
        + (f", removed {len(removed)} folders of cells the matrix no longer has" if removed else "")
    )
    for problem in render.orphans(grid):  # folders holding files render does not write are left alone
        console.print(f"left in place: {problem} (it holds files render did not write)")
    return 0
