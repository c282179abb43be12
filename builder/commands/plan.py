"""`python -m builder plan`: list every cell of the matrix with resolved versions, or why it is rejected."""

from __future__ import annotations

import argparse
import json

from rich.table import Table

from builder.commands.common import (
    NEEDS_NOTHING,
    Register,
    console,
    grid_of,
)
from builder.facts import compat
from builder.plan import offers
from builder.terminal import table_console


def add(register: Register) -> None:
    plan = register(
        "plan", "list every cell with resolved versions, or why it is rejected", NEEDS_NOTHING + " Reads data/."
    )
    plan.add_argument("--json", action="store_true", help="print JSON (for CI matrices) instead of a table")
    plan.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    grid = grid_of(args)
    rows = [{**c.spec(), "status": "ok"} for c in grid.cells]
    rows += [{"cell": r.name, **r.selector, "status": f"rejected: {r.reason}"} for r in grid.rejected]
    trtllm = offers.trtllm_offers(grid, compat.load_trtllm_table()) if grid.spec.uses_flavor("trtllm") else None
    if args.json:
        print(json.dumps({"cells": rows, **({"trtllm": trtllm} if trtllm else {})}, indent=1))
        return 0
    table = Table(title=f"{args.matrix}: {len(grid.cells)} cells, {len(grid.rejected)} rejected")
    columns = ("cell", "torch", "cuda", "cudnn", "python", "glibc", "base", "flavor", "platform", "tag", "status")
    for column in columns:  # names whole, so they can be copied; long reasons fold instead
        table.add_column(column, no_wrap=column in ("cell", "tag", "platform"), overflow="fold")
    for row in rows:
        table.add_row(*(str(row.get(k) or "") for k in columns))
    table_console().print(table)
    for line in offers.describe(trtllm) if trtllm else []:
        console.print(line, highlight=False, soft_wrap=True)
    return 0
