"""The trtllm flavor: compatibility from TensorRT-LLM's own metadata, and never a stub."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from builder.errors import UserError
from builder.facts.compat import TorchWheels, TrtllmRelease, trtllm_from_metadata
from builder.lock import requirements as lock
from builder.plan.matrix import load_matrix
from tests.unit.test_wheelhouse import make_wheel

PYTHON_CLASSIFIERS = ["Programming Language :: Python :: 3.10", "Programming Language :: Python :: 3.12"]
RELEASES = {
    "1.0.0": trtllm_from_metadata(
        "1.0.0",
        ["tensorrt~=10.11.0", "torch<=2.8.0a0,>=2.7.1", "nvidia-nccl-cu12", "cuda-python<13,>=12"],
        PYTHON_CLASSIFIERS,
    ),
    "1.2.1": trtllm_from_metadata(
        "1.2.1",
        ["tensorrt~=10.14.1", "torch<=2.10.0a0,>=2.9.1", "nvidia-nccl-cu13<=2.28.9,>=2.27.7", "cuda-python>=13"],
        PYTHON_CLASSIFIERS,
    ),
}


def test_release_facts_come_from_requires_dist_and_classifiers() -> None:
    release = RELEASES["1.2.1"]
    assert release == TrtllmRelease("1.2.1", "<=2.10.0a0,>=2.9.1", "~=10.14.1", ["3.10", "3.12"], "13")
    assert release.supports_torch("2.9.1") and release.supports_torch("2.9.1+cu130")
    assert not release.supports_torch("2.10.0") and not release.supports_torch("2.8.0")


def _with_trtllm(matrix_file: Path, entry: str, python: str = "3.12") -> Path:
    text = matrix_file.read_text().replace('python: "3.11"', f'python: "{python}"')
    matrix_file.write_text(text + f"include:\n  - {entry}\n")
    return matrix_file


def test_a_supported_combination_is_a_cell(matrix_file: Path, wheels: TorchWheels) -> None:
    # The fixture's 2.9.1 is a CUDA 12.8 build, which TensorRT-LLM 1.2.1 (CUDA 13) rejects; 1.0.0
    # wants torch 2.7.x. So give 1.0.0 a fake 2.7.1 build to pair with.
    wheels.table["pypi"]["2.7.1"] = dataclasses.replace(wheels.table["pypi"]["2.6.0"], version="2.7.1")
    path = _with_trtllm(matrix_file, '{torch: "2.7.1", base: bookworm, flavor: trtllm, trtllm: "1.0.0"}')
    cell = load_matrix(path, wheels, RELEASES).cell("2.7.1-cu12.4-bookworm-trtllm1.0.0")
    assert cell.trtllm == "1.0.0" and cell.python == "3.12"


@pytest.mark.parametrize(
    ("entry", "python", "reason"),
    [
        (
            '{torch: "2.9.1", base: bookworm, flavor: trtllm, trtllm: "1.0.0"}',
            "3.12",
            "TensorRT-LLM 1.0.0 needs torch <=2.8.0a0,>=2.7.1, the cell has 2.9.1",
        ),
        (
            '{torch: "2.9.1", base: bookworm, flavor: trtllm, trtllm: "1.2.1"}',
            "3.11",
            "TensorRT-LLM 1.2.1 supports Python 3.10, 3.12; base bookworm has 3.11",
        ),
        (
            '{torch: "2.9.1", base: bookworm, flavor: trtllm, trtllm: "1.2.1"}',
            "3.12",
            "TensorRT-LLM 1.2.1 is built for CUDA 13, torch 2.9.1 here is CUDA 12.8",
        ),
        (
            '{torch: "2.9.1", base: bookworm, flavor: trtllm, trtllm: "9.9.9"}',
            "3.12",
            "no data for TensorRT-LLM 9.9.9 in data/trtllm.json",
        ),
    ],
)
def test_an_unsupported_combination_is_refused_with_the_reason(
    matrix_file: Path, wheels: TorchWheels, entry: str, python: str, reason: str
) -> None:
    path = _with_trtllm(matrix_file, entry, python)
    with pytest.raises(UserError) as caught:
        load_matrix(path, wheels, RELEASES)
    assert "this cell cannot work: " + reason in caught.value.line()


def test_lock_refuses_when_only_the_stub_is_reachable_and_accepts_real_wheels(
    tmp_path: Path, matrix_file: Path, wheels: TorchWheels
) -> None:
    wheels.table["local"] = {"2.7.1": dataclasses.replace(wheels.table["pypi"]["2.6.0"], version="2.7.1")}
    links = tmp_path / "trtllm-wheels"
    links.mkdir()
    text = matrix_file.read_text().replace(
        'indexes:\n  pypi: {url: "https://pypi.org/simple"}',
        f'indexes:\n  pypi: {{url: "https://pypi.org/simple"}}\n  local: {{find_links: ["{links}"]}}',
    )
    matrix_file.write_text(text)
    path = _with_trtllm(matrix_file, '{torch: "2.7.1", base: bookworm, flavor: trtllm, trtllm: "1.0.0", index: local}')
    grid = load_matrix(path, wheels, RELEASES)
    cell = grid.cell("2.7.1-cu12.4-bookworm-trtllm1.0.0")
    with pytest.raises(UserError) as caught:
        lock.require_real_trtllm_wheels(cell, grid)
    assert f"no real wheel of tensorrt-llm 1.0.0 in {links}" in caught.value.line()
    assert "stub that downloads at install time" in caught.value.line()
    make_wheel(links, "tensorrt_llm-1.0.0-cp312-cp312-linux_x86_64.whl")
    lock.require_real_trtllm_wheels(cell, grid)  # a real wheel is there: no error
