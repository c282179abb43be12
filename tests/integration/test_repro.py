"""Reproducibility on the real engine: same inputs, same image ID."""

from __future__ import annotations

import dataclasses

import pytest

from builder.assemble import build, wheelhouse
from builder.engine import bases
from builder.repro import normalize, verify
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
    # The RUN steps settled their layers in the build: up to the first COPY, the normalized
    # image holds the engine's own layers; the COPY layers (last) were rewritten.
    kept = [raw == final for raw, final in zip(raw_layers, layers(built, normalized), strict=True)]
    first_copy = kept.index(False)
    assert first_copy > keep + 1 and all(kept[:first_copy]) and first_copy >= len(kept) - 4
