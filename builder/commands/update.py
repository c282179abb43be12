"""`python -m builder update`: compat refresh, then lock, then render."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from builder import confined
from builder.commands import compat, lock, render
from builder.commands.common import (
    Register,
    console,
    grid_of,
)
from builder.config import schema
from builder.errors import UserError
from builder.lock import audit, upstream


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
        "render): every other pin, and every other cell's build ID, stays as it is. Debian packages, and with --osv "
        "Python ones (a package torch pins exactly is listed: it needs a new torch)",
    )
    update_cmd.add_argument(
        "--releases",
        action="store_true",
        help="propose what upstream released that the matrix's `follow:` key asks for: torch versions into "
        "axes.torch (matrix.yaml edited, then the new cells locked and rendered; no other cell's lock moves), new "
        "Debian stable and Ubuntu LTS bases in the text only. Needs PyPI and the distros' archives",
    )
    update_cmd.add_argument(
        "--markdown",
        action="store_true",
        help="with --releases: also print the proposal as markdown on stdout (a pull request's text)",
    )
    update_cmd.add_argument(
        "--dry-run", action="store_true", help="with --releases: say what would change, and write nothing"
    )
    update_cmd.add_argument("cells", nargs="*", help="with --security: the cells to update (default: every cell)")
    update_cmd.add_argument(
        "--osv", type=Path, metavar="DIR", help="with --security: also move the Python packages these OSV records name"
    )
    update_cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """compat refresh, lock and render, in that order: each reads what the one before wrote."""
    if args.security and args.releases:
        raise UserError("update: --security and --releases are two jobs; run one, then the other")
    if args.security:
        return security_fixes(args)
    if args.releases:
        return new_releases(args)
    if args.markdown or args.dry_run:
        raise UserError("update: --markdown and --dry-run go with --releases (update --releases --dry-run)")
    if args.cells or args.osv:  # without --security they would be ignored while every cell is locked again
        given = " ".join([*args.cells, *(["--osv " + str(args.osv)] if args.osv else [])])
        raise UserError(
            f"update {given}: cells and --osv go with --security (update --security {given}); a plain update "
            "refreshes the facts and locks every cell, which `python -m builder lock CELL` does for one"
        )
    if not args.no_refresh:
        compat.run(args)
    grid = grid_of(args)  # read again: the refresh may have changed which cells can be built
    status = lock.locked(grid, grid.cells, args.jobs, args.python_only)
    return status or render.rendered(grid_of(args))


def security_fixes(args: argparse.Namespace) -> int:
    """Move exactly the packages with a security fix, cell by cell, then render those cells."""
    grid = grid_of(args)
    cells = grid.select(args.cells) if args.cells else grid.cells
    advisories = audit.read_osv(args.osv, _warn) if args.osv else []
    changed = audit.apply_fixes(grid, cells, advisories, console.print)
    if not changed:
        console.print(f"no security fixes to move in {len(cells)} cells")
        return 0
    console.print(f"{len(changed)} cells moved; rendering them (their build IDs change, no other cell's does)")
    return render.rendered(grid_of(args))


def new_releases(args: argparse.Namespace) -> int:
    """Propose what the matrix's `follow:` policy asks of upstream's releases; unless a dry run,
    write the edited matrix, then refresh the facts and lock and render exactly the new cells."""
    path = Path(args.matrix)
    if args.cells or args.osv:
        raise UserError("update --releases takes no cells or --osv: it reads the matrix's `follow:` key")
    spec, _ = schema.parse(path)
    if spec.follow is None:
        console.print(f"{path} has no `follow:` key: no upstream release is proposed (docs/keeping-current.md)",
                      soft_wrap=True)  # fmt: skip
        if args.markdown:
            print(upstream.Proposal().markdown(), end="")
        return 0
    proposal = upstream.propose(path, spec)
    for line in proposal.lines() or ["no new upstream release that `follow:` asks for"]:
        console.print(line, highlight=False, soft_wrap=True)
    if args.markdown:
        print(proposal.markdown(), end="")
    if proposal.matrix_text is None:
        return 0
    if args.dry_run:
        console.print(f"dry run: {path} and everything generated from it unchanged", soft_wrap=True)
        return 0
    confined.write_text(path, proposal.matrix_text)
    count = len(proposal.new_cells)
    console.print(f"wrote {path}; refreshing the facts, then locking and rendering the {count} new cells")
    compat.run(args)
    grid = grid_of(args)
    names = {cell.name for cell in proposal.new_cells}
    status = lock.locked(grid, [cell for cell in grid.cells if cell.name in names], args.jobs, args.python_only)
    return status or render.rendered(grid_of(args))


def _warn(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr)
