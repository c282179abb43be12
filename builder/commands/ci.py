"""`python -m builder ci`: print a CI workflow for the matrix."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from builder import confined
from builder.commands.common import (
    NEEDS_NOTHING,
    Register,
    console,
    grid_of,
    registry_option,
)
from builder.errors import UserError
from builder.render import ci


def add(register: Register) -> None:
    ci_cmd = register(
        "ci",
        "print a CI workflow: a job per cell (build, self-test, stage), a GPU stage per CUDA cell, then one "
        "promote job; or, with --schedule, the daily security (and releases) jobs",
        NEEDS_NOTHING + " Reads the plan; the jobs run the same nox sessions a user runs.",
    )
    ci_cmd.add_argument("system", choices=ci.SYSTEMS, help="github (Actions) or gitlab (GitLab CI)")
    ci_cmd.add_argument(
        "cells",
        nargs="*",
        help="the cells to make jobs of (default: every cell but those the matrix's ci.exclude selects, which are "
        "jobs only when named); options go before the system or after the cells (argparse gives cells nothing "
        "that come after an option)",
    )
    ci_cmd.add_argument(
        "--registry",
        type=registry_option,
        metavar="REF",
        help="publish there: REGISTRY[/REPOSITORY], such as harbor.example.com/ml/torch (login: secrets "
        "REGISTRY_USER and REGISTRY_PASSWORD; ghcr.io uses the workflow's GITHUB_TOKEN). Default: GHCR under the "
        "repository's owner (github), the project's own registry (gitlab)",
    )
    ci_cmd.add_argument(
        "--schedule",
        action="store_true",
        help="print the daily security workflow instead: audit and update --security in a job with no write token, "
        "and a job that runs none of it opens a pull (merge) request when a lock moved; with the matrix's follow: key, "
        "the same pair for update --releases (GitHub: .github/workflows/torch-images-security.yml; GitLab: "
        ".gitlab/torch-images-security.yml, which the fan-out includes)",
    )
    ci_cmd.add_argument("--output", metavar="FILE", help="write the workflow there (default: standard output)")
    ci_cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    grid = grid_of(args)
    text = (
        ci.schedule(grid, args.system) if args.schedule else ci.workflow(grid, args.system, args.registry, args.cells)
    )
    if args.output:
        output = Path(args.output)
        try:  # .github/workflows/ does not exist in a fresh checkout
            output.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UserError(f"--output {output}: cannot make its folder ({error.strerror})") from None
        confined.write_text(output, text)
        console.print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0
