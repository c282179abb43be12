"""The devel image: every runtime test (inherited), plus its inspection tools and compilers."""

from __future__ import annotations

import pytest

from tests.integration.by_image.runtime import test_runtime as runtime
from tests.integration.conftest import BuiltCell

pytestmark = pytest.mark.integration


class TestDevelImage(runtime.TestRuntimeImage):
    @pytest.fixture
    def image(self, built_devel: BuiltCell) -> BuiltCell:
        return built_devel

    def test_devel_has_the_inspection_tools(self, image: BuiltCell) -> None:
        script = "htop --version && py-spy --version && gdb --version | head -n 1 && ninja --version && git --version"
        output = image.run("sh", "-c", script)
        assert "htop" in output and "py-spy" in output and "GNU gdb" in output and "git version" in output

    def test_a_torch_cpp_extension_builds_and_runs_in_devel(self, image: BuiltCell) -> None:
        program = (
            "import torch\n"
            "from torch.utils.cpp_extension import load_inline\n"
            "source = 'torch::Tensor twice(torch::Tensor x) { return x * 2; }'\n"
            "module = load_inline('twice_ext', cpp_sources=source, functions=['twice'], verbose=False)\n"
            "print(module.twice(torch.ones(3)).sum().item())\n"
        )
        assert image.run("python", "-c", program).strip().splitlines()[-1] == "6.0"
