"""The same cell built with BuildKit through the docker CLI, where one offers it."""

from __future__ import annotations

import pytest

from builder.assemble import backends, build
from builder.wheelhouse import wheelhouse
from tests.integration.conftest import BuiltCell

pytestmark = pytest.mark.integration
BUILDKIT_COMMENT = "buildkit.dockerfile.v0"  # what BuildKit's Dockerfile frontend writes into image history


def _history_comments(built: BuiltCell, image: str) -> set[str]:
    return {entry.get("Comment", "") for entry in built.client.api.history(image)}


def test_buildkit_builds_the_same_image_as_the_classic_builder(built: BuiltCell) -> None:
    """The builder owns the image's bytes and history: which builder ran the steps is not in them."""
    if isinstance(backends.buildkit_command(built.client), str):
        pytest.skip(str(backends.buildkit_command(built.client)))
    reference = f"{built.reference}-buildkit"
    grid, cell = built.grid, built.cell
    result = build.build_cell(
        built.client,
        grid,
        build.preflight(cell, grid),
        wheelhouse.Wheelhouse(),
        print,
        build.BuildOptions(no_cache=True, backend="buildkit", reference=reference),
    )
    try:
        assert result.status == "built", result.detail
        # Which builder ran, from the engine's image before normalization: BuildKit marks every
        # step it ran; the canonical image carries the builder's own history instead.
        assert result.intermediate and BUILDKIT_COMMENT in _history_comments(built, result.intermediate)
        assert BUILDKIT_COMMENT not in _history_comments(built, reference)
        assert result.image_id == built.image_id
        assert result.build_id == built.build_id
        program = "import torch; print(torch.compile(lambda x: x * 3)(torch.ones(2)).sum().item())"
        output = built.client.containers.run(reference, ["python", "-c", program], remove=True, network_mode="none")
        assert output.decode().strip().splitlines()[-1] == "6.0"
    finally:
        build.remove_image(built.client, reference)
        build.discard_intermediates(built.client, [result])
