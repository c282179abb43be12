"""`python -m builder update`: compat refresh, then lock, then render."""

from __future__ import annotations

import argparse

from builder import confined
from builder.commands import compat, lock, render
from builder.commands.common import (
    Register,
    console,
    grid_of,
)
from builder.lock import aptindex, audit, debian
from builder.lock.debian import DEBIAN_LOCK, DebianLock


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
    update_cmd.add_argument(
        "--security",
        action="store_true",
        help="only move the packages `audit` names to their security fixes, in only the cells that have them (then "
        "render): every other pin, and every other cell's build ID, stays as it is. Debian packages only; a Python "
        "finding is listed with what to run",
    )
    update_cmd.add_argument("cells", nargs="*", help="with --security: the cells to update (default: every cell)")
    update_cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """compat refresh, lock and render, in that order: each reads what the one before wrote."""
    if args.security:
        return security_fixes(args)
    if not args.no_refresh:
        compat.run(args)
    grid = grid_of(args)  # read again: the refresh may have changed which cells can be built
    status = lock.locked(grid, grid.cells, args.jobs, args.python_only)
    return status or render.rendered(grid_of(args))


def security_fixes(args: argparse.Namespace) -> int:
    """Move exactly the Debian packages with a security fix, cell by cell, then render those cells."""
    grid = grid_of(args)
    cells = grid.select(args.cells) if args.cells else grid.cells
    indexes: dict[tuple[str, str, str, str], aptindex.Index] = {}
    changed = []
    for cell in cells:
        lock_file = cell.file(DEBIAN_LOCK)
        if not lock_file.exists():
            continue
        locked = DebianLock.read(lock_file)
        findings: list[audit.Finding] = []
        security: aptindex.Index = {}
        for mirror, suite in audit.security_sources(cell.base):
            key = (mirror, suite, cell.base.name, cell.base.arch)
            if key not in indexes:
                indexes[key] = aptindex.suite_index(cell.base, mirror, suite)
            security.update(indexes[key])
            findings += audit.debian_findings(cell, locked, indexes[key])
        if not findings:
            continue
        moved = audit.with_debian_fixes(locked, findings, security)
        confined.write_text(lock_file, moved.text(debian.fingerprint(cell)))
        changed.append(cell)
        console.print(f"{cell.name}: " + ", ".join(f"{f.package} {f.locked} -> {f.fixed}" for f in findings))
    if not changed:
        console.print(f"no security fixes for the Debian packages of {len(cells)} cells")
        return 0
    console.print(f"{len(changed)} cells moved; rendering them (their build IDs change, no other cell's does)")
    return render.rendered(grid_of(args))
