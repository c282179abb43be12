"""Per-layer file manifests (path, type, mode, size, sha256), kept in the cache to name the
paths that differ between two builds."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import IO, Any

import docker

from builder import paths
from builder.engine import archive
from builder.repro.layers import file_manifest


def cache_dir() -> Path:
    return paths.cache_dir("layers")


def save_manifest(diff_id: str, files: list[list[Any]]) -> None:
    _manifest_path(diff_id).write_text(json.dumps(files))


def record_manifests(engine: docker.DockerClient, reference: str) -> None:
    """Write the file manifest of every layer of an image that has none yet (for verify-repro)."""
    wanted = [d for d in engine.images.get(reference).attrs["RootFS"]["Layers"] if layer_manifest(d) is None]
    if not wanted:
        return

    def read(_: str, __: int, handle: IO[bytes]) -> tuple[str, list[list[Any]]]:
        digest = hashlib.sha256()
        source = io.BufferedReader(archive.Tee(handle, digest.update), buffer_size=1 << 20)
        rows = file_manifest(source)
        archive.read_to_end(source)
        return "sha256:" + digest.hexdigest(), rows

    _, layers = archive.scan_saved(engine, reference, read)
    for diff_id, rows in layers:
        if diff_id in wanted:
            save_manifest(diff_id, rows)


def _manifest_path(diff_id: str) -> Path:
    # `.files2`: rows with the owner as a sixth column; a cache of the five-column form is not read.
    return cache_dir() / f"{diff_id.removeprefix('sha256:')}.files2.json"


def layer_manifest(diff_id: str) -> list[list[Any]] | None:
    path = _manifest_path(diff_id)
    return json.loads(path.read_text()) if path.exists() else None


def differing_paths(first: str, second: str, limit: int = 20) -> list[str]:
    """Paths whose entries differ between two normalized layers (by their manifests)."""
    a, b = layer_manifest(first), layer_manifest(second)
    if a is None or b is None:
        return ["(no manifest recorded for one of the layers)"]
    left = {row[0]: row[1:] for row in a}
    right = {row[0]: row[1:] for row in b}
    names = sorted(n for n in set(left) | set(right) if left.get(n) != right.get(n))
    return names[:limit] + ([f"... and {len(names) - limit} more"] if len(names) > limit else [])
