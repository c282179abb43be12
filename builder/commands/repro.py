"""`python -m builder verify-repro`: build cells twice without cache and compare, or record the image ID."""

from __future__ import annotations

import argparse

import docker
from rich.table import Table

from builder.assemble import twice
from builder.commands.common import (
    Register,
    cells_of,
    console,
    grid_of,
    progress,
)
from builder.engine import daemon
from builder.errors import UserError
from builder.plan import matrix
from builder.plan.cell import Cell
from builder.repro import recorded
from builder.terminal import table_console
from builder.wheelhouse import wheelhouse


def add(register: Register) -> None:
    repro_cmd = register(
        "verify-repro",
        "build cells twice without cache and compare image IDs and layers",
        "Needs the engine. Default: the flagship, which is about 6 GB and takes minutes per build; name a small "
        "cell (such as the CPU one) for a quick check.",
    )
    repro_cmd.add_argument("cells", nargs="*", help="cells to verify (default: the flagship)")
    repro_cmd.add_argument("--all", action="store_true", help="every buildable cell (hours)")
    repro_modes = repro_cmd.add_mutually_exclusive_group()
    repro_modes.add_argument(
        "--record",
        action="store_true",
        help="when the two builds agree, write the image ID to images/<cell>/image-id (commit it: later builds, "
        "here or on another machine, are compared with it)",
    )
    repro_modes.add_argument(
        "--once",
        action="store_true",
        help="build once without cache and compare with the recorded image ID (another machine's build is evidence)",
    )
    repro_cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    grid = grid_of(args)
    client = daemon.client()
    house = wheelhouse.Wheelhouse()
    cells = cells_of(args, grid)
    if args.once:
        return _verify_against_recorded(client, grid, cells, house)
    failed = 0
    for cell in cells:
        verdict, first_build = twice.build_twice(client, grid, cell, house, progress)
        table = Table(title=f"{cell.name}: {'reproducible' if verdict.reproducible else 'NOT reproducible'}")
        for column in ("layer", "build 1", "build 2", "same"):
            table.add_column(column)
        for index, (first, second) in enumerate(verdict.layers):
            table.add_row(str(index), first[7:19], second[7:19], "yes" if first == second else "NO")
        table_console().print(table)
        console.print(f"image ID: {verdict.first_id[7:19]} and {verdict.second_id[7:19]}")
        for index, paths in verdict.differences.items():
            console.print(f"layer {index} differs in: {', '.join(paths)}")
        failed += not verdict.reproducible
        same, said = recorded.compare(cell, verdict.first_id, first_build.build_id)
        if args.record and verdict.reproducible:
            written = recorded.write(cell, verdict.first_id, first_build.build_id, first_build.base_id)
            console.print(f"{cell.name}: recorded {verdict.first_id[7:19]} in {written}")
        else:
            console.print(f"{cell.name}: {said}")
            failed += same is False
    return 1 if failed else 0


def _verify_against_recorded(
    client: docker.DockerClient, grid: matrix.Matrix, cells: list[Cell], house: wheelhouse.Wheelhouse
) -> int:
    """One build without cache per cell, compared with its recorded image ID."""
    failed = 0
    for cell in cells:
        if recorded.read(cell) is None:
            raise UserError(
                f"{cell.name} has no recorded image ID ({recorded.path(cell)}); record one with "
                f"`python -m builder verify-repro --record {cell.name}`"
            )
        built = twice.build_once(client, grid, cell, house, progress)
        same, said = recorded.compare(cell, built.image_id, built.build_id)
        console.print(f"{cell.name}: built {built.image_id[7:19]}: {said}")
        failed += same is not True  # a record for other inputs proves nothing either way
    return 1 if failed else 0
