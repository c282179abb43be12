"""What a test session added to the Docker engine, and removing it again."""

from __future__ import annotations

import contextlib

import docker
import docker.errors


def image_ids(client: docker.DockerClient) -> set[str]:
    return {image.id for image in client.images.list(all=True)}


def remove_added_images(client: docker.DockerClient, before: set[str]) -> None:
    """Remove every image that is not in `before`, children before their parents.

    Creation time cannot give that order: normalized images and bootstrapped bases all carry
    SOURCE_DATE_EPOCH, and the engine refuses (even forced) to remove an image another image
    was built on. So removal goes in passes until a pass removes nothing.
    """
    while True:
        added = image_ids(client) - before
        removed = 0
        for image_id in sorted(added):
            with contextlib.suppress(docker.errors.ImageNotFound, docker.errors.APIError):
                client.images.remove(image_id, force=True)
                removed += 1
        if not removed:
            return
