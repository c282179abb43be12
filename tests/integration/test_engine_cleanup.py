"""The session's clean-up removes images whose children it meets later, in any order."""

from __future__ import annotations

import io
import tarfile

import docker
import docker.errors
import pytest

from tests import engine_state

pytestmark = pytest.mark.integration  # it builds on the engine: `-m "not integration"` leaves it out


def _context(dockerfile: str) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        payload = tarfile.TarInfo("payload")
        tar.addfile(payload, io.BytesIO(b""))
    buffer.seek(0)
    return buffer


def _build(client: docker.DockerClient, dockerfile: str, tag: str) -> str:
    image, _ = client.images.build(fileobj=_context(dockerfile), custom_context=True, tag=tag, rm=True)
    return str(image.id)


def test_clean_up_removes_a_parent_the_engine_refuses_to_remove_first(client: docker.DockerClient) -> None:
    before = engine_state.image_ids(client)
    parent = _build(client, "FROM scratch\nCOPY payload /parent\n", "torch-images-test/parent:cleanup")
    child = _build(
        client, "FROM torch-images-test/parent:cleanup\nCOPY payload /child\n", "torch-images-test/child:cleanup"
    )
    with pytest.raises(docker.errors.APIError):
        client.images.remove(parent, force=True)  # the order creation time gave for equal timestamps

    engine_state.remove_added_images(client, before)

    left = engine_state.image_ids(client) - before
    assert parent not in left and child not in left
    assert not left
