"""Integration fixtures: a real Docker engine, a real cell built from the shipped matrix.

The cell is `--cell NAME`, or by default torch's CPU build from the local wheel directory where
one is configured (this project's machines carry torch 2.13.0+cpu for Python 3.11 in
/opt/wheels); otherwise the flagship, whose CUDA wheels (about 3 GB) come from PyPI.

Everything the session adds to the engine is removed at its end: the images it built, the
engine's intermediate build steps, bases it bootstrapped, and anything a test left behind.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import pytest

from builder.assemble import build, smoke
from builder.engine import daemon
from builder.oci.registry import Registry
from builder.plan import matrix
from builder.plan.cell import Cell
from builder.wheelhouse import wheelhouse
from harness import loopback, registry_fixtures
from tests import engine_state
from tests.support import hostqemu

REPO = Path(__file__).resolve().parents[2]


@dataclass
class BuiltCell:
    grid: matrix.Matrix
    cell: Cell
    reference: str
    image_id: str
    client: docker.DockerClient
    build_id: str = ""

    def run(self, *command: str, **kwargs: object) -> str:
        output: bytes = self.client.containers.run(
            self.reference, list(command), remove=True, network_mode="none", **kwargs
        )
        return output.decode()


def _pick_cell(grid: matrix.Matrix, wanted: str | None) -> Cell:
    return grid.cell(wanted) if wanted else grid.quick_cell


@pytest.fixture(scope="session")
def client() -> Iterator[docker.DockerClient]:
    if not daemon.answers():
        pytest.fail(f"integration tests need a Docker engine at {daemon.socket_name()}; `nox -s tests` starts one")
    engine_client = daemon.client()
    before = engine_state.image_ids(engine_client)
    yield engine_client
    engine_state.remove_added_images(engine_client, before)


@pytest.fixture(scope="session")
def built(client: docker.DockerClient, pytestconfig: pytest.Config) -> Iterator[BuiltCell]:
    grid = matrix.load_matrix(REPO / "matrix.yaml")
    cell = _pick_cell(grid, pytestconfig.getoption("--cell"))
    reference = build.local_reference(grid, cell)
    result = build.build_cell(
        client, grid, build.preflight(cell, grid), wheelhouse.Wheelhouse(), print, build.BuildOptions(no_cache=True)
    )
    assert result.status == "built", result.detail
    # Its intermediate steps stay until the session ends: the devel sibling reuses them.
    yield BuiltCell(grid, cell, reference, result.image_id, client, result.build_id)


@pytest.fixture(scope="session")
def built_devel(built: BuiltCell) -> BuiltCell:
    """The devel sibling of the built runtime cell (same torch, base and locks' stack), built on
    the runtime's steps."""
    cell = built.grid.sibling(built.cell, "devel")
    if cell is None:
        pytest.skip(f"the matrix has no devel sibling of {built.cell.name}")
    result = build.build_cell(
        built.client, built.grid, build.preflight(cell, built.grid), wheelhouse.Wheelhouse(), print
    )
    assert result.status in ("built", "unchanged"), result.detail
    return BuiltCell(
        built.grid, cell, build.local_reference(built.grid, cell), result.image_id, built.client, result.build_id
    )


_smoke_results: dict[str, smoke.SmokeResult] = {}


def smoke_of(image: BuiltCell) -> smoke.SmokeResult:
    """The self-test of an image, run once per session (it takes about 30 s on a CPU)."""
    if image.image_id not in _smoke_results:
        _smoke_results[image.image_id] = smoke.run(image.client, image.reference, gpus=False)
    return _smoke_results[image.image_id]


@pytest.fixture(scope="session")
def smoke_result(built: BuiltCell) -> smoke.SmokeResult:
    return smoke_of(built)


@dataclass
class RunningRegistry:
    host: str
    user: str | None = None
    password: str | None = None
    ca: Path | None = None  # set when it serves HTTPS
    issuer: registry_fixtures.TokenIssuer | None = None  # set when it wants tokens
    root: Path | None = None  # where it stores (its blobs under data/)

    def api(self) -> Registry:
        return Registry(
            self.host,
            Registry.login(self.user, self.password) if self.user else None,
            retries=1,
            backoff_s=0.1,
            ca_file=self.ca,
        )


@pytest.fixture(scope="session")
def seeded_layers(built: BuiltCell, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A registry's storage holding the built cell's layers in repository `torch`, as the engine's
    push compressed them, and nothing else (no manifest, no tag): what a registry keeps after an
    earlier publish of the same image. A registry started on a copy of it (hard links: the
    registry never rewrites a blob) takes a publish's push without the engine compressing and
    uploading a gigabyte again (about 25 s here, for each test that publishes)."""
    root = tmp_path_factory.mktemp("seed-registry")
    with loopback.registry(root) as host:
        repository = f"{host}/torch"
        built.client.images.get(built.reference).tag(repository, "seed")
        try:
            for chunk in built.client.api.push(repository, tag="seed", stream=True, decode=True):
                assert "error" not in chunk, chunk
        finally:
            built.client.images.remove(f"{repository}:seed")
    shutil.rmtree(root / "data" / "docker" / "registry" / "v2" / "repositories" / "torch" / "_manifests")
    return root / "data"


@pytest.fixture
def start_registry(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator:  # type: ignore[type-arg]
    """start(user, password, tls=False, token=False, seeded=False): a registry on loopback, with
    htpasswd authentication for `user` (or token authentication through a test token issuer), and
    HTTPS with a certificate from a test CA when `tls`. `seeded`: it already holds the built
    cell's layers (seeded_layers), for tests of what publish does once the layers are there (the
    gate, artifacts, signatures, aliases, pruning); tests of the push itself start empty."""
    if not Path(loopback.REGISTRY_BINARY).exists():
        pytest.fail("docker-registry is not installed; `nox -s tests` installs Debian's docker-registry")
    with contextlib.ExitStack() as running:
        started = itertools.count()

        def start(
            user: str | None = None,
            password: str | None = None,
            tls: bool = False,
            token: bool = False,
            ttl_s: int = 300,
            seeded: bool = False,
        ) -> RunningRegistry:
            root = tmp_path / f"registry-{next(started)}"
            if seeded:
                shutil.copytree(request.getfixturevalue("seeded_layers"), root / "data", copy_function=os.link)
            certificate = registry_fixtures.server_certificate(root / "pki") if tls else None
            https = loopback.Tls(certificate.certificate, certificate.key) if certificate else None
            issuer, auth = None, None
            if token:
                issuer = registry_fixtures.TokenIssuer(root / "issuer", user or "ci", password or "", ttl_s=ttl_s)
                running.enter_context(issuer.serving())
                auth = loopback.TokenAuth(issuer.realm, issuer.service, issuer.issuer, issuer.certificate)
            host = running.enter_context(loopback.registry(root, None if token else user, password, https, auth))
            return RunningRegistry(host, user, password, certificate.ca if certificate else None, issuer, root)

        yield start


@pytest.fixture(scope="session")
def without_host_qemu() -> Iterator[None]:
    """The emulation tests run as on a machine that never had Debian's qemu-user-static: only the
    qemu the builder pins and registers (tests/support/hostqemu.py)."""
    with hostqemu.hidden() as what:
        print(f"emulation tests: {hostqemu.describe(what)}")
        yield
