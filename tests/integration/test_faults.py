"""Faults (issue 58), on the real engine: a build stopped by SIGTERM (a CI cancel, a timeout) or
SIGINT (Ctrl-C) in its engine steps, its canonical pass or its self-test ends in one line with the
signal's status, leaves no step image, container, scratch folder or moved tag behind, and the same
command then builds. Opt-in (`-m faults`): each case runs the CPU cell's steps, minutes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import docker
import pytest

from builder import paths
from builder.assemble import build
from builder.plan import matrix

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
CELL = "2.13.0-cpu-bookworm-runtime"
STEP = re.compile(r"Step (\d+)/(\d+)")


def halfway_through_the_steps(line: str) -> bool:
    step = STEP.search(line)
    return bool(step) and int(step.group(1)) >= int(step.group(2)) // 2  # some steps done, one running


def in_the_canonical_pass(line: str) -> bool:
    return "the engine's layers read from" in line  # the raw image tagged, its layers being rewritten


def in_the_self_test(line: str) -> bool:
    return "running the self-test in the image" in line


def _scratch_folders() -> set[Path]:
    """What a pass keeps its temporary files in, under the builder's cache."""
    return {path for name in ("layers", "zstd") for path in paths.cache_dir(name).glob("tmp*")}


def _engine_state(client: docker.DockerClient) -> tuple[set[str], set[str]]:
    return {i.id for i in client.images.list(all=True)}, {c.id for c in client.containers.list(all=True)}


def _tagged(client: docker.DockerClient, reference: str) -> str | None:
    try:
        return str(client.images.get(reference).id)
    except docker.errors.ImageNotFound:
        return None


@pytest.mark.parametrize(
    ("stop", "status", "says", "when"),
    [
        (signal.SIGTERM, 143, "terminated", halfway_through_the_steps),
        (signal.SIGINT, 130, "interrupted", halfway_through_the_steps),
        (signal.SIGTERM, 143, "terminated", in_the_canonical_pass),
        (signal.SIGTERM, 143, "terminated", in_the_self_test),
    ],
    ids=["SIGTERM-steps", "SIGINT-steps", "SIGTERM-canonical-pass", "SIGTERM-self-test"],
)
def test_a_build_stopped_in_any_phase_leaves_nothing_and_builds_again(
    client: docker.DockerClient, stop: signal.Signals, status: int, says: str, when: Callable[[str], bool]
) -> None:
    grid = matrix.load_matrix(REPO / "matrix.yaml")
    reference = build.local_reference(grid, grid.cell(CELL))
    tagged_before = _tagged(client, reference)
    images_before, containers_before = _engine_state(client)
    scratch_before = _scratch_folders()
    smoke = [] if when is in_the_self_test else ["--no-smoke"]
    command = [sys.executable, "-m", "builder", "build", "--no-cache", *smoke, CELL]
    # A session of its own, as a shell job is: the signal reaches the builder alone, not inherited as ignored.
    running = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    assert running.stdout is not None
    said = []
    for line in running.stdout:
        said.append(line)
        if when(line):
            running.send_signal(stop)
            break
    assert said and when(said[-1]), "the build never reached the phase: " + "".join(said)[-3000:]
    said += running.stdout.readlines()
    assert running.wait(timeout=300) == status, "".join(said)[-3000:]
    last = [line for line in said if line.strip()][-1]
    assert says in last and "Traceback" not in "".join(said), "".join(said)[-3000:]
    images_after, containers_after = _engine_state(client)
    assert images_after - images_before == set(), "step images left behind"
    # ... and nothing that was there before is gone: the base the FROM names is no step of this build's
    assert images_before - images_after == set(), "the engine's own images removed"
    assert containers_after - containers_before == set(), "step containers left behind"
    assert _tagged(client, reference) == tagged_before  # the tag was never moved to an unfinished image
    assert _scratch_folders() <= scratch_before, "a pass's scratch folder left in the cache"
    if when is halfway_through_the_steps and stop == signal.SIGTERM:  # the same command, run again, builds
        again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
