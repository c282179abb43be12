"""Two builds of a cell compared: image ID, then layer by layer, naming the paths that differ."""

from __future__ import annotations

from dataclasses import dataclass

import docker

from builder.engine import ids
from builder.repro import manifests


@dataclass
class Verdict:
    cell: str
    first_id: str
    second_id: str
    layers: list[tuple[str, str]]  # (first build's diff_id, second's), layer by layer
    differences: dict[int, list[str]]  # layer index -> differing paths

    @property
    def reproducible(self) -> bool:
        return self.first_id == self.second_id


def compare(engine: docker.DockerClient, cell: str, first_id: str, second_id: str) -> Verdict:
    first_reference, second_reference = ids.engine_id(engine, first_id), ids.engine_id(engine, second_id)
    first = engine.images.get(first_reference).attrs["RootFS"]["Layers"]
    second = engine.images.get(second_reference).attrs["RootFS"]["Layers"]
    pairs = [(a, b) for a, b in zip(first, second, strict=False)]
    if any(a != b for a, b in pairs):  # name the differing paths: manifests of both images
        manifests.record_manifests(engine, first_reference)
        manifests.record_manifests(engine, second_reference)
    differences = {i: manifests.differing_paths(a, b) for i, (a, b) in enumerate(pairs) if a != b}
    if len(first) != len(second):
        differences[len(pairs)] = [f"layer count differs: {len(first)} against {len(second)}"]
    return Verdict(cell, first_id, second_id, pairs, differences)
