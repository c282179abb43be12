"""One image ID on every engine users run: Docker 29 (the containerd image store, its default, and
overlay2) started beside the host's engine, fresh, and stopped by PID afterwards.

The CPU cell is built through the CLI, as a user would, on an empty data root: it must give the
image ID recorded in images/<cell>/image-id, the same the host's engine gives (the `built`
fixture). The hosted-runner test (tests/integration/test_ci_runner.py) does that on the containerd
store, Docker 29's default: its cell job builds the cell there to the recorded ID and self-tests it,
and its rebuild job builds the staged tag again with BuildKit to the same ID; none of that is done a
second time here. On the containerd store the host's image is loaded and published to a loopback
registry, and verified from the registry alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from builder.engine import ids
from builder.plan.matrix import Matrix
from builder.publish import publish
from builder.publish.publisher import Records
from builder.repro import recorded
from harness import docker29
from tests.integration.conftest import REPO, BuiltCell, RunningRegistry
from tests.support import lowerlink

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module", params=docker29.STORES)
def engine29(request: pytest.FixtureRequest) -> Iterator[docker29.Engine]:
    store = request.param
    with docker29.running(store, fresh=True) as engine:
        yield engine
    docker29.remove(store)  # its data root: several GB


def _builder(engine: docker29.Engine, *arguments: str, timeout: int = 1200) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **engine.environment(), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "builder", *arguments],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _client(engine: docker29.Engine) -> docker.DockerClient:
    return docker.DockerClient(base_url=engine.docker_host, version="auto")


def _published_from_the_host(built: BuiltCell, smoke: object, registry: RunningRegistry, tmp_path: Path) -> str:
    """The cell as the host's engine (Docker 20.10) published it to a loopback registry. Only this
    platform's cells: the flagship's tag is a multi-arch one, which publish refuses to push for one
    platform alone (`--cell` with the flagship failed there)."""
    here = [cell for cell in built.grid.cells if cell.platform == built.cell.platform]
    grid = Matrix(built.grid.path, built.grid.spec.model_copy(update={"registry": registry.host}), here,
                  built.grid.rejected)  # fmt: skip
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{publish.TABLE_START}\n{publish.TABLE_END}\n")
    publish.publish(
        built.client, grid, [built.cell], lambda _: None, publish.PublishOptions(Records(tmp_path / "records", readme))
    )
    return f"{registry.host}/torch:{built.cell.tag}"


def test_docker_29_rebuilds_a_tag_the_host_published_to_its_recorded_image_id(
    engine29: docker29.Engine,
    built: BuiltCell,
    smoke_result: object,
    start_registry,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """The CPU cell published from Docker 20.10, rebuilt on Docker 29 through the CLI as a user
    would check a tag (`verify --rebuild`, no cache, an empty data root): the recorded image ID,
    the one the host's engine gave (issue 48: each engine rebuilds a tag another published)."""
    if engine29.store == "containerd":
        pytest.skip(
            "on the containerd store the hosted-runner test builds the cell to its recorded ID and rebuilds "
            "the tag it staged (test_ci_runner.py)"
        )
    client = _client(engine29)
    assert client.version()["Version"].startswith("29.")
    uses_containerd = any("containerd.snapshotter" in str(pair) for pair in client.info().get("DriverStatus") or [])
    assert not uses_containerd  # overlay2: the containerd store's reader is the lower-link test's, below
    record = recorded.read(built.cell)
    assert record is not None and built.image_id == record.image_id  # the host's engine gives it too
    reference = _published_from_the_host(built, smoke_result, start_registry(seeded=True), tmp_path)
    result = _builder(engine29, "verify", "--rebuild", reference)
    said = result.stdout + result.stderr  # progress lines go to stderr, the verdict to stdout
    assert result.returncode == 0, said[-3000:]
    assert f"rebuilt {reference}: the same image ID {record.image_id}" in said
    assert "Traceback" not in said
    # overlay2's layers are read from the folders the engine names (docker save first writes them
    # all out again).
    assert "the engine's layers read from the overlay2 driver's layer folders" in said
    rebuilt = f"torch-images/rebuild:{built.cell.name}"
    assert ids.config_digest(client, rebuilt) == record.image_id
    client.images.remove(rebuilt)


def _loaded_from_the_host(built: BuiltCell, engine: docker29.Engine) -> None:
    """The host's image of the cell, `docker save`d into Docker 29's `docker load`: the same
    canonical archive the builder's own normalizing pass loads into an engine after a build, so
    the engine holds what a build there leaves (the hosted-runner test builds it on this store)."""
    save = subprocess.Popen(["docker", "save", built.reference], stdout=subprocess.PIPE)
    environment = {**os.environ, **engine.environment()}
    load = subprocess.run(["docker", "load"], stdin=save.stdout, env=environment, capture_output=True, text=True,
                          timeout=900, check=False)  # fmt: skip
    assert save.stdout is not None
    save.stdout.close()
    assert save.wait(timeout=60) == 0 and load.returncode == 0, load.stderr[-2000:]
    assert ids.config_digest(_client(engine), built.reference) == built.image_id


def test_publish_and_verify_from_docker_29s_containerd_store(
    engine29: docker29.Engine,
    built: BuiltCell,
    start_registry,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    if engine29.store != "containerd":
        pytest.skip("publish is tried on Docker 29's default store")
    _loaded_from_the_host(built, engine29)
    registry: RunningRegistry = start_registry()
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text((REPO / "matrix.yaml").read_text().replace("registry: ", f"registry: {registry.host}  # ", 1))
    (tmp_path / "images").symlink_to(REPO / "images")
    arguments = ["--matrix", str(matrix)]
    published = _builder(engine29, *arguments, "publish", "push", built.cell.name)
    assert published.returncode == 0, published.stdout[-3000:] + published.stderr[-3000:]
    verified = _builder(engine29, *arguments, "verify", f"{registry.host}/torch:{built.cell.tag}")
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]
    assert built.image_id[7:19] in verified.stdout + verified.stderr
    # Publishing again finds the same image in the registry: nothing is pushed.
    again = _builder(engine29, *arguments, "publish", "push", built.cell.name)
    assert again.returncode == 0 and "unchanged" in again.stdout + again.stderr, again.stdout[-2000:]
    # Not rebuilt by the host's engine here: `verify` just found the host's image ID on this tag,
    # and test_publish.py's `verify --rebuild` builds the host's own tag to that ID (a full build).


def test_a_step_linking_a_lower_layers_file_reads_the_same_from_docker_29s_containerd_store(
    engine29: docker29.Engine, built: BuiltCell
) -> None:
    if engine29.store != "containerd":
        pytest.skip("the content store's reader is Docker 29's containerd store's")
    image_id, source, said = lowerlink.build_and_normalize(_client(engine29), built.grid, built.cell)
    assert (source, said) == ("containerd's content store", "linked")
    if built.cell.name in lowerlink.RECORDED:  # test_copied_up_link ran on the host's engine first
        assert image_id == lowerlink.RECORDED[built.cell.name]
