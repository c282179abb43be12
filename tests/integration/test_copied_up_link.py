"""A RUN step that hard-links a file of a lower layer builds, as the engine accepts it: the pass
after the build keeps the unchanged copy-up the link needs, and reading the engine's layers from
the overlay2 driver's folders or through `docker save` gives one image ID (the containerd content
store's reader is tried on Docker 29, in test_engines.py, which runs after this file)."""

from __future__ import annotations

import pytest

from builder.engine import layerdirs
from tests.integration.conftest import BuiltCell
from tests.support import lowerlink

pytestmark = pytest.mark.integration


def test_a_step_linking_a_lower_layers_file_builds_the_same_from_folders_and_from_docker_save(
    built: BuiltCell, monkeypatch: pytest.MonkeyPatch
) -> None:
    from_folders, source, said = lowerlink.build_and_normalize(built.client, built.grid, built.cell)
    assert said == "linked"
    monkeypatch.setattr(layerdirs, "locate", lambda *_: None)  # as where the folders cannot be read
    from_save, save_source, said_again = lowerlink.build_and_normalize(built.client, built.grid, built.cell)
    assert (source, save_source) == ("the overlay2 driver's layer folders", "docker save")
    assert said_again == "linked"
    assert from_folders == from_save
    lowerlink.RECORDED[built.cell.name] = from_folders  # for Docker 29's content store, in test_engines
