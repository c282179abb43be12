"""Shared fixtures: a small matrix and a torch wheel table built from synthetic metadata."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from builder.facts.compat import TorchBuild, TorchWheels, build_from_metadata
from builder.facts.pypi import WheelFile
from tests.support import parts

FIXTURES = Path(__file__).parent / "fixtures"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cell",
        default=None,
        help="the cell of ./matrix.yaml the integration tests build and check (default: the CPU cell where "
        "its torch wheel directory exists, else the flagship); a CUDA cell runs the CUDA checks too",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep only this process's part of the suite when TORCH_IMAGES_TESTS_PART names one."""
    wanted = os.environ.get(parts.VARIABLE)
    if not wanted:
        return
    if wanted not in parts.PARTS:
        raise pytest.UsageError(f"{parts.VARIABLE}={wanted!r}: write one of {', '.join(parts.PARTS)}, or unset it")
    kept, other = [], []
    for item in items:
        (kept if parts.part_of(mark.name for mark in item.iter_markers()) == wanted else other).append(item)
    config.hook.pytest_deselected(items=other)
    items[:] = kept


def lock_entry(name: str, version: str, *hashes: str) -> str:
    """One entry as `lock` writes it (uv's shape): the pin, then one hash a line."""
    lines = [f"{name}=={version}", *(f"    --hash=sha256:{h}" for h in hashes)]
    return " \\\n".join(lines) + "\n"


def wheel(filename: str, requires_python: str = ">=3.9") -> WheelFile:
    return WheelFile(
        filename=filename,
        url=f"https://files.example/{filename}",
        sha256=None,
        requires_python=requires_python,
    )


def torch_build(
    version: str, pythons: list[str], floor: str, requires: list[str], platform: str = "linux/amd64"
) -> TorchBuild:
    arch = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}[platform]
    wheels = [
        wheel(
            f"torch-{version}-cp{p.replace('.', '')}-cp{p.replace('.', '')}"
            f"-manylinux_{floor.replace('.', '_')}_{arch}.whl"
        )
        for p in pythons
    ]
    return build_from_metadata(version, wheels, requires, platform)


CU124 = [
    'nvidia-cuda-runtime-cu12==12.4.127; platform_system == "Linux"',
    'nvidia-cudnn-cu12==9.1.0.70; platform_system == "Linux"',
    'nvidia-nccl-cu12==2.21.5; platform_system == "Linux"',
    'triton==3.2.0; platform_system == "Linux"',
]
CU128 = [
    'nvidia-cuda-runtime-cu12==12.8.90; platform_system == "Linux"',
    'nvidia-cudnn-cu12==9.10.2.21; platform_system == "Linux"',
    'nvidia-nccl-cu12==2.27.5; platform_system == "Linux"',
    'triton==3.5.1; platform_system == "Linux"',
]
# torch >= 2.11 pins the cuda-toolkit metapackage, whose nvcc extra is the devel flavor's compiler.
CU130 = [
    'cuda-toolkit[cublas,cudart,cudnn]==13.0.3; platform_system == "Linux"',
    'nvidia-cudnn-cu13==9.20.0.48; platform_system == "Linux"',
    'nvidia-nccl-cu13==2.29.7; platform_system == "Linux"',
    'triton==3.7.1; platform_system == "Linux"',
]


@pytest.fixture
def wheels() -> TorchWheels:
    return TorchWheels(
        {
            "pypi": {
                "2.6.0": torch_build("2.6.0", ["3.9", "3.10", "3.11", "3.12", "3.13"], "2.17", CU124),
                "2.9.1": torch_build("2.9.1", ["3.10", "3.11", "3.12", "3.13", "3.14"], "2.28", CU128),
                "2.13.0": torch_build("2.13.0", ["3.10", "3.11", "3.12", "3.13", "3.14"], "2.28", CU130),
            },
            "local-cpu": {
                "2.13.0+cpu": torch_build("2.13.0+cpu", ["3.11"], "2.28", ["filelock", "sympy>=1.13.3"]),
            },
        }
    )


@pytest.fixture
def matrix_file(tmp_path: Path) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text((FIXTURES / "matrix.yaml").read_text())
    return path
