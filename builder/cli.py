"""`python -m builder ...`: a thin layer that parses flags and calls one stage each."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from builder import compat, matrix
from builder.errors import EXIT_USER_ERROR, UserError

console = Console(stderr=True)


def _matrix(args: argparse.Namespace) -> matrix.Matrix:
    return matrix.load_matrix(Path(args.matrix))


def _cells(args: argparse.Namespace, grid: matrix.Matrix) -> list:  # type: ignore[type-arg]
    if getattr(args, "all", False):
        return grid.cells
    if getattr(args, "cells", None):
        return grid.select(args.cells)
    return [grid.flagship]


def cmd_plan(args: argparse.Namespace) -> int:
    grid = _matrix(args)
    rows = [{**c.spec(), "status": "ok"} for c in grid.cells]
    rows += [{"cell": r.name, **r.selector, "status": f"rejected: {r.reason}"} for r in grid.rejected]
    if args.json:
        print(json.dumps({"cells": rows}, indent=1))
        return 0
    table = Table(title=f"{args.matrix}: {len(grid.cells)} cells, {len(grid.rejected)} rejected")
    for column in ("cell", "torch", "cuda", "cudnn", "python", "glibc", "base", "flavor", "tag", "status"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(str(row.get(k) or "") for k in ("cell", "torch", "cuda", "cudnn", "python", "glibc", "base", "flavor", "tag", "status")))
    Console(width=200).print(table)
    return 0


def cmd_compat_refresh(args: argparse.Namespace) -> int:
    spec, _ = matrix.parse(Path(args.matrix))
    versions = set(spec.axes.torch if spec.axes else []) | {s.torch for s in spec.include if s.torch}
    table = compat.TorchWheels.load().table
    for name, index in spec.indexes.items():
        links = [Path(matrix.expand_env(p)) for p in index.find_links]
        builds = compat.read_torch_builds(sorted(versions), index.url, [p for p in links if p.is_dir()])
        table[name] = {b.version: b for b in builds}
        console.print(f"{name}: {', '.join(b.version + ' (' + b.cuda + ')' for b in builds)}")
    compat.TorchWheels(table).save()
    console.print(f"wrote {compat.TORCH_WHEELS}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m builder", description=__doc__)
    parser.add_argument("--matrix", default=str(matrix.DEFAULT_MATRIX), help="matrix file (default: ./matrix.yaml)")
    commands = parser.add_subparsers(dest="command", required=True)

    plan = commands.add_parser("plan", help="list every cell with resolved versions, or why it is rejected")
    plan.add_argument("--json", action="store_true", help="print JSON instead of a table")
    plan.set_defaults(func=cmd_plan)

    compat_cmd = commands.add_parser("compat", help="compatibility data derived from the wheels' metadata")
    compat_sub = compat_cmd.add_subparsers(dest="compat_command", required=True)
    refresh = compat_sub.add_parser("refresh", help="re-read torch wheel metadata into data/torch_wheels.json")
    refresh.set_defaults(func=cmd_compat_refresh)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except UserError as error:
        console.print(f"[red]error:[/red] {error.line()}", highlight=False, soft_wrap=True)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
