"""A non-editable install works from any directory: templates and data ship in the package."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_an_installed_builder_plans_and_checks_the_repository_from_another_directory(tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-cache-dir", "--target", str(target), str(REPO)],
        check=True, capture_output=True, cwd=tmp_path,
    )  # fmt: skip
    assert (target / "builder" / "_templates" / "Dockerfile.j2").is_file()
    assert (target / "builder" / "_data" / "torch_wheels.json").is_file()
    assert (target / "builder" / "_image" / "selftest.py").is_file()  # the build context's COPY sources
    assert (target / "builder" / "_image" / "gpu_peaks.json").is_file()
    assert (target / "builder" / "assemble" / "build.py").is_file()  # every stage's package ships
    assert not (target / "builder" / "_templates" / "__pycache__").exists()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target)}
    for command in (["plan", "--json"], ["render", "--check"], ["lock", "--check"]):
        result = subprocess.run(
            [sys.executable, "-m", "builder", "--matrix", str(REPO / "matrix.yaml"), *command],
            capture_output=True, text=True, cwd=elsewhere, env=env, check=False,
        )  # fmt: skip
        assert result.returncode == 0, (command, result.stdout[-500:], result.stderr[-500:])
    located = subprocess.run(
        [sys.executable, "-c", "from builder import paths; print(paths.TEMPLATES, paths.SELFTEST)"],
        capture_output=True, text=True, cwd=elsewhere, env=env, check=True,
    ).stdout.split()  # fmt: skip
    assert located == [str(target / "builder" / "_templates"), str(target / "builder" / "_image" / "selftest.py")]
