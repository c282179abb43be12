"""`python -m builder size`: a built image's layers and what fills them."""

from __future__ import annotations

import argparse

import docker
from rich.table import Table

from builder.assemble import build, size
from builder.commands.common import (
    Register,
    grid_of,
    progress,
)
from builder.engine import daemon
from builder.errors import UserError
from builder.terminal import table_console


def add(register: Register) -> None:
    size_cmd = register(
        "size",
        "a built image's layers: each one's size, the step that wrote it, and the largest packages inside",
        "Needs the engine and the built image; reads it once through `docker save`. Sizes are uncompressed.",
    )
    size_cmd.add_argument("target", nargs="?", help="a cell name or an image reference (default: the flagship)")
    size_cmd.add_argument("--top", type=int, default=5, help="packages or folders listed per layer (default: 5)")
    size_cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    client = daemon.client()
    grid = grid_of(args)
    target = args.target or grid.flagship.name
    reference = (
        target if ":" in target or target.startswith("sha256:") else build.local_reference(grid, grid.cell(target))
    )
    try:
        image_id = client.images.get(reference).id
    except docker.errors.ImageNotFound:
        raise UserError(
            f"no image {reference} in the engine; build it first (`python -m builder build {target}`)"
        ) from None
    with progress(f"{reference}: reading its layers"):
        layers = size.layers(client, image_id)
    table = Table(title=f"{reference}: {size.human(sum(layer.size for layer in layers))} uncompressed")
    for column in ("layer", "size", "step", "largest inside"):
        table.add_column(column)
    for layer in layers:
        largest = "\n".join(f"{size.human(b):>9}  {name}" for name, b in layer.largest(args.top))
        table.add_row(str(layer.index), size.human(layer.size), layer.step[:60], largest)
    table_console().print(table)
    return 0
