"""matrix.yaml: expansion, rejection reasons, and one test per validation rule."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from builder.errors import UserError
from builder.facts.compat import TorchWheels
from builder.plan.matrix import load_matrix

REPO = Path(__file__).resolve().parents[2]


def edit(path: Path, old: str, new: str) -> Path:
    text = path.read_text()
    assert old in text, f"fixture does not contain {old!r}"
    path.write_text(text.replace(old, new, 1))
    return path


def error_of(path: Path, wheels: TorchWheels) -> UserError:
    with pytest.raises(UserError) as caught:
        load_matrix(path, wheels)
    return caught.value


def line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


# ---------------------------------------------------------------- expansion


def test_axes_expand_to_every_combination_with_resolved_versions(matrix_file: Path, wheels: TorchWheels) -> None:
    grid = load_matrix(matrix_file, wheels)
    names = sorted(c.name for c in grid.cells)
    assert names == sorted(
        [
            "2.6.0-cu12.4-bullseye-runtime",
            "2.6.0-cu12.4-bookworm-runtime",
            "2.9.1-cu12.8-bookworm-runtime",
            "2.13.0-cu13.0-bookworm-runtime",
            "2.13.0-cu13.0-bookworm-devel",
        ]
    )
    cell = grid.cell("2.9.1-cu12.8-bookworm-runtime")
    assert (cell.cuda, cell.cudnn, cell.python, cell.base.glibc) == ("12.8", "9.10.2.21", "3.11", "2.36")
    assert cell.tag == "2.9.1-cu12.8-cudnn9.10-py3.11-bookworm-runtime"
    assert cell.aliases == ("2.9-cu12.8-runtime", "latest")
    assert grid.flagship is cell


def test_torch_without_a_wheel_for_the_base_python_is_a_rejected_cell(matrix_file: Path, wheels: TorchWheels) -> None:
    grid = load_matrix(matrix_file, wheels)
    reasons = {r.name: r.reason for r in grid.rejected}
    assert reasons["2.9.1-bullseye-runtime"] == "torch 2.9.1 has no wheel for Python 3.9 (has 3.10-3.14)"
    assert reasons["2.13.0-bullseye-devel"] == "torch 2.13.0 has no wheel for Python 3.9 (has 3.10-3.14)"
    assert sorted(name for name, reason in reasons.items() if "no wheel for Python 3.9" in reason) == [
        "2.13.0-bullseye-devel", "2.13.0-bullseye-runtime", "2.9.1-bullseye-devel", "2.9.1-bullseye-runtime",
    ]  # fmt: skip


def test_glibc_floor_rejection_names_wheel_floor_and_base_glibc(matrix_file: Path, wheels: TorchWheels) -> None:
    edit(matrix_file, 'glibc: "2.31"', 'glibc: "2.27"')
    edit(matrix_file, 'python: "3.9"', 'python: "3.11"')
    grid = load_matrix(matrix_file, wheels)
    reasons = {r.name: r.reason for r in grid.rejected}
    assert reasons["2.9.1-bullseye-runtime"] == (
        "torch 2.9.1's wheel needs glibc 2.28 (manylinux_2_28), base bullseye has 2.27"
    )


def test_python_the_base_does_not_provide_is_rejected(matrix_file: Path, wheels: TorchWheels) -> None:
    edit(
        matrix_file,
        "  base: [bullseye, bookworm]",
        '  python: ["3.11", "3.12"]\n  base: [bullseye, bookworm]',
    )
    grid = load_matrix(matrix_file, wheels)
    assert any(r.reason == "base bookworm provides Python 3.11, not 3.12" for r in grid.rejected)


def test_cuda_other_than_the_wheels_build_names_where_that_variant_lives(
    matrix_file: Path, wheels: TorchWheels
) -> None:
    edit(matrix_file, "  base: [bullseye, bookworm]", '  cuda: ["12.8", "12.6"]\n  base: [bullseye, bookworm]')
    grid = load_matrix(matrix_file, wheels)
    reasons = {r.reason for r in grid.rejected}
    assert any(
        "torch 2.9.1 on index 'pypi' is built for CUDA 12.8, not 12.6" in r and "wheel index for cu126" in r
        for r in reasons
    )


def test_cudnn_may_be_raised_above_torchs_pin_but_never_lowered(matrix_file: Path, wheels: TorchWheels) -> None:
    edit(matrix_file, "  base: [bullseye, bookworm]", '  cudnn: ["9.13.0.50", "9.0.0.1"]\n  base: [bookworm]')
    grid = load_matrix(matrix_file, wheels)
    raised = grid.cell("2.9.1-cu12.8-cudnn9.13.0.50-bookworm-runtime")
    assert raised.cudnn == "9.13.0.50" and raised.cudnn_overridden
    assert any("cuDNN 9.0.0.1 is below torch 2.9.1's pin 9.10.2.21" in r.reason for r in grid.rejected)


def test_exclude_drops_matching_cells_silently(matrix_file: Path, wheels: TorchWheels) -> None:
    matrix_file.write_text(matrix_file.read_text() + 'exclude:\n  - {torch: "2.6.0", flavor: devel}\n')
    grid = load_matrix(matrix_file, wheels)
    assert not [c for c in grid.cells if c.torch.version == "2.6.0" and c.flavor == "devel"]


def test_include_adds_a_cpu_cell_from_another_index(matrix_file: Path, wheels: TorchWheels) -> None:
    text = matrix_file.read_text().replace(
        'indexes:\n  pypi: {url: "https://pypi.org/simple"}',
        'indexes:\n  pypi: {url: "https://pypi.org/simple"}\n  local-cpu: {find_links: ["/wheels"]}',
    )
    matrix_file.write_text(
        text + 'include:\n  - {torch: "2.13.0", cuda: cpu, base: bookworm, flavor: runtime, index: local-cpu}\n'
    )
    cell = load_matrix(matrix_file, wheels).cell("2.13.0-cpu-bookworm-runtime")
    assert (cell.torch.version, cell.cudnn, cell.tag) == (
        "2.13.0+cpu",
        None,
        "2.13.0-cpu-py3.11-bookworm-runtime",
    )


def test_the_quick_cell_is_the_cpu_runtime_only_where_its_wheel_directory_has_torch(
    matrix_file: Path, wheels: TorchWheels, tmp_path: Path
) -> None:
    directory = tmp_path / "wheels"
    text = matrix_file.read_text().replace(
        'indexes:\n  pypi: {url: "https://pypi.org/simple"}',
        f'indexes:\n  pypi: {{url: "https://pypi.org/simple"}}\n  local-cpu: {{find_links: ["{directory}"]}}',
    )
    matrix_file.write_text(
        text + 'include:\n  - {torch: "2.13.0", cuda: cpu, base: bookworm, flavor: runtime, index: local-cpu}\n'
    )
    assert load_matrix(matrix_file, wheels).quick_cell.name == "2.9.1-cu12.8-bookworm-runtime"  # no directory
    directory.mkdir()
    assert load_matrix(matrix_file, wheels).quick_cell.name == "2.9.1-cu12.8-bookworm-runtime"  # no torch in it
    (directory / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    assert load_matrix(matrix_file, wheels).quick_cell.name == "2.13.0-cpu-bookworm-runtime"


# ---------------------------------------------------------------- validation rules


def test_malformed_yaml_names_the_line(matrix_file: Path, wheels: TorchWheels) -> None:
    edit(matrix_file, "repository: torch", "repository: [torch")
    error = error_of(matrix_file, wheels)
    assert error.line().startswith(f"{matrix_file}:") and "malformed YAML" in error.line()


def test_unknown_key_names_file_line_and_field(matrix_file: Path, wheels: TorchWheels) -> None:
    edit(matrix_file, '    glibc: "2.36"', '    glibc: "2.36"\n    glibcc: "2.36"')
    error = error_of(matrix_file, wheels)
    assert error.line() == (
        f"{matrix_file}:{line_of(matrix_file, 'glibcc')}: bases.bookworm.glibcc: unknown key 'glibcc'; "
        "remove it or check its spelling"
    )


def test_unquoted_version_parsed_as_number_says_to_quote_it(matrix_file: Path, wheels: TorchWheels) -> None:
    edit(matrix_file, 'python: "3.11"', "python: 3.10")
    error = error_of(matrix_file, wheels)
    assert error.line() == (
        f"{matrix_file}:{line_of(matrix_file, 'python: 3.10')}: bases.bookworm.python: "
        '3.10 is a number, not a version string; quote it: "3.10"'
    )


def test_value_that_is_not_a_version_is_rejected(matrix_file: Path, wheels: TorchWheels) -> None:
    edit(matrix_file, 'torch: ["2.6.0", "2.9.1", "2.13.0"]', 'torch: ["2.6.0", "latest"]')
    error = error_of(matrix_file, wheels)
    assert "axes.torch[1]: 'latest' is not valid; write a version such as \"2.15.0\"" in error.line()


def test_wrong_type_is_rejected(matrix_file: Path, wheels: TorchWheels) -> None:
    edit(matrix_file, "source_date_epoch: 1733097600", 'source_date_epoch: "yesterday"')
    error = error_of(matrix_file, wheels)
    assert error.field == "source_date_epoch" and str(line_of(matrix_file, "source_date_epoch")) in error.line()


def test_missing_required_field_is_named(matrix_file: Path, wheels: TorchWheels) -> None:
    edit(matrix_file, "repository: torch\n", "")
    assert error_of(matrix_file, wheels).line().endswith("repository: is required and missing; add it")


def test_duplicate_key_is_rejected_not_silently_overwritten(matrix_file: Path, wheels: TorchWheels) -> None:
    edit(matrix_file, "repository: torch", "repository: torch\nrepository: other")
    error = error_of(matrix_file, wheels)
    assert (
        "duplicate key 'repository'" in error.line()
        and f":{line_of(matrix_file, 'repository: other')}:" in error.line()
    )


def test_unknown_base_reference_lists_the_defined_ones(matrix_file: Path, wheels: TorchWheels) -> None:
    edit(matrix_file, "base: [bullseye, bookworm]", "base: [bullseye, bokworm]")
    assert (
        "axes.base[1]: unknown base 'bokworm'; use one of: bullseye, bookworm" in error_of(matrix_file, wheels).line()
    )


def test_duplicate_cells_are_rejected(matrix_file: Path, wheels: TorchWheels) -> None:
    matrix_file.write_text(
        matrix_file.read_text() + 'include:\n  - {torch: "2.9.1", base: bookworm, flavor: runtime}\n'
    )
    error = error_of(matrix_file, wheels)
    assert "include[0]: cell 2.9.1-cu12.8-bookworm-runtime is already made by axes" in error.line()


def test_two_cells_with_the_same_tag_are_rejected(matrix_file: Path, wheels: TorchWheels) -> None:
    edit(matrix_file, 'tag: "{torch}-{accel}-py{python}-{base}-{flavor}"', 'tag: "{torch}-{base}"')
    assert "both get the tag '2.13.0-bookworm'" in error_of(matrix_file, wheels).line()


def test_alias_shared_by_two_cells_is_rejected(matrix_file: Path, wheels: TorchWheels) -> None:
    edit(matrix_file, "    where: {base: bookworm}\n", "")
    assert "both get the tag '2.6-cu12.4-runtime'" in error_of(matrix_file, wheels).line()


def test_empty_file_is_rejected(matrix_file: Path, wheels: TorchWheels) -> None:
    matrix_file.write_text("")
    assert (
        error_of(matrix_file, wheels).line()
        == f"{matrix_file}: the file is empty; docs/custom-images.md says what a matrix holds"
    )


def test_matrix_that_makes_no_cell_is_rejected(matrix_file: Path, wheels: TorchWheels) -> None:
    edit(matrix_file, 'torch: ["2.6.0", "2.9.1", "2.13.0"]', 'torch: ["2.4.0"]')
    assert "the matrix makes no buildable cell" in error_of(matrix_file, wheels).line()


def test_include_that_cannot_work_is_an_error_at_its_line(matrix_file: Path, wheels: TorchWheels) -> None:
    matrix_file.write_text(
        matrix_file.read_text() + 'include:\n  - {torch: "2.9.1", base: bullseye, flavor: runtime}\n'
    )
    error = error_of(matrix_file, wheels)
    assert error.line() == (
        f"{matrix_file}:{line_of(matrix_file, 'base: bullseye, flavor')}: include[0]: "
        "this cell cannot work: torch 2.9.1 has no wheel for Python 3.9 (has 3.10-3.14)"
    )


def test_unknown_tag_template_field_lists_the_known_ones(matrix_file: Path, wheels: TorchWheels) -> None:
    edit(matrix_file, 'tag: "{torch}-', 'tag: "{pytorch}-')
    assert "tag: unknown field {pytorch}; use: {torch}" in error_of(matrix_file, wheels).line()


def test_flagship_must_match_exactly_one_cell(matrix_file: Path, wheels: TorchWheels) -> None:
    edit(
        matrix_file,
        'flagship: {torch: "2.9.1", base: bookworm, flavor: runtime}',
        'flagship: {torch: "2.13.0"}',
    )
    assert "flagship: must match exactly one buildable cell" in error_of(matrix_file, wheels).line()


def test_cli_prints_one_line_and_exits_2_without_traceback(matrix_file: Path) -> None:
    edit(matrix_file, "repository: torch", "repository: torch\nregistryy: x")
    result = subprocess.run(
        [sys.executable, "-m", "builder", "--matrix", str(matrix_file), "plan"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert re.match(rf"error: {re.escape(str(matrix_file))}:\d+: registryy: unknown key", lines[0])


def test_size_budgets_are_per_known_flavor_in_decimal_units(matrix_file: Path, wheels: TorchWheels) -> None:
    text = matrix_file.read_text()
    matrix_file.write_text(text + 'budgets:\n  runtime: {total: "5.6 GB", layer: "800 MB"}\n')
    budget = load_matrix(matrix_file, wheels).spec.budgets["runtime"]
    assert (budget.total, budget.layer) == ("5.6 GB", "800 MB")
    matrix_file.write_text(text + 'budgets:\n  runtime: {total: "5.6GiB"}\n')
    with pytest.raises(UserError, match=r"budgets\.runtime\.total: '5\.6GiB' is not valid; write a size such as"):
        load_matrix(matrix_file, wheels)
    matrix_file.write_text(text + 'budgets:\n  slim: {total: "5 GB"}\n')
    with pytest.raises(UserError, match=r"unknown flavor 'slim'"):
        load_matrix(matrix_file, wheels)


def test_a_cells_sibling_differs_only_in_flavor(matrix_file: Path, wheels: TorchWheels) -> None:
    grid = load_matrix(matrix_file, wheels)
    runtime = grid.cell("2.13.0-cu13.0-bookworm-runtime")
    sibling = grid.sibling(runtime, "devel")
    assert sibling is not None and sibling.name == "2.13.0-cu13.0-bookworm-devel"
    assert grid.sibling(grid.cell("2.9.1-cu12.8-bookworm-runtime"), "devel") is None  # rejected: no nvcc
    assert grid.sibling(runtime, "trtllm") is None


def test_devel_on_a_torch_whose_cuda_wheels_hold_no_nvcc_is_a_rejected_cell_saying_so(
    matrix_file: Path, wheels: TorchWheels
) -> None:
    """CUDA 12's nvidia-cuda-nvcc-cu12 holds ptxas but no nvcc: the sweep's six CUDA 12 devel
    cells failed at link-cuda-home.sh. Such a cell is rejected at plan time, with the reason."""
    reasons = {r.name: r.reason for r in load_matrix(matrix_file, wheels).rejected}
    assert reasons["2.9.1-bookworm-devel"] == (
        "the devel flavor needs nvcc: torch 2.9.1 pins CUDA 12.8's per-library wheels, and "
        "nvidia-cuda-nvcc-cu12 holds no nvcc; use torch 2.11 or later, or runtime"
    )
    assert "2.6.0-bookworm-devel" in reasons and "2.13.0-bookworm-devel" not in reasons
    matrix_file.write_text(matrix_file.read_text() + 'include:\n  - {torch: "2.9.1", base: bookworm, flavor: devel}\n')
    assert "include[0]: this cell cannot work: the devel flavor needs nvcc" in error_of(matrix_file, wheels).line()
