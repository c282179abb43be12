"""The devel flavor: inspection tools, and torch C++ extensions build inside it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from builder.build import build, wheelhouse
from tests import image_checks
from tests.integration.conftest import BuiltCell

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def devel(built: BuiltCell) -> Iterator[str]:
    sibling = built.cell.name.replace("-runtime", "-devel")
    cell = next((c for c in built.grid.cells if c.name == sibling), None)
    if cell is None:
        pytest.skip(f"the matrix has no devel sibling of {built.cell.name}")
    result = build.build_cell(built.client, built.grid, cell, wheelhouse.Wheelhouse(), print)
    assert result.status in ("built", "unchanged"), result.detail
    yield result.image_id  # the session removes what it built


def test_devel_has_the_inspection_tools(built: BuiltCell, devel: str) -> None:
    script = "htop --version && py-spy --version && gdb --version | head -n 1 && ninja --version && git --version"
    output = built.client.containers.run(devel, ["sh", "-c", script], remove=True, network_mode="none").decode()
    assert "htop" in output and "py-spy" in output and "GNU gdb" in output and "git version" in output


def test_a_torch_cpp_extension_builds_and_runs_in_devel(built: BuiltCell, devel: str) -> None:
    program = (
        "import torch\n"
        "from torch.utils.cpp_extension import load_inline\n"
        "source = 'torch::Tensor twice(torch::Tensor x) { return x * 2; }'\n"
        "module = load_inline('twice_ext', cpp_sources=source, functions=['twice'], verbose=False)\n"
        "print(module.twice(torch.ones(3)).sum().item())\n"
    )
    output = built.client.containers.run(devel, ["python", "-c", program], remove=True, network_mode="none")
    assert output.decode().strip().splitlines()[-1] == "6.0"


def test_devel_stores_each_library_once_and_adds_no_second_cuda(built: BuiltCell, devel: str) -> None:
    # The compiler wheels must add headers and tools, never a second copy of a runtime library.
    listing = built.client.containers.run(
        devel, ["sh", "-c", image_checks.library_listing()], remove=True, network_mode="none"
    ).decode()
    assert image_checks.duplicated_libraries(listing) == []
