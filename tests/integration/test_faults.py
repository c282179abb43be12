"""Faults (issue 58), on the real engine: a build stopped by SIGTERM (a CI cancel, a timeout) or
SIGINT (Ctrl-C) in its engine steps, its canonical pass or its self-test ends in one line with the
signal's status, leaves no step image, container, scratch folder or moved tag behind, and the same
command then builds. Opt-in (`-m faults`): each case runs the CPU cell's steps, minutes."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest

from builder import paths
from builder.assemble import build
from builder.engine import daemon
from builder.plan import matrix
from harness import docker29

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
CELL = "2.13.0-cpu-bookworm-runtime"
STEP = re.compile(r"Step (\d+)/(\d+)")
SHA256 = re.compile(r"sha256:([0-9a-f]{64})")


def halfway_through_the_steps(line: str) -> bool:
    step = STEP.search(line)
    return step is not None and int(step.group(1)) >= int(step.group(2)) // 2  # some steps done, one running


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


def _cut_when(
    command: list[str], when: Callable[[str], bool], cut: Callable[[subprocess.Popen[str]], None]
) -> tuple[int, str]:
    """Run `command`, and at the first line of its output that `when` picks, `cut` it (a signal,
    the engine stopped); returns its status and all it said. A session of its own, as a shell job
    is: a signal reaches the builder alone, not inherited as ignored."""
    running = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    assert running.stdout is not None
    said = []
    for line in running.stdout:
        said.append(line)
        if when(line):
            cut(running)
            break
    assert said and when(said[-1]), "the command never reached the point: " + "".join(said)[-3000:]
    said += running.stdout.readlines()
    return running.wait(timeout=300), "".join(said)


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
    code, said = _cut_when(command, when, lambda running: running.send_signal(stop))
    assert code == status, said[-3000:]
    last = [line for line in said.splitlines() if line.strip()][-1]
    assert says in last and "Traceback" not in said, said[-3000:]
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


@contextlib.contextmanager
def _cache_of_size(tmp_path: Path, size: str) -> Iterator[Path]:
    """The builder's cache on a filesystem of its own, of `size`."""
    mount = tmp_path / "cache"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=False)


@pytest.fixture
def small_cache(tmp_path: Path) -> Iterator[Path]:
    """Too small for the CPU cell's wheels (235 MB)."""
    with _cache_of_size(tmp_path, "96m") as mount:
        yield mount


@pytest.fixture
def cache_for_the_wheels_alone(tmp_path: Path) -> Iterator[Path]:
    """Room for the CPU cell's wheels and indexes, not for the canonical pass's largest layer (745 MB)."""
    with _cache_of_size(tmp_path, "500m") as mount:
        yield mount


def _fills_then_builds_with_room(client: docker.DockerClient, cache: Path, reached: str = "") -> None:
    """Build the CPU cell without cache on a cache filesystem too small for it: one line, status 2,
    no `.part-` or scratch file in the cache, the engine and the tag as they were; with the
    filesystem grown, the same command builds. `reached`: a line the build must have said first."""
    grid = matrix.load_matrix(REPO / "matrix.yaml")
    reference = build.local_reference(grid, grid.cell(CELL))
    tagged_before = _tagged(client, reference)
    images_before, containers_before = _engine_state(client)
    command = [sys.executable, "-m", "builder", "build", "--no-cache", "--no-smoke", CELL]
    env = {**os.environ, "TORCH_IMAGES_CACHE": str(cache)}
    full = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500, env=env)
    said = (full.stdout + full.stderr).strip()
    assert reached in said, f"the disk filled before {reached!r}: " + said[-3000:]
    assert full.returncode == 2, said[-3000:]
    assert "Traceback" not in said and said.splitlines()[-1].startswith("error: the disk is full"), said[-3000:]
    scrap = [str(p) for p in cache.rglob("*") if p.name.startswith((".part-", "tmp"))]
    assert scrap == [], scrap
    assert _tagged(client, reference) == tagged_before
    assert _engine_state(client) == (images_before, containers_before)
    subprocess.run(["mount", "-o", "remount,size=4g", str(cache)], check=True)
    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500, env=env)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]


def test_a_build_whose_cache_disk_fills_up_ends_in_one_line_and_leaves_no_partial_file(
    client: docker.DockerClient, small_cache: Path
) -> None:
    """A full disk (here the cache's, 96 MB, while the wheels are copied in) ends the build in one
    line with status 2 and no traceback; no partial file stays in the cache and no tag moves. With
    room made (the same filesystem grown), the same command builds."""
    _fills_then_builds_with_room(client, small_cache)


def test_a_canonical_pass_whose_cache_disk_fills_up_puts_the_tag_back_and_leaves_no_image_or_scrap(
    client: docker.DockerClient, cache_for_the_wheels_alone: Path
) -> None:
    """The cache's disk fills while the canonical pass writes a layer: one line, status 2, the
    cell's tag on what it named before, no raw image, step or scratch file left; with room
    made, the same command builds."""
    _fills_then_builds_with_room(client, cache_for_the_wheels_alone, reached="the canonical pass")


