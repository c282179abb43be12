"""The trtllm flavor: compatibility from TensorRT-LLM's own metadata, and never a stub."""

from __future__ import annotations

import dataclasses
from email.message import Message
from pathlib import Path

import pytest

from builder.errors import UserError
from builder.facts import compat
from builder.facts.compat import TorchWheels, TrtllmRelease, trtllm_from_metadata
from builder.lock import requirements as lock
from builder.plan import offers
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


def with_cuda13_index(matrix_file: Path, wheels: TorchWheels, versions: tuple[str, ...] = ("2.9.1",)) -> None:
    """An index `cu130` serving torch builds for CUDA 13.0 that pin the per-library CUDA 13 wheels,
    as PyTorch's cu130 index does for 2.9.x (whose nvidia-cuda-nvcc holds nvcc, unlike CUDA 12's)."""
    text = matrix_file.read_text().replace(
        'indexes:\n  pypi: {url: "https://pypi.org/simple"}',
        'indexes:\n  pypi: {url: "https://pypi.org/simple"}\n  cu130: {url: "https://download.pytorch.org/whl/cu130"}',
    )
    matrix_file.write_text(text)
    fixture = wheels.table["pypi"]["2.9.1"]
    wheels.table["cu130"] = {v: dataclasses.replace(fixture, version=v, cuda="13.0") for v in versions}


def _with_trtllm(matrix_file: Path, entry: str, python: str = "3.12") -> Path:
    text = matrix_file.read_text().replace('python: "3.11"', f'python: "{python}"')
    matrix_file.write_text(text + f"include:\n  - {entry}\n")
    return matrix_file


def test_a_supported_combination_is_a_cell(matrix_file: Path, wheels: TorchWheels) -> None:
    # The fixture's pypi 2.9.1 is a CUDA 12.8 build, which TensorRT-LLM 1.2.1 (CUDA 13) rejects,
    # and CUDA 12 has no nvcc wheel for the flavor's CUDA_HOME: pair 1.2.1 with a CUDA 13.0 build.
    with_cuda13_index(matrix_file, wheels)
    path = _with_trtllm(matrix_file, '{torch: "2.9.1", base: bookworm, flavor: trtllm, trtllm: "1.2.1", index: cu130}')
    cell = load_matrix(path, wheels, RELEASES).cell("2.9.1-cu13.0-bookworm-trtllm1.2.1")
    assert cell.trtllm == "1.2.1" and cell.python == "3.12"
    assert "nvidia-cuda-nvcc~=13.0.0" in lock.flavor_requirements(cell)


def test_tensorrt_llm_on_cuda_12_is_rejected_for_want_of_nvcc(matrix_file: Path, wheels: TorchWheels) -> None:
    wheels.table["pypi"]["2.7.1"] = dataclasses.replace(wheels.table["pypi"]["2.6.0"], version="2.7.1")
    path = _with_trtllm(matrix_file, '{torch: "2.7.1", base: bookworm, flavor: trtllm, trtllm: "1.0.0"}')
    with pytest.raises(UserError) as caught:
        load_matrix(path, wheels, RELEASES)
    assert "this cell cannot work: the trtllm flavor needs nvcc: torch 2.7.1 pins CUDA 12.4's" in caught.value.line()


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
    cuda13 = dataclasses.replace(wheels.table["pypi"]["2.9.1"], cuda="13.0")
    wheels.table["local"] = {"2.9.1": cuda13}
    links = tmp_path / "trtllm-wheels"
    links.mkdir()
    text = matrix_file.read_text().replace(
        'indexes:\n  pypi: {url: "https://pypi.org/simple"}',
        f'indexes:\n  pypi: {{url: "https://pypi.org/simple"}}\n  local: {{find_links: ["{links}"]}}',
    )
    matrix_file.write_text(text)
    path = _with_trtllm(matrix_file, '{torch: "2.9.1", base: bookworm, flavor: trtllm, trtllm: "1.2.1", index: local}')
    grid = load_matrix(path, wheels, RELEASES)
    cell = grid.cell("2.9.1-cu13.0-bookworm-trtllm1.2.1")
    with pytest.raises(UserError) as caught:
        lock.require_real_trtllm_wheels(cell, grid)
    assert f"no real wheel of tensorrt-llm 1.2.1 in {links}" in caught.value.line()
    assert "stub that downloads at install time" in caught.value.line()
    make_wheel(links, "tensorrt_llm-1.2.1-cp312-cp312-linux_x86_64.whl")
    lock.require_real_trtllm_wheels(cell, grid)  # a real wheel is there: no error


