"""Rendering: golden Dockerfiles per flavor, headers, and drift detection."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from builder.facts.compat import TorchWheels
from builder.lock import debian, inputs
from builder.lock import requirements as lock
from builder.plan.matrix import Matrix, load_matrix
from builder.render import render
from builder.repro import normalize
from tests.conftest import lock_entry
from tests.unit.test_debs import pinned
from tests.unit.test_lock import CU130_LOCK_TEXT, LOCK_TEXT

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
NUMPY = lock_entry("numpy", "2.4.6", "c" * 64)
DEBIAN = pinned(("g++=4:12.2.0-3", "python3=3.11.2-1+b1"), ("htop=3.2.2-2",))


@pytest.fixture
def grid(matrix_file: Path, wheels: TorchWheels) -> Matrix:
    grid = load_matrix(matrix_file, wheels)
    for cell in grid.cells:
        directory = cell.directory
        directory.mkdir(parents=True)
        (directory / lock.STACK_LOCK).write_text(
            (
                CU130_LOCK_TEXT
                if cell.torch.cuda_toolkit
                else LOCK_TEXT.replace("torch==2.9.1", f"torch=={cell.torch.version}")
            )
            + NUMPY
        )
        (directory / debian.DEBIAN_LOCK).write_text(DEBIAN.text(debian.fingerprint(cell)))
        if cell.flavor == "devel":
            (directory / lock.FLAVOR_LOCK).write_text(lock_entry("py-spy", "0.4.3", "d" * 64))
    return grid


@pytest.mark.parametrize("name", ["2.13.0-cu13.0-bookworm-runtime", "2.13.0-cu13.0-bookworm-devel"])
def test_rendered_dockerfile_matches_the_golden_file(grid: Matrix, name: str) -> None:
    text = render.rendered(inputs.read(grid.cell(name), grid), grid)[grid.cell(name).directory / "Dockerfile"]
    golden = GOLDEN / f"{name}.Dockerfile"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert text == golden.read_text()


def test_every_generated_file_says_it_is_generated(grid: Matrix) -> None:
    for cell in grid.cells:
        for path, text in render.rendered(inputs.read(cell, grid), grid).items():
            assert render.NOTICE in text.splitlines()[0] or render.NOTICE in text[:200], path


def test_layers_are_shared_by_cells_that_differ_only_in_flavor(grid: Matrix) -> None:
    runtime = render.rendered(inputs.read(grid.cell("2.13.0-cu13.0-bookworm-runtime"), grid), grid)
    devel = render.rendered(inputs.read(grid.cell("2.13.0-cu13.0-bookworm-devel"), grid), grid)
    runtime_lines = next(iter(runtime.values())).split("# ---- flavor")[0].splitlines()[4:]
    devel_lines = next(iter(devel.values())).split("# ---- flavor")[0].splitlines()[4:]
    strip = [line.replace("devel", "runtime") for line in devel_lines]
    assert [line for line in runtime_lines if "COPY images/" not in line] == [
        line for line in strip if "COPY images/" not in line
    ]


def test_drift_is_reported_after_a_hand_edit_and_cleared_by_render(grid: Matrix) -> None:
    assert len(render.drift(grid.cells, grid)) == 2 * len(grid.cells)  # nothing rendered yet: Dockerfile, spec.json
    render.render(grid.cells, grid)
    assert render.drift(grid.cells, grid) == []
    dockerfile = grid.cells[0].directory / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "RUN echo hand edit\n")
    assert render.drift(grid.cells, grid) == [f"{dockerfile} differs from a fresh render"]


def test_render_without_a_lock_says_to_lock_first(grid: Matrix) -> None:
    cell = grid.cells[0]
    (cell.directory / lock.STACK_LOCK).unlink()
    assert render.drift([cell], grid) == [
        f"{cell.directory / lock.STACK_LOCK} is missing; run `python -m builder lock {cell.name}` first"
    ]


def test_trtllm_flavor_renders_its_system_packages_lock_and_cuda_home(matrix_file: Path, wheels: TorchWheels) -> None:
    from tests.unit.test_trtllm import RELEASES, with_cuda13_index

    with_cuda13_index(matrix_file, wheels)
    text = matrix_file.read_text().replace('python: "3.11"', 'python: "3.12"')
    entry = '{torch: "2.9.1", base: bookworm, flavor: trtllm, trtllm: "1.2.1", index: cu130}'
    matrix_file.write_text(text + f"include:\n  - {entry}\n")
    grid = load_matrix(matrix_file, wheels, RELEASES)
    cell = grid.cell("2.9.1-cu13.0-bookworm-trtllm1.2.1")
    cell.directory.mkdir(parents=True)
    (cell.directory / lock.STACK_LOCK).write_text(LOCK_TEXT)
    (cell.directory / debian.DEBIAN_LOCK).write_text(
        pinned(("gcc=4:12.2.0-3",), ("openmpi-bin=4.1.4-3+b1",)).text(debian.fingerprint(cell))
    )
    (cell.directory / lock.FLAVOR_LOCK).write_text(lock_entry("tensorrt-llm", "1.2.1", "e" * 64))
    dockerfile = render.rendered(inputs.read(cell, grid), grid)[cell.directory / "Dockerfile"]
    flavor_part = dockerfile.split("# ---- flavor trtllm")[1].split("# ---- self-test")[0]
    for expected in ("openmpi-bin=4.1.4-3+b1", "libpython3-dev", "/opt/torch-images/flavor.lock", "CUDA_HOME"):
        assert expected in flavor_part, expected
    assert 'io.torch-images.tensorrt-llm="1.2.1"' in dockerfile


def test_moving_one_package_changes_only_its_layers_step_and_the_lock_record(grid: Matrix) -> None:
    # Each torch-stack step names only its own part of the lock (by sha256), so the engine's cache
    # key of every other step stays: a fix to numpy rebuilds one package layer, not the stack.
    cell = grid.cell("2.13.0-cu13.0-bookworm-runtime")
    read = inputs.read(cell, grid)
    original = read.stack
    assert original is not None

    def with_stack(text: str) -> inputs.CellLocks:
        stack = dataclasses.replace(original, text=text, packages=lock.parse_lock(text, original.path))
        return dataclasses.replace(read, stack=stack)

    # jinja2: in no fact of the cell's spec.json (numpy would also move the self-test's step, whose spec names it)
    before = with_stack(original.text + lock_entry("jinja2", "3.1.5", "e" * 64))
    after = with_stack(original.text + lock_entry("jinja2", "3.1.6", "f" * 64))

    def steps(locks: inputs.CellLocks) -> list[str]:
        return normalize.dockerfile_steps(render.rendered(locks, grid)[cell.directory / "Dockerfile"])

    old, new = steps(before), steps(after)
    assert len(old) == len(new)
    changed = [(a, b) for a, b in zip(old, new, strict=True) if a != b]
    assert len(changed) == 2, [a[:80] for a, _ in changed]
    layer_step, record_step = changed
    assert "requirements.rest.lock" in layer_step[0] and "requirements.rest.lock" in layer_step[1]
    assert "/opt/torch-images/requirements.lock" in record_step[0] and "pip freeze" in record_step[0]
    unchanged_layers = [step for step in new if "requirements." in step and ".lock" in step and step in old]
    assert any("requirements.torch.lock" in step for step in unchanged_layers)


def test_each_layer_lock_holds_exactly_its_groups_entries(grid: Matrix) -> None:
    locks = inputs.read(grid.cell("2.13.0-cu13.0-bookworm-runtime"), grid)
    assert locks.stack is not None
    layers = dict(locks.stack_layers)
    assert sorted(name for part in layers.values() for name in part.packages) == sorted(locks.stack.packages)
    assert list(layers["torch"].packages) == ["torch"]
    assert lock.parse_lock(layers["torch"].text, layers["torch"].path) == {"torch": locks.stack.packages["torch"]}
    assert all(part in locks.python_locks for part in layers.values())
