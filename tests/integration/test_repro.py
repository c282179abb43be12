"""Reproducibility on the real engine: same inputs, same image ID."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from builder.assemble import build
from builder.engine import archive, bases, ids
from builder.repro import normalize, verify
from builder.wheelhouse import wheelhouse
from tests.integration.conftest import BuiltCell

pytestmark = pytest.mark.integration


def test_bootstrapping_the_base_twice_gives_the_same_image_id(built: BuiltCell) -> None:
    twin = dataclasses.replace(built.cell.base, name=f"{built.cell.base.name}-repro-test")
    epoch = built.grid.spec.source_date_epoch
    try:
        first = bases.bootstrap(built.client, twin, epoch, lambda _: None)
        built.client.images.remove(twin.local_tag, force=True)
        second = bases.bootstrap(built.client, twin, epoch, lambda _: None)
        assert first == second == ids.config_digest(built.client, twin.local_tag)
        assert built.client.images.get(twin.local_tag).attrs["Created"].startswith("2024-12-02T00:00:00")
    finally:
        build.remove_image(built.client, twin.local_tag)


def layers(built: BuiltCell, image: str) -> list[str]:
    return list(built.client.images.get(image).attrs["RootFS"]["Layers"])


def test_a_rebuild_without_cache_normalizes_to_the_same_image_and_layers(built: BuiltCell) -> None:
    house = wheelhouse.Wheelhouse()
    locks = build.preflight(built.cell, built.grid)
    again = build.build_cell(
        built.client, built.grid, locks, house, print, build.BuildOptions(no_cache=True, normalize=False)
    )
    assert again.status == "built", again.detail
    raw_layers = layers(built, again.reference)
    base = build.cell_base(built.client, built.grid, locks, print)
    steps = normalize.dockerfile_steps(built.cell.file("Dockerfile").read_text())
    epoch = built.grid.spec.source_date_epoch
    done = normalize.normalize_image(built.client, again.reference, epoch, steps, base, print)
    verdict = verify.compare(built.client, built.cell.name, built.image_id, done.image_id)
    assert verdict.differences == {} and verdict.reproducible
    assert built.client.images.get(again.reference).attrs["Created"].startswith("2024-12-02T00:00:00")
    # The engine's layers are rewritten in the canonical encoding: the base's (the builder's own
    # already) stays, every layer a step wrote changes its bytes, never its files.
    canonical_layers = layers(built, again.reference)
    assert canonical_layers[0] == raw_layers[0] and len(canonical_layers) == len(raw_layers)
    assert all(a != b for a, b in zip(canonical_layers[1:], raw_layers[1:], strict=True))


def test_the_image_id_is_the_digest_of_the_config_the_engine_gives_back(built: BuiltCell) -> None:
    config = archive.saved_config(built.client, built.reference)
    assert "sha256:" + hashlib.sha256(config).hexdigest() == built.image_id
    assert json.loads(config)["created"] == "2024-12-02T00:00:00Z"
