"""`python -m builder smoke`: the in-image self-test on cells or images."""

from __future__ import annotations

import argparse

from builder.assemble import build, smoke
from builder.commands.common import (
    Register,
    console,
    grid_of,
    progress,
)
from builder.engine import daemon


def add(register: Register) -> None:
    smoke_cmd = register(
        "smoke",
        "run the in-image self-test on cells or images",
        "Needs the engine; passes every GPU when the engine has the NVIDIA runtime. The report is kept in the "
        "cache under the image ID; publish requires a passing one.",
    )
    smoke_cmd.add_argument("targets", nargs="*", help="cell names or image references (default: the flagship)")
    smoke_cmd.add_argument("--cpu", action="store_true", help="do not pass GPUs to the container")
    smoke_cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    client = daemon.client()
    references = args.targets
    if not references:
        grid = grid_of(args)
        references = [build.local_reference(grid, grid.flagship)]
    elif any(not (":" in t or t.startswith("sha256")) for t in references):
        grid = grid_of(args)
        references = [t if ":" in t else build.local_reference(grid, grid.cell(t)) for t in references]
    failed = 0
    for reference in references:
        with progress(f"{reference}: running the self-test"):
            verdict = smoke.run(client, reference, gpus=None if not args.cpu else False)
        print(verdict.report.get("table", ""), end="")
        console.print(f"{reference}: self-test {verdict.status} ({verdict.summary}); report: {verdict.path}")
        failed += verdict.status != "pass"
    return 1 if failed else 0
