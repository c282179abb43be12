"""A non-editable install works from any directory: templates and data ship in the package."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_the_builders_dependencies_are_locked_with_hashes_and_the_locks_match_pyproject() -> None:
    """Issues 35 and 39: the sessions (and so CI) install the builder's dependencies from these
    locks with --require-hashes; each dependency pyproject.toml declares is pinned there at a
    version its specifier allows. `nox -s lock_builder` writes them again."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    for lock, wanted in (
        ("builder.lock", project["dependencies"]),
        ("dev.lock", [*project["dependencies"], *extras["test"], *extras["lint"]]),
    ):
        text = (REPO / "requirements" / lock).read_text()
        pins = dict(re.findall(r"^([A-Za-z0-9._-]+)==([^ ;\\]+)", text, re.M))
        pins = {name.lower().replace("_", "-"): version for name, version in pins.items()}
        for line in wanted:
            requirement = Requirement(line)
            name = requirement.name.lower().replace("_", "-")
            assert name in pins, f"{lock} does not pin {name}; run `./nox -s lock_builder`"
            assert requirement.specifier.contains(pins[name], prereleases=True), f"{lock}: {name}=={pins[name]}"
        entries = re.split(r"\n(?=[A-Za-z0-9])", text.strip())
        assert entries and all("--hash=sha256:" in entry for entry in entries if "==" in entry), lock
    assert "--require-hashes -r requirements/nox.lock" in (REPO / "nox").read_text()