def test_an_include_on_an_index_not_fully_read_is_listed_rejected_with_the_build_it_needs(
    matrix_file: Path, wheels: TorchWheels
) -> None:
    # The fixture's pypi has torch 2.9.1 for CUDA 12.8 only. When the last refresh could not
    # read one of its URLs, a CUDA 13.0 build may exist there: a gap in the data, not a
    # conflict, so the matrix still loads and plan says what the cell needs and from where.
    wheels.unread["pypi"] = ["https://download.pytorch.org/whl/cu130"]
    entry = '{torch: "2.9.1", cuda: "13.0", base: bookworm, flavor: trtllm, trtllm: "1.2.1"}'
    grid = load_matrix(_with_trtllm(matrix_file, entry), wheels, RELEASES)
    [rejected] = [r for r in grid.rejected if r.selector.get("trtllm") == "1.2.1"]
    assert rejected.name == "2.9.1-cu13.0-bookworm-trtllm1.2.1"
    assert rejected.reason.startswith("TensorRT-LLM 1.2.1 needs torch <=2.10.0a0,>=2.9.1 built for CUDA 13: ")
    assert "torch 2.9.1 for CUDA 13.0 is not among what was read of index 'pypi'" in rejected.reason
    assert "https://download.pytorch.org/whl/cu130 could not be read" in rejected.reason


def test_the_same_include_on_a_fully_read_index_is_refused(matrix_file: Path, wheels: TorchWheels) -> None:
    entry = '{torch: "2.9.1", cuda: "13.0", base: bookworm, flavor: trtllm, trtllm: "1.2.1"}'
    with pytest.raises(UserError) as caught:
        load_matrix(_with_trtllm(matrix_file, entry), wheels, RELEASES)
    assert "torch 2.9.1 on index 'pypi' is built for CUDA 12.8, not 13.0" in caught.value.line()


def _stub_metadata(requires: list[str]) -> Message:
    metadata = Message()
    for requirement in requires:
        metadata["Requires-Dist"] = requirement
    for classifier in PYTHON_CLASSIFIERS:
        metadata["Classifier"] = classifier
    return metadata


def test_refresh_reads_every_release_once_keeps_unpinned_stubs_and_marks_prereleases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stubs = {
        "0.9.0": None,  # the old stubs: a bare setup.py, no PKG-INFO
        "0.10.0": _stub_metadata(["numpy"]),  # metadata, but no torch pin
        "1.2.1": _stub_metadata(["torch<=2.10.0a0,>=2.9.1", "tensorrt~=10.14.1", "cuda-python>=13"]),
        "1.4.0rc1": _stub_metadata(["torch<=2.14.0,>=2.14.0a0", "cuda-python>=13"]),
    }
    reads: list[str] = []

    def sdist_metadata(url: str) -> Message | None:
        reads.append(url)
        return stubs[url]

    monkeypatch.setattr(compat, "trtllm_stub_versions", lambda index_url: {v: v for v in stubs})
    monkeypatch.setattr(compat.pypi, "sdist_metadata", sdist_metadata)
    table = compat.TrtllmTable()
    assert compat.read_trtllm_releases("https://pypi.org/simple", table) == ["0.9.0", "0.10.0", "1.2.1", "1.4.0rc1"]
    assert table.without_pins == {"0.9.0", "0.10.0"}
    assert set(table.releases) == {"1.2.1", "1.4.0rc1"}
    assert table.releases["1.4.0rc1"].prerelease and not table.releases["1.2.1"].prerelease
    assert table.newest(prerelease=False) == table.releases["1.2.1"]
    assert table.newest(prerelease=True) == table.releases["1.4.0rc1"]
    reads.clear()
    assert compat.read_trtllm_releases("https://pypi.org/simple", table) == []  # releases never change
    assert reads == []


def test_the_table_round_trips_through_its_file(tmp_path: Path) -> None:
    table = compat.TrtllmTable(dict(RELEASES), {"0.9.0"})
    compat.save_trtllm(table, tmp_path / "trtllm.json")
    assert compat.load_trtllm_table(tmp_path / "trtllm.json") == table


def test_plan_offers_the_newest_stable_release_and_the_cell_on_it(matrix_file: Path, wheels: TorchWheels) -> None:
    with_cuda13_index(matrix_file, wheels, ("2.9.0",))
    path = _with_trtllm(matrix_file, '{torch: "2.9.0", base: bookworm, flavor: trtllm, trtllm: "1.1.0", index: cu130}')
    older = trtllm_from_metadata("1.1.0", ["torch<=2.9.0,>=2.9.0a0", "cuda-python>=13"], PYTHON_CLASSIFIERS)
    grid = load_matrix(path, wheels, {**RELEASES, "1.1.0": older})
    prerelease = trtllm_from_metadata("1.4.0rc1", ["torch<=2.14.0,>=2.14.0a0"], PYTHON_CLASSIFIERS)
    table = compat.TrtllmTable({**RELEASES, "1.1.0": older, "1.4.0rc1": prerelease})
    found = offers.trtllm_offers(grid, table)
    assert found["newest_stable"].startswith("1.2.1 (torch <=2.10.0a0,>=2.9.1, TensorRT ~=10.14.1, CUDA 13")
    assert found["newest_prerelease"].startswith("1.4.0rc1 ")
    assert found["cells_on_newest_stable"] == [] and found["older_releases_in_matrix"] == ["1.1.0"]
    assert "no cell of this matrix is on it" in "\n".join(offers.describe(found))
