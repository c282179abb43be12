"""Reproducibility on the real engine: same inputs, same image ID."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from builder.assemble import build, wheelhouse
from builder.engine import bases
from builder.repro import normalize, verify
from builder.repro.layers import normalize_config
from tests.integration.conftest import BuiltCell

pytestmark = pytest.mark.integration


def test_bootstrapping_the_base_twice_gives_the_same_image_id(built: BuiltCell) -> None:
    twin = dataclasses.replace(built.cell.base, name=f"{built.cell.base.name}-repro-test")
    epoch = built.grid.spec.source_date_epoch
    try:
        first = bases.bootstrap(built.client, twin, epoch, lambda _: None)
        built.client.images.remove(twin.local_tag, force=True)
        second = bases.bootstrap(built.client, twin, epoch, lambda _: None)
        assert first == second
        assert built.client.images.get(second).attrs["Created"].startswith("2024-12-02T00:00:00")
    finally:
        build.remove_image(built.client, twin.local_tag)


def layers(built: BuiltCell, image: str) -> list[str]:
    return list(built.client.images.get(image).attrs["RootFS"]["Layers"])


def test_a_rebuild_without_cache_gives_the_same_image_and_layers(built: BuiltCell) -> None:
    house = wheelhouse.Wheelhouse()
    again = build.build_cell(
        built.client, built.grid, build.preflight(built.cell, built.grid), house, print, no_cache=True, normalize=False
    )
    assert again.status == "built", again.detail
    raw_layers = layers(built, again.image_id)
    epoch = built.grid.spec.source_date_epoch
    keep = bases.layer_count(
        built.client, build.cell_base(built.client, built.grid, build.preflight(built.cell, built.grid), print)
    )
    normalized = normalize.normalize_image(built.client, again.reference, epoch, keep, print)
    verdict = verify.compare(built.client, built.cell.name, built.image_id, normalized)
    assert verdict.differences == {} and verdict.reproducible
    assert built.client.images.get(normalized).attrs["Created"].startswith("2024-12-02T00:00:00")
    # Every step above the base is a RUN that settled its layer in the build (no COPY is left):
    # the normalized image holds the engine's own layers, byte for byte; only its config is new.
    assert layers(built, normalized) == raw_layers and len(raw_layers) > keep + 2
    assert normalized != again.image_id


def test_the_config_rebuilt_from_the_engine_hashes_to_the_normalized_images_id(built: BuiltCell) -> None:
    """The normalization's fast path (every layer from a settled RUN step: only the config is
    rewritten, no `docker save`) rebuilds the config from inspect and history; on the built
    image, normalizing that again must give the very bytes its ID is the hash of."""
    base = build.cell_base(built.client, built.grid, build.preflight(built.cell, built.grid), lambda _: None)
    keep = bases.layer_count(built.client, base)
    config = normalize.config_from_engine(built.client, built.image_id, keep)
    assert config is not None, "a layer above the base is not from a settled RUN step"
    rebuilt = normalize_config(config, config["rootfs"]["diff_ids"], built.grid.spec.source_date_epoch)
    assert "sha256:" + hashlib.sha256(rebuilt).hexdigest() == built.image_id
