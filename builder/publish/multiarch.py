"""Multi-arch tags: cells that differ only in platform share their versioned tag and aliases.

Each platform's image is pushed under its own tag (`<tag>-<arch>`: the engine pushes by tag),
its SBOM and self-test report attached to its digest. Only when every platform's image is in
the registry does the versioned tag become an OCI image index listing them by digest, so that
`docker pull TAG` picks the puller's architecture; the aliases then move to that index. A tag
with one platform stays a plain image manifest, as before.
"""

from __future__ import annotations

from collections.abc import Iterable

from builder.config import platform as platforms
from builder.digests import canonical_json
from builder.errors import UserError
from builder.oci.registry import OCI_INDEX, Manifest, Registry
from builder.plan.cell import Cell
from builder.plan.matrix import Matrix
from builder.publish import tags
from builder.publish.publication import Publication
from builder.steps import Report


def is_multiarch(grid: Matrix, cell: Cell) -> bool:
    return len(grid.platforms_of(cell)) > 1


def image_tag(grid: Matrix, cell: Cell, compression: str = "gzip") -> str:
    """The cell's own image tag (Matrix.image_tag), held to the registries' limit: never cut."""
    return tags.exact(grid.image_tag(cell, compression), "the platform's tag", "shorten the tag template")


def check_complete(grid: Matrix, cells: Iterable[Cell], verb: str = "publish") -> None:
    """A multi-arch tag is pushed only with every platform's image: refuse, before anything is
    pushed, a selection that names some of a tag's platforms but not all."""
    chosen = {cell.name for cell in cells}
    for cell in cells:
        missing = [c.name for c in grid.platforms_of(cell) if c.name not in chosen]
        if missing:
            listed = ", ".join(c.platform for c in grid.platforms_of(cell))
            raise UserError(
                f"{cell.tag} is one tag for {listed}: {verb} {cell.name} together with {' '.join(missing)}; "
                "nothing pushed"
            )


def index_of(tag: str, images: list[tuple[Cell, Manifest]]) -> Manifest:
    """The OCI image index listing each platform's image manifest by digest, serialized the same
    way every time (so the same images give the same index digest)."""
    entries = []
    for cell, manifest in images:
        entries.append(
            {
                "mediaType": manifest.media_type,
                "digest": manifest.digest,
                "size": len(manifest.body),
                "platform": platforms.of(cell.platform).descriptor(),
            }
        )
    document = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": entries,
        "annotations": {"org.opencontainers.image.ref.name": tag},
    }
    return Manifest.of(canonical_json(document), OCI_INDEX)


def push_indexes(registry: Registry, grid: Matrix, items: list[Publication], report: Report) -> None:
    """Put each multi-arch tag's index once every platform's image is in the registry, and
    record on each item what its versioned tag points at."""
    repository = grid.spec.repository
    groups: dict[str, list[Publication]] = {}
    for item in items:
        if is_multiarch(grid, item.cell):
            groups.setdefault(item.tag, []).append(item)
    for tag, group in groups.items():
        group.sort(key=lambda item: platforms.NAMES.index(item.cell.platform))
        images = []
        for item in group:
            manifest = registry.manifest(repository, item.digest)
            if manifest is None:
                raise UserError(f"{repository}@{item.digest} is not in {registry.host}; the index for {tag} not pushed")
            images.append((item.cell, manifest))
        index = index_of(tag, images)
        current = registry.manifest(repository, tag)
        if current is None or current.digest != index.digest:
            registry.put_manifest(repository, tag, index)
            report(f"{tag} -> index {index.digest[:19]} ({', '.join(item.cell.platform for item in group)})")
            for item in group:
                item.unchanged = False
        for item in group:
            item.tag_digest = index.digest
