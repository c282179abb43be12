"""`python -m builder lock`: hash-pinned requirements and Debian pins per cell."""

from __future__ import annotations

import argparse

from builder.commands.common import (
    Register,
    console,
    grid_of,
    progress,
)
from builder.engine import daemon
from builder.errors import EXIT_USER_ERROR, UserError
from builder.lock import debian, inputs
from builder.lock import requirements as lock
from builder.plan import matrix
from builder.plan.cell import Cell


def add(register: Register) -> None:
    lock_cmd = register(
        "lock",
        "resolve hash-pinned requirements (requirements.lock, flavor.lock) and Debian pins (debian.lock)",
        "Needs the package index (PyPI or the matrix's indexes) and, for Debian pins, the engine and the distro "
        "mirror. Writes images/<cell>/. With --check: offline, needs no engine, writes nothing.",
    )
    lock_cmd.add_argument("cells", nargs="*", help="cells to lock (default: every buildable cell)")
    lock_cmd.add_argument("--all", action="store_true", help="every buildable cell (the default when none is named)")
    lock_cmd.add_argument(
        "--check",
        action="store_true",
        help="validate every line of the locks and fail when one does not match the matrix or was edited; offline",
    )
    lock_cmd.add_argument("--jobs", type=int, default=4, help="cells resolved at once (default: 4)")
    lock_cmd.add_argument("--python-only", action="store_true", help="skip the Debian pins (then no engine is needed)")
    lock_cmd.add_argument(
        "--debian-only",
        action="store_true",
        help="pin only the Debian packages, keeping the Python locks as they are (after a distro point release)",
    )
    lock_cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    grid = grid_of(args)
    cells = grid.cells if args.all or not args.cells else grid.select(args.cells)
    if args.check:
        problems = [p for cell in cells for p in inputs.read(cell, grid).problems]
        for problem in problems:
            print(problem)
        return 1 if problems else 0
    if args.debian_only and args.python_only:
        raise UserError("--debian-only and --python-only exclude each other; give one")
    return locked(grid, cells, args.jobs, args.python_only, args.debian_only)


def locked(grid: matrix.Matrix, cells: list[Cell], jobs: int, python_only: bool, debian_only: bool = False) -> int:
    failures = []
    locked = list(cells) if debian_only else []
    with progress(f"locking {len(cells)} cells, {jobs} at a time") as report:
        for cell, outcome in [] if debian_only else lock.lock_cells(cells, grid, jobs):
            if isinstance(outcome, UserError):  # one cell that cannot resolve must not stop the others
                failures.append(outcome.line())
            else:
                locked.append(cell)
                report(f"{cell.name}: {', '.join(str(p) for p in outcome)}")
    if locked and not python_only:
        with progress("pinning Debian packages (apt resolves in a container of each base)") as report:
            for cell, path in debian.lock_cells(locked, grid.spec.source_date_epoch, daemon.client()):
                report(f"{cell.name}: {path}")
    for failure in failures:
        console.print(f"error: {failure}", style="red", soft_wrap=True)
    return EXIT_USER_ERROR if failures else 0
