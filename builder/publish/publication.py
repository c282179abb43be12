"""One cell's image on its way to the registry: what publish, staging and multiarch hand each
other (its own module, so that none of them imports another for it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from builder.plan.cell import Cell


def tag_suffix(compression: str) -> str:
    """What the tags of one form of an image add: nothing for gzip, `-zstd` for the zstd form."""
    return "" if compression == "gzip" else f"-{compression}"


@dataclass
class Publication:
    cell: Cell
    image_id: str
    report: dict[str, Any]  # the passing self-test the gate read (the build machine's)
    build_id: str = ""  # the image's io.torch-images.build-id label: a content hash of its inputs
    digest: str = ""
    unchanged: bool = False
    moved_aliases: list[str] = field(default_factory=list)
    attached: list[str] = field(default_factory=list)  # artifacts this run attached (sbom, selftest)
    staging_tag: str = ""  # pushed under this tag instead of the versioned one (publish stage)
    image_tag: str = ""  # `<tag>-<arch>` when the versioned tag is a multi-arch index (multiarch.py)
    tag_digest: str = ""  # what the versioned tag points at, when not the image itself: the index
    gpu_report: dict[str, Any] | None = None  # the passing GPU self-test a CUDA cell's gate read
    # "zstd": the same image (the same config, so the same image ID) with zstd layers, under tags
    # of its own (`<tag>-zstd`): one index cannot offer both compressions for one platform.
    compression: str = "gzip"

    @property
    def suffix(self) -> str:
        return tag_suffix(self.compression)

    @property
    def tag(self) -> str:
        """The versioned tag this form of the image goes under."""
        return self.cell.tag + self.suffix

    @property
    def aliases(self) -> tuple[str, ...]:
        return tuple(alias + self.suffix for alias in self.cell.aliases)

    @property
    def record_name(self) -> str:
        """published/<this>.json: one record per cell and compression."""
        return self.cell.name + (f".{self.compression}" if self.suffix else "")

    @property
    def target(self) -> str:
        """The tag this run pushes the image under."""
        return self.staging_tag or self.image_tag or self.cell.tag

    @property
    def points_to(self) -> str:
        """The digest the versioned tag and the aliases name: the image's, or its index's."""
        return self.tag_digest or self.digest
