"""Compatibility facts derived from wheel tags and Requires-Dist."""

from __future__ import annotations

from builder.facts.compat import TorchWheels, build_from_metadata, cuda_of
from tests.conftest import CU128, wheel


def test_cuda_comes_from_the_runtime_pin_for_per_library_wheels() -> None:
    assert cuda_of("2.9.1", {"nvidia-cuda-runtime-cu12": "12.8.90"}) == "12.8"


def test_cuda_comes_from_the_cuda_toolkit_metapackage_from_torch_2_11() -> None:
    assert cuda_of("2.15.0", {"cuda-toolkit": "13.2.2", "nvidia-cudnn-cu13": "9.26.0.51"}) == "13.2"


def test_local_version_decides_cpu_and_cuda_variants() -> None:
    assert cuda_of("2.13.0+cpu", {}) == "cpu"
    assert cuda_of("2.9.1+cu126", {"nvidia-cuda-runtime-cu12": "12.6.77"}) == "12.6"


def test_build_reads_pins_pythons_and_glibc_floors() -> None:
    wheels = [
        wheel("torch-2.9.1-cp311-cp311-manylinux_2_28_x86_64.whl"),
        wheel("torch-2.9.1-cp313-cp313t-manylinux_2_28_x86_64.whl"),  # free-threaded: not an image Python
        wheel("torch-2.9.1-cp39-cp39-manylinux1_x86_64.whl"),
    ]
    build = build_from_metadata("2.9.1", wheels, [*CU128, "filelock", "triton~=3.5.0; python_version < '3.15'"])
    assert build.pythons == ["3.9", "3.11"]
    assert build.glibc_floor == {"3.11": "2.28", "3.9": "2.5"}
    assert (build.cuda, build.cudnn, build.nccl) == ("12.8", "9.10.2.21", "2.27.5")
    assert build.triton == "~=3.5.0"


def test_table_round_trips_through_its_json_file(tmp_path, wheels: TorchWheels) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "torch_wheels.json"
    wheels.save(path)
    loaded = TorchWheels.load(path)
    assert loaded.table == wheels.table
    assert loaded.indexes_with("2.13.0", "cpu") == ["local-cpu"]
