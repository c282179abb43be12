"""One image ID on every engine: the sha256 of the image's config bytes.

Docker's own image store names an image by its config's digest. The containerd image store (the
default of Docker 29) names it by its manifest's digest, which depends on how the engine packed
the layers. Everything the builder records, compares or reports (image-id files, self-test
reports, publish's unchanged check, verify) uses the config digest; this module finds it for an
image in any engine. The builder writes every config it loads, so it remembers each one's digest
by the engine's ID; an image it did not load is read back once through `docker save`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import docker
import docker.errors

from builder import paths
from builder.engine import archive


def _mapping_file() -> Path:
    return paths.cache_dir("layers") / "config-digests.json"


def _mapping() -> dict[str, str]:
    path = _mapping_file()
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def remember(engine_id: str, config: bytes) -> str:
    """Note the config digest of an image the builder loaded; returns it."""
    digest = "sha256:" + hashlib.sha256(config).hexdigest()
    if engine_id != digest:
        mapping = _mapping()
        mapping[engine_id] = digest
        temporary = _mapping_file().with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(mapping, indent=1, sort_keys=True))
        os.replace(temporary, _mapping_file())
    return digest


def engine_names_by_config(attrs: dict[str, object]) -> bool:
    """Whether the engine's ID of an image is its config digest: Docker's own image store. The
    containerd store's inspect answer carries the manifest's descriptor."""
    return "Descriptor" not in attrs


def config_digest(engine: docker.DockerClient, reference: str) -> str:
    """The image's config digest, whichever image store the engine has."""
    attrs = engine.api.inspect_image(reference)
    engine_id = str(attrs["Id"])
    if engine_names_by_config(attrs):
        return engine_id
    known = _mapping().get(engine_id)
    if known:
        return known
    return remember(engine_id, archive.saved_config(engine, engine_id))


def engine_id(engine: docker.DockerClient, image_id: str) -> str:
    """The engine's own ID of the image whose config digest is `image_id`, to hand back to the
    engine (run, tag, inspect); `image_id` itself where the engine names images by config."""
    try:
        if engine_names_by_config(engine.api.inspect_image(image_id)):
            return image_id
    except docker.errors.NotFound:
        pass
    for candidate, digest in _mapping().items():
        if digest == image_id:
            try:
                engine.api.inspect_image(candidate)
                return candidate
            except docker.errors.NotFound:
                continue
    return image_id
