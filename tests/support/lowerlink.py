"""A step that hard-links a file of a lower layer (`ln /usr/bin/env /usr/local/bin/env-link`), as a
user's own RUN step may: the engine accepts it (overlayfs copies the lower file up, unchanged, and
links the new name to it), and so must the pass after the build, whichever way it reads the
engine's layers. Built on the cell's base, normalized, run, and removed."""

from __future__ import annotations

import io

import docker

from builder.assemble import build
from builder.plan.cell import Cell
from builder.plan.matrix import Matrix
from builder.repro import normalize
from builder.wheelhouse import wheelhouse

REFERENCE = "torch-images/test:lower-link"
RECORDED: dict[str, str] = {}  # cell -> the image ID the host's engine gave, for another engine to match
DOCKERFILE = """ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN ln /usr/bin/env /usr/local/bin/env-link
"""
# The two names are one file in the normalized image, with the lower file's bytes.
CHECK = (
    'test "$(stat -c %i /usr/bin/env)" = "$(stat -c %i /usr/local/bin/env-link)"'
    " && cmp /usr/bin/env /usr/local/bin/env-link && echo linked"
)


def build_and_normalize(engine: docker.DockerClient, grid: Matrix, cell: Cell) -> tuple[str, str, str]:
    """The normalized image's ID, where its layers were read from, and what running the check said."""
    base = build.cell_base(engine, grid, build.preflight(cell, grid), lambda _: None, wheelhouse.Wheelhouse())
    try:
        for chunk in engine.api.build(
            fileobj=io.BytesIO(DOCKERFILE.encode()), tag=REFERENCE, buildargs={"BASE_IMAGE": base},
            rm=True, forcerm=True, nocache=True, decode=True,
        ):  # fmt: skip
            assert "error" not in chunk, chunk["error"]
        steps = normalize.dockerfile_steps(DOCKERFILE)
        done = normalize.normalize_image(engine, REFERENCE, grid.spec.source_date_epoch, steps, base, lambda _: None)
        said = engine.containers.run(REFERENCE, ["sh", "-c", CHECK], remove=True, network_mode="none")
        return done.image_id, done.source, said.decode().strip()
    finally:
        build.remove_image(engine, REFERENCE)