def _stop_dockerd() -> None:
    """Stop the engine as a host's service manager or an upgrade does (SIGTERM to dockerd)."""
    pid = int(Path("/var/run/docker.pid").read_text())
    os.kill(pid, signal.SIGTERM)
    for _ in range(120):
        if not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.5)
    raise AssertionError("dockerd did not stop within a minute")


def test_a_build_whose_engine_restarts_under_it_ends_in_one_line_and_builds_again(client: docker.DockerClient) -> None:
    """dockerd stopped halfway through the engine steps, then started again: the build ends as a
    failed one or in one line (no traceback), no tag moved, and the same command builds. What the engine kept
    of the cut build (it cannot be removed while the engine is down) is counted for docs/faults.md."""
    grid = matrix.load_matrix(REPO / "matrix.yaml")
    reference = build.local_reference(grid, grid.cell(CELL))
    tagged_before = _tagged(client, reference)
    images_before, _ = _engine_state(client)
    command = [sys.executable, "-m", "builder", "build", "--no-cache", "--no-smoke", CELL]
    try:
        code, text = _cut_when(command, halfway_through_the_steps, lambda _: _stop_dockerd())
    finally:
        daemon.ensure_running(install=False)
    # Stopping, the engine either ends the build with its own error (a failed build: status 1, its
    # summary) or drops the connection (status 2, one line); measured, both happen.
    assert code in (1, 2) and "Traceback" not in text, text[-3000:]
    ending = "2.13.0-cpu-bookworm-runtime: failed (" if code == 1 else "the engine's connection broke"
    assert ending in text, text[-3000:]
    assert _tagged(client, reference) == tagged_before
    kept = _engine_state(client)[0] - images_before
    print(f"the engine kept {len(kept)} images of the cut build")  # docs/faults.md's figure (-s shows it)
    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]


def test_two_builds_of_one_cell_at_once_both_end_at_the_recorded_image_and_leave_no_step(
    client: docker.DockerClient,
) -> None:
    """Two CI jobs (or a user and the tests) building one cell on one machine at once: the second
    waits for the first's wheelhouse address, both end at the cell's recorded image ID under its
    tag, and neither leaves a step image or a container."""
    grid = matrix.load_matrix(REPO / "matrix.yaml")
    cell = grid.cell(CELL)
    reference = build.local_reference(grid, cell)
    images_before, containers_before = _engine_state(client)
    command = [sys.executable, "-m", "builder", "build", "--no-cache", "--no-smoke", CELL]
    both = [subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for _ in range(2)]  # fmt: skip
    outputs = [running.communicate(timeout=1500)[0] for running in both]
    for running, said in zip(both, outputs, strict=True):
        assert running.returncode == 0 and "Traceback" not in said, said[-3000:]
    assert any("another build on this machine serves its wheelhouse" in said for said in outputs)
    recorded_id = cell.file("image-id").read_text().split()[0]
    assert _tagged(client, reference) == recorded_id
    images_after, containers_after = _engine_state(client)
    assert images_after - images_before <= {recorded_id} and containers_after == containers_before


def _bootstrap_leftovers() -> set[str]:
    """What a bootstrap leaves when it is not let finish: mmdebstrap's processes, its folders in
    the temporary directory, and mounts under them."""
    temporary = Path(tempfile.gettempdir())
    folders = {str(p) for pattern in ("mmdebstrap.*", "torch-images-base-*") for p in temporary.glob(pattern)}
    running = subprocess.run(["pgrep", "-a", "mmdebstrap"], capture_output=True, text=True).stdout.splitlines()
    mounts = [line for line in Path("/proc/mounts").read_text().splitlines() if "mmdebstrap" in line]
    return folders | set(running) | set(mounts)


def test_a_build_stopped_in_its_bootstrap_leaves_no_process_folder_or_mount_and_builds_again(
    client: docker.DockerClient,
) -> None:
    """SIGTERM two seconds into the base's bootstrap (the engine's base image removed, the cached
    root filesystem forgotten): the whole bootstrap tool stops and cleans up, no base is loaded,
    and the same command bootstraps and builds."""
    grid = matrix.load_matrix(REPO / "matrix.yaml")
    cell = grid.cell(CELL)
    reference = build.local_reference(grid, cell)
    base_tag = build.locked_base_tag(build.preflight(cell, grid))
    with contextlib.suppress(docker.errors.ImageNotFound):
        client.images.remove(base_tag)
    tagged_before, leftovers_before = _tagged(client, reference), _bootstrap_leftovers()
    command = [sys.executable, "-m", "builder", "build", "--fresh-base", "--no-cache", "--no-smoke", CELL]

    def two_seconds_in(running: subprocess.Popen[str]) -> None:
        time.sleep(2)
        running.send_signal(signal.SIGTERM)

    code, text = _cut_when(command, lambda line: "bootstrapping" in line, two_seconds_in)
    assert code == 143 and "Traceback" not in text, text[-3000:]
    assert _bootstrap_leftovers() <= leftovers_before, _bootstrap_leftovers() - leftovers_before
    assert _tagged(client, base_tag) is None and _tagged(client, reference) == tagged_before
    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]


