"""`python -m builder ci github|gitlab`: the CI workflow that fans the matrix out, one job per
buildable cell, then one promote job (templates/ci/). Like the Dockerfiles, every value the
templates receive is validated: cell names, the registry and the matrix's path."""

from __future__ import annotations

import os
from pathlib import Path

from builder.config import grammar
from builder.config.schema import DEFAULT_MATRIX
from builder.errors import UserError
from builder.plan.matrix import Matrix
from builder.render import render

SYSTEMS = ("github", "gitlab")
# GitHub's hosted runner per platform: arm64 cells build natively on GitHub's arm64 runners.
RUNNERS = {"linux/amd64": "ubuntu-24.04", "linux/arm64": "ubuntu-24.04-arm"}
CELL_TIMEOUT_MINUTES = 150  # a CUDA cell: about 3 GB of wheels, a 6 GB image, normalization and the self-test


def workflow(grid: Matrix, system: str) -> str:
    if system not in SYSTEMS:
        raise UserError(f"no CI system {system!r}: write one of {', '.join(SYSTEMS)}")
    matrix_file = _relative(grid.path)
    cells = [cell.name for cell in grid.cells]
    for name in cells:  # cell names are made of validated fields; say so here too
        if not grammar.TAG.matches(name):
            raise UserError(f"cell name {name!r} cannot go into a workflow: write {grammar.TAG.hint}")
    jobs = [{"cell": cell.name, "runner": RUNNERS[cell.platform]} for cell in grid.cells]
    by_arch: dict[str, list[str]] = {}
    for cell in grid.cells:
        by_arch.setdefault(cell.arch, []).append(cell.name)
    values = {
        "matrix_file": matrix_file,
        "matrix_option": "" if matrix_file == str(DEFAULT_MATRIX) else f"--matrix {matrix_file} ",
        "images_dir": _relative(grid.images_dir),
        "registry": grid.spec.registry,
        "cells": cells,
        "jobs": jobs,
        "by_arch": by_arch,
        "runner": RUNNERS["linux/amd64"],
        "timeout_minutes": CELL_TIMEOUT_MINUTES,
    }
    render.check_values(values, "ci")
    return render.environment().get_template(f"ci/{system}.yml.j2").render(values)


def _relative(path: Path) -> str:
    """A path inside the checkout, as the workflow (run from the checkout's root) names it."""
    text = os.path.relpath(path.resolve(), Path.cwd())
    if not grammar.RELATIVE_DIR.matches(text):
        raise UserError(f"{path} is outside this checkout; run `ci` from the root of the checkout that holds it")
    return text
