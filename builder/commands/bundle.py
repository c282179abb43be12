"""`python -m builder bundle`: gather a cell's offline rebuild kit."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from builder.assemble import bundle, size
from builder.commands.common import (
    Register,
    console,
    grid_of,
    progress,
)
from builder.wheelhouse import wheelhouse


def add(register: Register) -> None:
    bundle_cmd = register(
        "bundle",
        "gather everything one cell's rebuild needs into a folder: matrix, locks, templates, self-test, wheels, "
        ".debs, with a manifest of sha256s",
        "Reads the cache (fetching what is missing: the index and the mirror when online). No engine needed. "
        "Rebuild with `build --offline --bundle DIR`, with no index, mirror or registry.",
    )
    bundle_cmd.add_argument("cell", help="the cell to bundle")
    bundle_cmd.add_argument("--output", required=True, type=Path, help="a new or empty folder")
    bundle_cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    grid = grid_of(args)
    cell = grid.cell(args.cell)
    started = time.monotonic()
    with progress(f"{cell.name}: bundling into {args.output}") as report:
        made = bundle.gather(grid, cell, args.output, wheelhouse.Wheelhouse(report=report), report)
    total = sum((made.root / name).stat().st_size for name in made.files)
    console.print(
        f"{cell.name}: bundled {len(made.files)} files ({size.human(total)}) into {made.root} in "
        f"{time.monotonic() - started:.0f} s; rebuild with "
        f"`python -m builder build --offline --bundle {made.root}`"
    )
    return 0
