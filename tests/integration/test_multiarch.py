"""A multi-arch tag end to end: the arm64 cell built and self-tested under emulation, both
platforms published as one OCI index to a real registry, and each pulled back by platform and
run. Opt-in (`-m emulation`): the arm64 build takes about 6 minutes here and its self-test
runs Python under qemu."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest

from builder.assemble import build, smoke
from builder.engine import emulation
from builder.errors import UserError
from builder.oci.registry import OCI_INDEX
from builder.plan.cell import Cell
from builder.plan.matrix import Matrix, load_matrix
from builder.publish import multiarch, publish, staging
from builder.publish.publisher import Publisher, Records
from builder.wheelhouse import wheelhouse
from tests.integration.conftest import RunningRegistry

# arm64 under qemu: a base bootstrap, a 20-minute build, a self-test of about 8 minutes.
# As on a machine that never had Debian's qemu-user-static (the builder needs none of it).
pytestmark = [
    pytest.mark.integration,
    pytest.mark.emulation,
    pytest.mark.timeout(3600),
    pytest.mark.usefixtures("without_host_qemu"),
]

REPO = Path(__file__).resolve().parents[2]
MATRIX = REPO / "tests/fixtures/multiarch.yaml"
# What each platform's image holds: PyPI's aarch64 torch 2.9.1 and the local x86_64 2.13.0+cpu.
PROBE = "import platform, torch; print(platform.machine(), torch.__version__)"


@pytest.fixture(scope="module")
def grid() -> Matrix:
    if emulation.host_architecture() != "amd64":
        pytest.skip("this test emulates arm64 on an x86 host")
    return load_matrix(MATRIX)


@pytest.fixture(scope="module")
def both_built(client: docker.DockerClient, grid: Matrix) -> Iterator[dict[str, str]]:
    """Each platform's image built and self-tested: cell name -> image ID."""
    built: dict[str, str] = {}
    for cell in grid.platforms_of(grid.flagship):
        result = build.build_cell(client, grid, build.preflight(cell, grid), wheelhouse.Wheelhouse(), print)
        assert result.status in ("built", "unchanged"), result.detail
        built[cell.name] = result.image_id
    yield built


def _arm64(grid: Matrix) -> Cell:
    return next(c for c in grid.platforms_of(grid.flagship) if c.platform == "linux/arm64")


def test_the_arm64_cell_builds_under_emulation_as_an_arm64_image(
    client: docker.DockerClient, grid: Matrix, both_built: dict[str, str]
) -> None:
    cell = _arm64(grid)
    image = client.images.get(both_built[cell.name])
    assert (image.attrs["Architecture"], image.attrs.get("Variant"), image.attrs["Os"]) == ("arm64", "v8", "linux")
    output = client.containers.run(image.id, ["python3", "-c", PROBE], remove=True, network_mode="none")
    assert output.decode().split() == ["aarch64", "2.9.1+cpu"]


def test_the_arm64_self_test_passes_under_emulation(
    client: docker.DockerClient, grid: Matrix, both_built: dict[str, str]
) -> None:
    for cell in grid.platforms_of(grid.flagship):
        result = smoke.run(client, build.local_reference(grid, cell), gpus=False)
        assert result.status == "pass", (cell.name, result.report.get("failed"), result.report.get("error"))
        assert result.report["image_id"] == both_built[cell.name]


def _records(tmp_path: Path) -> Records:
    return Records(tmp_path / "records", tmp_path / "README.md")


def _options(tmp_path: Path) -> publish.PublishOptions:
    return publish.PublishOptions(_records(tmp_path))


@pytest.fixture
def ready(
    client: docker.DockerClient,
    grid: Matrix,
    both_built: dict[str, str],
    start_registry: Callable[[], RunningRegistry],
) -> tuple[list[Cell], Matrix, RunningRegistry]:
    """Both platforms' cells, each with a passing self-test for exactly its image (the gate wants
    one), and the matrix pointed at a fresh registry."""
    registry = start_registry()
    cells = grid.platforms_of(grid.flagship)
    for cell in cells:
        if smoke.passing_report(both_built[cell.name]) is None:
            assert smoke.run(client, build.local_reference(grid, cell), gpus=False).status == "pass"
    here = Matrix(grid.path, grid.spec.model_copy(update={"registry": registry.host}), grid.cells, grid.rejected)
    return cells, here, registry


