"""The same cell built with BuildKit through the docker CLI, where one offers it."""

from __future__ import annotations

import pytest

from builder.assemble import backends, build, context, wheelhouse
from tests.integration.conftest import BuiltCell

pytestmark = pytest.mark.integration
BUILDKIT_COMMENT = "buildkit.dockerfile.v0"  # what BuildKit's Dockerfile frontend writes into image history


def _history_comments(built: BuiltCell, image_id: str) -> set[str]:
    return {entry.get("Comment", "") for entry in built.client.api.history(image_id)}


def test_buildkit_builds_the_cell_and_its_torch_runs(built: BuiltCell) -> None:
    if backends.buildkit_command() is None:
        pytest.skip("no docker CLI here runs BuildKit builds (Debian's docker.io 20.10 CLI, or one with buildx)")
    reference = f"{built.reference}-buildkit"
    grid, cell = built.grid, built.cell
    result = build.build_cell(
        built.client,
        grid,
        build.preflight(cell, grid),
        wheelhouse.Wheelhouse(),
        print,
        backend="buildkit",
        reference=reference,
    )
    try:
        assert result.status == "built", result.detail
        # Which builder ran, from the image itself: BuildKit marks every step it ran; the
        # classic builder (the cell the other tests use) marks none.
        assert BUILDKIT_COMMENT in _history_comments(built, result.image_id)
        assert BUILDKIT_COMMENT not in _history_comments(built, built.image_id)
        program = "import torch; print(torch.compile(lambda x: x * 3)(torch.ones(2)).sum().item())"
        output = built.client.containers.run(
            result.image_id, ["python", "-c", program], remove=True, network_mode="none"
        )
        assert output.decode().strip().splitlines()[-1] == "6.0"
        labels = built.client.images.get(result.image_id).labels
        assert labels["io.torch-images.torch"] == cell.torch.version
        assert (
            labels[build.BUILD_ID_LABEL]
            == result.build_id
            != context.build_id(
                cell,
                built.client.images.get(build.cell_base(built.client, grid, build.preflight(cell, grid), print)).id,
                "sdk",
            )
        )
    finally:
        build.remove_image(built.client, reference)
        build.discard_intermediates(built.client, [result])
