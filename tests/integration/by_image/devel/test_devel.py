"""The devel image: every runtime test (inherited), plus its inspection tools and compilers."""

from __future__ import annotations

import re

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

    def test_gcc_builds_with_link_time_optimization_and_sanitizers_in_devel(self, image: BuiltCell) -> None:
        # The shared layer leaves out lto1 and the sanitizer runtimes; devel installs them again.
        script = (
            "cd /tmp && printf 'int main(void) { return 0; }\\n' > a.c"
            " && gcc -O2 -flto a.c -o lto && ./lto"
            " && gcc -fsanitize=address,undefined a.c -o san && ASAN_OPTIONS=detect_leaks=0 ./san && echo built"
        )
        assert image.run("sh", "-c", script).strip().splitlines()[-1] == "built"

    # What nvcc links by default (libcudart_static.a, libcudadevrt.a) must be in CUDA_HOME, or a
    # plain `nvcc k.cu` fails to link. No GPU is needed to compile and link.
    CUDA_PROGRAM = (
        "#include <cstdio>\n"
        "__global__ void twice(float *x) { x[threadIdx.x] *= 2; }\n"
        "int main() { float *x; cudaMalloc(&x, 4 * sizeof(float)); twice<<<1, 4>>>(x);\n"
        '  printf("%s\\n", cudaGetErrorName(cudaDeviceSynchronize())); return 0; }\n'
    )

    def test_nvcc_compiles_and_links_a_plain_cuda_program(self, image: BuiltCell) -> None:
        if not image.cell.is_cuda:
            pytest.skip("a CPU cell has no nvcc; run with --cell <a CUDA runtime cell> (docs/testing.md: CUDA cells)")
        script = (
            f"cd /tmp && printf '%s' '{self.CUDA_PROGRAM}' > k.cu"
            " && nvcc -arch=sm_90 -o k k.cu && nvcc -arch=sm_90 -rdc=true -o k_rdc k.cu"
            " && ls -l k k_rdc && (./k || true)"
        )
        output = image.run("sh", "-c", script)
        assert " k\n" in output and " k_rdc\n" in output, output
        # Without a GPU the program still starts (its CUDA runtime is linked in) and reports why.
        assert re.search(r"^cuda(Success|Error\w+)$", output, re.MULTILINE), output

    def test_a_torch_cuda_extension_compiles_and_imports_in_devel(self, image: BuiltCell) -> None:
        if not image.cell.is_cuda:
            pytest.skip("a CPU cell has no nvcc; run with --cell <a CUDA runtime cell> (docs/testing.md: CUDA cells)")
        program = (
            "import torch\n"
            "from torch.utils.cpp_extension import load_inline\n"
            "cuda = '__global__ void k(float *x) { x[threadIdx.x] += 1; }\\n"
            "void bump(torch::Tensor x) { k<<<1, x.numel()>>>(x.data_ptr<float>()); }'\n"
            "module = load_inline('bump_ext', cpp_sources='void bump(torch::Tensor x);', cuda_sources=cuda,\n"
            "                     functions=['bump'], verbose=False)\n"
            "print('imported', module.bump.__name__)\n"
        )
        # No GPU to detect the architecture from, so name one.
        output = image.run("python", "-c", program, environment={"TORCH_CUDA_ARCH_LIST": "9.0"})
        assert output.strip().splitlines()[-1] == "imported bump", output
