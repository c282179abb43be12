"""Integration fixtures: a real Docker engine, a real cell built from the shipped matrix.

The cell is `--cell NAME`, or by default torch's CPU build from the local wheel directory where
one is configured (this project's machines carry torch 2.13.0+cpu for Python 3.11 in
/opt/wheels); otherwise the flagship, whose CUDA wheels (about 3 GB) come from PyPI.

Everything the session adds to the engine is removed at its end: the images it built, the
engine's intermediate build steps, bases it bootstrapped, and anything a test left behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import pytest

from builder.build import build, smoke, wheelhouse
from builder.engine import daemon as engine
from builder.plan import matrix
from builder.plan.cell import Cell
from builder.spec import env
from tests import engine_state

REPO = Path(__file__).resolve().parents[2]
CPU_CELL = "2.13.0-cpu-bookworm-runtime"


@dataclass
class BuiltCell:
    grid: matrix.Matrix
    cell: Cell
    reference: str
    image_id: str
    client: docker.DockerClient

    def run(self, *command: str, **kwargs: object) -> str:
        output: bytes = self.client.containers.run(
            self.image_id, list(command), remove=True, network_mode="none", **kwargs
        )
        return output.decode()


def _pick_cell(grid: matrix.Matrix, wanted: str | None) -> Cell:
    if wanted:
        return grid.cell(wanted)
    cpu = next((c for c in grid.cells if c.name == CPU_CELL), None)
    if cpu is not None:
        links = [Path(env.expand_env(p)) for p in grid.index(cpu.index).find_links]
        if all(p.is_dir() and list(p.glob("torch-*.whl")) for p in links):
            return cpu
    return grid.flagship


@pytest.fixture(scope="session")
def client() -> Iterator[docker.DockerClient]:
    if not engine.answers():
        pytest.fail(f"integration tests need a Docker engine at {engine.socket_name()}; `nox -s tests` starts one")
    engine_client = engine.client()
    before = engine_state.image_ids(engine_client)
    yield engine_client
    engine_state.remove_added_images(engine_client, before)


@pytest.fixture(scope="session")
def built(client: docker.DockerClient, pytestconfig: pytest.Config) -> Iterator[BuiltCell]:
    grid = matrix.load_matrix(REPO / "matrix.yaml")
    cell = _pick_cell(grid, pytestconfig.getoption("--cell"))
    reference = build.local_reference(grid, cell)
    result = build.build_cell(client, grid, cell, wheelhouse.Wheelhouse(), print, no_cache=True)
    assert result.status == "built", result.detail
    # Its intermediate steps stay until the session ends: the devel sibling reuses them.
    yield BuiltCell(grid, cell, reference, result.image_id, client)


@pytest.fixture(scope="session")
def smoke_result(built: BuiltCell) -> smoke.SmokeResult:
    return smoke.run(built.client, built.reference, gpus=False)