def test_a_build_stopped_while_it_downloads_its_wheels_leaves_no_partial_file_and_builds_again(
    client: docker.DockerClient, tmp_path: Path
) -> None:
    """SIGTERM three seconds into the wheels' download (a cache of its own, empty, so torch's CPU
    wheel comes from PyPI): no `.part-` file, no step image, no moved tag; the same command then
    downloads and builds."""
    grid = matrix.load_matrix(REPO / "matrix.yaml")
    reference = build.local_reference(grid, grid.cell(CELL))
    tagged_before = _tagged(client, reference)
    images_before, containers_before = _engine_state(client)
    cache = tmp_path / "cache"
    command = [sys.executable, "-m", "builder", "build", "--no-cache", "--no-smoke", CELL]
    environment = {**os.environ, "TORCH_IMAGES_CACHE": str(cache)}

    def three_seconds_in(running: subprocess.Popen[str]) -> None:
        time.sleep(3)
        running.send_signal(signal.SIGTERM)

    previous = os.environ.get("TORCH_IMAGES_CACHE")
    os.environ["TORCH_IMAGES_CACHE"] = str(cache)  # what _cut_when's process gets
    try:
        code, said = _cut_when(command, lambda line: "fetching and verifying wheels" in line, three_seconds_in)
    finally:
        if previous is None:
            os.environ.pop("TORCH_IMAGES_CACHE")
        else:
            os.environ["TORCH_IMAGES_CACHE"] = previous
    assert code == 143 and "Traceback" not in said, said[-3000:]
    assert "terminated" in [line for line in said.splitlines() if line.strip()][-1], said[-2000:]
    partial = [str(p) for p in cache.rglob("*") if p.name.startswith(".part-")]
    assert partial == [], partial
    locked = {sha for lock in grid.cell(CELL).directory.glob("*.lock") for sha in SHA256.findall(lock.read_text())}
    fetched = {p.parent.name for p in (cache / "wheelhouse" / "sha256").glob("*/*/*") if p.is_file()}
    assert locked - fetched, "every locked file was fetched before the signal: cut earlier"
    assert _tagged(client, reference) == tagged_before
    assert _engine_state(client) == (images_before, containers_before)
    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500, env=environment)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]


@pytest.fixture
def engine_on_a_small_disk() -> Iterator[docker29.Engine]:
    """A fresh Docker 29 (overlay2) whose data root is a 900 MB filesystem: room for the base, not
    for the CPU cell's steps (1.15 GB)."""
    engine = docker29.Engine("overlay2", "small")
    docker29.remove("overlay2", "small")
    data_root = engine.state / "docker"
    data_root.mkdir(parents=True)
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=900m", "tmpfs", str(data_root)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {made.stderr.decode().strip()}")
    try:
        yield docker29.start("overlay2", "small")
    finally:
        docker29.remove("overlay2", "small")  # stops it and unmounts the data root


def test_a_build_whose_engine_disk_fills_up_fails_in_one_line_leaves_no_step_and_builds_with_room(
    engine_on_a_small_disk: docker29.Engine,
) -> None:
    """The engine's own disk (its data root) full halfway through the steps: the build fails with
    the engine's "no space left on device" and no traceback, no tag and no step image are left, and
    with the filesystem grown the same command builds the recorded image ID."""
    engine = engine_on_a_small_disk
    environment = {**os.environ, **engine.environment()}
    command = [sys.executable, "-m", "builder", "build", "--no-cache", "--no-smoke", CELL]
    small = docker.DockerClient(base_url=engine.docker_host, version="auto")
    cell = matrix.load_matrix(REPO / "matrix.yaml").cell(CELL)
    reference = build.local_reference(matrix.load_matrix(REPO / "matrix.yaml"), cell)
    full = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500, env=environment)
    said = full.stdout + full.stderr
    assert full.returncode in (1, 2) and "Traceback" not in said, said[-3000:]
    assert "no space left on device" in " ".join(said.split()).lower(), said[-3000:]  # the summary wraps it
    assert _tagged(small, reference) is None
    left = [image.id for image in small.images.list(all=True) if not image.tags]
    assert left == [], f"{len(left)} untagged step images left"
    assert small.containers.list(all=True) == []
    subprocess.run(["mount", "-o", "remount,size=6g", str(engine.state / "docker")], check=True)
    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500, env=environment)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    assert _tagged(small, reference) == cell.file("image-id").read_text().split()[0]
