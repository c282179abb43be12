"""A build that fails leaves nothing behind: no image under the cell's tag (the engine's image
that the pass after the build failed on is not the product: nothing checked it) and none of the
engine's steps."""

from __future__ import annotations

import docker
import pytest

from builder.assemble import build
from builder.errors import UserError
from builder.wheelhouse import wheelhouse
from tests.integration.conftest import BuiltCell

pytestmark = pytest.mark.integration

REFERENCE = "torch-images/test:failed-pass"


def _all_images(client: docker.DockerClient) -> set[str]:
    return {image.id for image in client.images.list(all=True)}


def test_a_build_whose_pass_after_the_build_fails_leaves_no_tag_and_no_steps(
    built: BuiltCell, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = built.client
    before = _all_images(client)

    def refuse(*_: object, **__: object) -> None:
        raise UserError("layer entry x links to y, a file the layers below hold already")

    monkeypatch.setattr(build.repro, "normalize_image", refuse)
    locks = build.preflight(built.cell, built.grid)
    result = build.build_cell(
        client,
        built.grid,
        locks,
        wheelhouse.Wheelhouse(),
        print,
        build.BuildOptions(no_cache=True, reference=REFERENCE),
    )
    assert result.state == build.BuildState.FAILED and "links to y" in result.detail
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(REFERENCE)
    assert result.intermediate  # the steps, handed to the run's cleanup
    build.discard_intermediates(client, [result])
    assert _all_images(client) <= before
