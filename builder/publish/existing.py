"""`build --skip-existing`: is a cell's build already in the registry? Its versioned tag's image
config carries the build ID label (a content hash of every input), so two small reads answer
it without the image."""

from __future__ import annotations

import json

from builder.assemble.build import BUILD_ID_LABEL
from builder.config import grammar
from builder.oci.registry import INDEX_TYPES, Registry, json_object
from builder.plan.cell import Cell
from builder.plan.matrix import Matrix
from builder.publish import multiarch


def published_build_id(registry: Registry, repository: str, tag: str, arch: str = "amd64") -> str | None:
    """The build ID label of the image under `tag`, or None when there is none. For a
    multi-platform index, that of its image for `arch`."""
    manifest = registry.manifest(repository, tag)
    if manifest is None:
        return None
    document = json.loads(manifest.body)
    if manifest.media_type in INDEX_TYPES:
        entry = next(
            (m for m in document.get("manifests", []) if m.get("platform", {}).get("architecture") == arch), None
        )
        image = registry.manifest(repository, entry["digest"]) if entry else None
        if image is None:
            return None
        document = json.loads(image.body)
    config = json_object(registry.blob(repository, document["config"]["digest"]), f"the image config of {tag}")
    labels = config.get("config", {}).get("Labels") if isinstance(config.get("config"), dict) else None
    label = labels.get(BUILD_ID_LABEL) if isinstance(labels, dict) else None
    return label if isinstance(label, str) and grammar.BUILD_ID.matches(label) else None


def is_published(registry: Registry, grid: Matrix, cell: Cell, build_id: str) -> bool:
    return published_build_id(registry, grid.spec.repository, multiarch.image_tag(grid, cell), cell.arch) == build_id
