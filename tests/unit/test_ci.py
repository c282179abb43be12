"""`python -m builder ci github|gitlab`: workflows that fan the matrix out, checked offline
against the CI systems' published schemas (check-jsonschema's built-in copies)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from builder.plan.matrix import load_matrix
from builder.render import ci

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = {"github": "vendor.github-workflows", "gitlab": "vendor.gitlab-ci"}


def _validate(system: str, text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / f"{system}.yml"
    path.write_text(text)
    command = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", SCHEMAS[system], str(path)]
    return subprocess.run(command, capture_output=True, text=True)


@pytest.fixture
def grid(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.chdir(REPO)
    return load_matrix(Path("matrix.yaml"))


@pytest.mark.parametrize("system", sorted(SCHEMAS))
def test_the_workflow_is_valid_for_its_ci_system_and_a_broken_one_is_not(system: str, grid, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    text = ci.workflow(grid, system)
    checked = _validate(system, text, tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # Control: the same workflow with a misspelt key fails the same check.
    broken = text.replace("runs-on:", "run-on:") if system == "github" else text.replace("stage: cells", "stages: 3")
    assert broken != text and _validate(system, broken, tmp_path).returncode != 0


def test_every_buildable_cell_is_a_job_and_promotion_waits_for_them_all(grid) -> None:  # type: ignore[no-untyped-def]
    github = yaml.safe_load(ci.workflow(grid, "github"))
    jobs = github["jobs"]["cell"]["strategy"]["matrix"]["include"]
    assert [job["cell"] for job in jobs] == [c.name for c in grid.cells]
    # each cell on a runner of its platform: arm64 cells build natively, not under emulation
    runners = {c.name: ci.RUNNERS[c.platform] for c in grid.cells}
    assert {job["cell"]: job["runner"] for job in jobs} == runners
    assert "ubuntu-24.04-arm" in runners.values() and github["jobs"]["cell"]["runs-on"] == "${{ matrix.runner }}"
    assert github["jobs"]["cell"]["strategy"]["fail-fast"] is False
    assert github["jobs"]["promote"]["needs"] == "cell"
    steps = [step.get("run", "") for step in github["jobs"]["cell"]["steps"]]
    assert any(run.startswith("./nox -s build -- --skip-existing") for run in steps)  # the session a user runs
    assert any("--stage --run ${{ github.run_id }}" in run for run in steps)
    promote = " ".join(step.get("run", "") for step in github["jobs"]["promote"]["steps"])
    assert "--promote --run ${{ github.run_id }} --all" in promote
    gitlab = yaml.safe_load(ci.workflow(grid, "gitlab"))
    by_arch = {entry["ARCH"]: entry["CELL"] for entry in gitlab["cell"]["parallel"]["matrix"]}
    assert by_arch == {arch: [c.name for c in grid.cells if c.arch == arch] for arch in ("amd64", "arm64")}
    assert gitlab["cell"]["tags"] == ["torch-images-$ARCH"]
    assert gitlab["promote"]["needs"] == ["cell"] and gitlab["promote"]["stage"] == "promote"


def test_another_matrix_is_named_in_every_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    text = ci.workflow(load_matrix(Path("examples/trtllm.yaml")), "github")
    commands = [line for line in text.splitlines() if "./nox -s" in line]
    assert commands and all("--matrix examples/trtllm.yaml " in line for line in commands)
