"""`python -m builder update`: compat refresh, then lock, then render."""

from __future__ import annotations

import argparse

from builder.commands import compat, lock, render
from builder.commands.common import (
    Register,
    grid_of,
)


def add(register: Register) -> None:
    update_cmd = register(
        "update",
        "regenerate everything generated from the matrix: compat refresh, then lock, then render",
        "The one command to run after editing matrix.yaml, data/flavors.yaml or templates/; commit what it "
        "changes (CI's `render --check` and `lock --check` fail until you do). Needs the package indexes, and "
        "for Debian pins the engine and the distro mirror.",
    )
    update_cmd.add_argument(
        "--no-refresh",
        action="store_true",
        help="keep data/torch_wheels.json and data/trtllm.json as they are (default: re-read them first)",
    )
    update_cmd.add_argument("--jobs", type=int, default=4, help="cells resolved at once (default: 4)")
    update_cmd.add_argument(
        "--python-only", action="store_true", help="skip the Debian pins (then no engine is needed)"
    )
    update_cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """compat refresh, lock and render, in that order: each reads what the one before wrote."""
    if not args.no_refresh:
        compat.run(args)
    grid = grid_of(args)  # read again: the refresh may have changed which cells can be built
    status = lock.locked(grid, grid.cells, args.jobs, args.python_only)
    return status or render.rendered(grid_of(args))
