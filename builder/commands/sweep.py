"""`python -m builder sweep`: every buildable cell built and self-tested in turn, recorded."""

from __future__ import annotations

import argparse

from builder.assemble import sweep
from builder.commands.common import Register, console, grid_of, progress
from builder.engine import daemon
from builder.wheelhouse import wheelhouse


def add(register: Register) -> None:
    sweep_cmd = register(
        "sweep",
        "build and self-test every buildable cell in turn, removing each cell's images before the next",
        "Needs the engine. Each cell is built without cache and self-tested, then its images are removed, so the "
        "whole matrix fits one machine's disk; images/sweep.json keeps each cell's result and docs/matrix.md is "
        "written from it. A cell whose build ID already passed is skipped, so a rerun goes on where one stopped. "
        "Hours for the whole matrix (each CUDA cell downloads its wheels once into the cache).",
    )
    sweep_cmd.add_argument("cells", nargs="*", help="cells to sweep (default: every buildable cell of the platform)")
    sweep_cmd.add_argument(
        "--platform",
        default="linux/amd64",
        choices=["linux/amd64", "linux/arm64"],
        help="sweep the cells of this platform (default: linux/amd64; linux/arm64 runs under emulation on x86)",
    )
    sweep_cmd.add_argument(
        "--record-passed",
        action="store_true",
        help="build nothing: write images/<cell>/image-id, with its base, for each cell whose sweep row passed at "
        "the build ID the cell has here (its base bootstrapped here if missing: the same build ID means the same "
        "base as the sweep's machine); for rows swept before the sweep wrote records",
    )
    sweep_cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    grid = grid_of(args)
    cells = grid.select(args.cells) if args.cells else [c for c in grid.cells if c.platform == args.platform]
    client = daemon.client()
    house = wheelhouse.Wheelhouse()
    if args.record_passed:
        with progress("sweep: recording passed rows") as report:
            written = sweep.record_passed(client, grid, cells, house, report)
        console.print(f"sweep: recorded the image IDs of {len(written)} of {len(cells)} cells", highlight=False)
        return 0
    with progress("sweep: starting") as report:
        rows = sweep.sweep(client, grid, cells, house, report)
    swept = [rows[c.name] for c in cells if c.name in rows]
    failed = [row.cell for row in swept if not row.passed]
    console.print(
        f"sweep: {len(swept) - len(failed)} of {len(cells)} cells passed; record {sweep.record_path(grid)}, "
        f"table {sweep.table_path(grid)}" + (f"; failed: {', '.join(failed)}" if failed else ""),
        highlight=False,
    )
    return 1 if failed else 0
