"""Integration fixtures: a real Docker engine, a real cell built from the shipped matrix.

The cell is torch's CPU build from the local wheel directory where one is configured (this
project's machines carry torch 2.13.0+cpu for Python 3.11); otherwise the flagship, CUDA
wheels from PyPI. Images the tests build are removed at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

from builder import build, engine, matrix, smoke, wheelhouse
from builder.cell import Cell

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


def _pick_cell(grid: matrix.Matrix) -> Cell:
    cpu = next((c for c in grid.cells if c.name == CPU_CELL), None)
    if cpu is not None:
        links = [Path(matrix.expand_env(p)) for p in grid.index(cpu.index).find_links]
        if all(p.is_dir() and list(p.glob("torch-*.whl")) for p in links):
            return cpu
    return grid.flagship


@pytest.fixture(scope="session")
def client() -> docker.DockerClient:
    if not engine.answers():
        pytest.fail(f"integration tests need a Docker engine at {engine.socket_name()}; .ci/run starts one")
    return engine.client()


@pytest.fixture(scope="session")
def built(client: docker.DockerClient) -> Iterator[BuiltCell]:
    os.chdir(REPO)
    grid = matrix.load_matrix(REPO / "matrix.yaml")
    cell = _pick_cell(grid)
    reference = build.local_reference(grid, cell)
    existed = bool(client.images.list(name=reference))
    result = build.build_cell(client, grid, cell, wheelhouse.Wheelhouse(), print)
    assert result.status == "built", result.detail
    yield BuiltCell(grid, cell, reference, result.image_id, client)
    if not existed:
        build.remove_image(client, reference)


@pytest.fixture(scope="session")
def smoke_result(built: BuiltCell) -> smoke.SmokeResult:
    return smoke.run(built.client, built.reference, gpus=False)
