"""The suite's two parts (tests/support/parts.py): each test in exactly one, so that the two runs
`nox -s tests` makes at once are the whole suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import parts

REPO = Path(__file__).resolve().parents[2]


def test_host_integration_tests_go_to_the_host_part_and_the_rest_beside() -> None:
    assert parts.part_of(["integration"]) == "host"
    assert parts.part_of(["integration", "network"]) == "host"
    assert parts.part_of(["integration", "beside"]) == "beside"
    assert parts.part_of([]) == "beside"
    assert parts.part_of(["network"]) == "beside"


def _collected(part: str | None) -> list[str]:
    env = {key: value for key, value in os.environ.items() if key != parts.VARIABLE}
    if part is not None:
        env[parts.VARIABLE] = part
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/integration", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=REPO, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [line for line in result.stdout.splitlines() if "::" in line]


def test_each_integration_test_is_collected_in_exactly_one_part() -> None:
    whole = _collected(None)
    host, beside = _collected("host"), _collected("beside")
    assert sorted(host + beside) == sorted(whole) and not set(host) & set(beside)
    assert any("test_ci_runner.py" in test for test in beside)  # it brings its own engine
    assert any("test_publish.py" in test for test in host)


def test_an_unknown_part_is_one_line_naming_the_parts() -> None:
    env = {**os.environ, parts.VARIABLE: "gpu"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/integration", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 4
    assert "TORCH_IMAGES_TESTS_PART='gpu': write one of host, beside, or unset it" in result.stderr
