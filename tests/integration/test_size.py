"""Sizes of a real built image: the `size` report and the size budget, on the engine."""

from __future__ import annotations

import pytest

from builder import cli
from builder.assemble import size
from builder.config.schema import BudgetSpec
from tests.integration.conftest import BuiltCell

pytestmark = pytest.mark.integration


def test_size_names_every_layer_with_its_step_and_the_packages_inside(
    built: BuiltCell, capsys: pytest.CaptureFixture[str]
) -> None:
    layers = size.layers(built.client, built.image_id)
    assert len(layers) == len(built.client.images.get(built.image_id).attrs["RootFS"]["Layers"])
    torch_layer = max(layers, key=lambda layer: layer.parts.get("site-packages/torch", 0))
    assert torch_layer.largest(1)[0][0] == "site-packages/torch" and torch_layer.step.startswith("RUN ")
    assert layers[0].step.startswith("bootstrap")  # the base's one layer
    # The stack is split: torch's layer is not the layer of the other Python packages.
    assert "site-packages/numpy" not in torch_layer.parts
    assert cli.main(["--matrix", str(built.grid.path), "size", built.cell.name, "--top", "2"]) == 0
    assert "site-packages/torch" in capsys.readouterr().out


def test_an_image_over_its_budget_is_named_by_layer_and_largest_package(built: BuiltCell) -> None:
    flavor = built.cell.flavor
    assert size.over_budget(built.client, built.image_id, flavor, BudgetSpec(total="100 GB", layer="100 GB")) == ""
    too_small_layer = size.over_budget(built.client, built.image_id, flavor, BudgetSpec(layer="100 MB"))
    assert f"over the 100 MB per-layer budget for {flavor}: layer " in too_small_layer
    # The first layer past 100 MB is the system packages' (gcc for torch.compile is in every flavor).
    assert "largest usr/lib/gcc" in too_small_layer
    too_small_total = size.over_budget(built.client, built.image_id, flavor, BudgetSpec(total="1 GB"))
    assert "in all, over the 1 GB budget" in too_small_total and "site-packages/torch" in too_small_total
