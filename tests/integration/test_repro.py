"""Reproducibility on the real engine: same inputs, same image ID."""

from __future__ import annotations

import dataclasses

import pytest

from builder import base, build, repro, wheelhouse
from tests.integration.conftest import BuiltCell

pytestmark = pytest.mark.integration


def test_bootstrapping_the_base_twice_gives_the_same_image_id(built: BuiltCell) -> None:
    twin = dataclasses.replace(built.cell.base, name=f"{built.cell.base.name}-repro-test")
    epoch = built.grid.spec.source_date_epoch
    try:
        first = base.bootstrap(built.client, twin, epoch, lambda _: None)
        built.client.images.remove(twin.local_tag, force=True)
        second = base.bootstrap(built.client, twin, epoch, lambda _: None)
        assert first == second
        assert built.client.images.get(second).attrs["Created"].startswith("2024-12-02T00:00:00")
    finally:
        build.remove_image(built.client, twin.local_tag)


def test_a_rebuild_without_cache_gives_the_same_image_and_layers(built: BuiltCell) -> None:
    again = build.build_cell(built.client, built.grid, built.cell, wheelhouse.Wheelhouse(), print, no_cache=True)
    assert again.status == "built", again.detail
    verdict = repro.compare(built.client, built.cell.name, built.image_id, again.image_id)
    assert verdict.differences == {} and verdict.reproducible
    config = built.client.images.get(again.image_id).attrs
    assert config["Created"].startswith("2024-12-02T00:00:00")