def test_both_platforms_publish_as_one_index_and_each_pulls_back_and_runs(
    client: docker.DockerClient,
    grid: Matrix,
    both_built: dict[str, str],
    ready: tuple[list[Cell], Matrix, RunningRegistry],
    tmp_path: Path,
) -> None:
    cells, here, registry = ready
    with pytest.raises(UserError, match=r"publish .* together with"):
        publish.publish(client, here, [cells[1]], print, _options(tmp_path))
    api, repository = registry.api(), grid.spec.repository
    assert api.manifest(repository, cells[1].tag) is None  # refused before anything was pushed

    items = publish.publish(client, here, cells, print, _options(tmp_path))

    tag = cells[0].tag
    index = api.manifest(repository, tag)
    assert index is not None and index.media_type == OCI_INDEX
    listed = json.loads(index.body)["manifests"]
    assert [(m["platform"]["architecture"], m["digest"]) for m in listed] == [
        (item.cell.arch, item.digest) for item in items
    ]
    for item in items:
        assert item.points_to == index.digest
        assert api.manifest(repository, multiarch.image_tag(here, item.cell)).digest == item.digest  # type: ignore[union-attr]
        assert set(api.attached(repository, item.digest)) == set(publish.ARTIFACT_TYPES.values())
        record = json.loads((tmp_path / "records" / f"{item.cell.name}.json").read_text())
        assert (record["digest"], record["platform"], record["image"]["digest"]) == (
            index.digest, item.cell.platform, item.digest,
        )  # fmt: skip
    for alias in cells[0].aliases:
        assert api.manifest(repository, alias).digest == index.digest  # type: ignore[union-attr]
    # verify's first line names the index, the digest a cluster pins for a multi-arch tag.
    checked = subprocess.run(
        [sys.executable, "-m", "builder", "--matrix", str(here.path), "verify", f"{registry.host}/{repository}:{tag}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    first = checked.stdout.splitlines()[0]
    assert first.endswith(f"-> {index.digest} (an index of 2 platforms; each node pulls its own)"), checked.stdout

    # Each platform pulled back by the index's tag: the same image that was built and tested.
    expected = {"linux/amd64": ["x86_64", "2.13.0+cpu"], "linux/arm64": ["aarch64", "2.9.1+cpu"]}
    remote = f"{registry.host}/{repository}"
    for cell in cells:
        for name in (f"{remote}:{tag}", f"{remote}:{multiarch.image_tag(here, cell)}"):
            with contextlib.suppress(docker.errors.ImageNotFound):
                client.images.remove(name)
        pulled = client.images.pull(remote, tag=tag, platform=cell.platform)
        assert pulled.id == both_built[cell.name]
        output = client.containers.run(pulled.id, ["python3", "-c", PROBE], remove=True, network_mode="none")
        assert output.decode().split() == expected[cell.platform]

    # Publishing again changes nothing: same images, same index.
    again = publish.publish(client, here, cells, print, _options(tmp_path))
    assert all(item.unchanged and not item.moved_aliases for item in again)
    assert {item.points_to for item in again} == {index.digest}


def test_ci_stages_each_platform_alone_and_promotion_makes_the_index(
    client: docker.DockerClient,
    grid: Matrix,
    ready: tuple[list[Cell], Matrix, RunningRegistry],
    tmp_path: Path,
) -> None:
    cells, here, registry = ready
    api, repository, say = registry.api(), grid.spec.repository, lambda _: None
    # Each platform's CI job stages its own cell (on its own machine, in CI); no tag moves.
    publisher = Publisher(api, here, say, client)
    staged = {cell.name: staging.stage(publisher, [cell], "m1")[0] for cell in cells}
    assert api.manifest(repository, cells[0].tag) is None
    with pytest.raises(UserError, match=r"promote .* together with"):
        staging.promote(publisher, [cells[0]], "m1", _records(tmp_path))
    items = staging.promote(publisher, cells, "m1", _records(tmp_path))
    index = api.manifest(repository, cells[0].tag)
    assert index is not None and index.media_type == OCI_INDEX
    assert [m["digest"] for m in json.loads(index.body)["manifests"]] == [staged[c.name].digest for c in cells]
    assert {item.points_to for item in items} == {index.digest}
    assert all(api.manifest(repository, a).digest == index.digest for a in cells[0].aliases)  # type: ignore[union-attr]
