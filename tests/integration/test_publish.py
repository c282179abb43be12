"""Publishing to a real registry (Debian's docker-registry, the CNCF distribution) on loopback."""

from __future__ import annotations

import contextlib
import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from builder.build import smoke
from builder.errors import UserError
from builder.plan.matrix import Matrix
from builder.publish import loopback, publish
from builder.publish.registry import Registry
from tests.integration.conftest import BuiltCell

pytestmark = pytest.mark.integration


@dataclass
class RunningRegistry:
    host: str
    user: str | None = None
    password: str | None = None

    def api(self) -> Registry:
        return Registry(self.host, self.user, self.password, retries=1, backoff_s=0.1)


@pytest.fixture
def start_registry(tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    if not Path(loopback.REGISTRY_BINARY).exists():
        pytest.fail("docker-registry is not installed; `nox -s tests` installs Debian's docker-registry")
    with contextlib.ExitStack() as running:
        started = itertools.count()

        def start(user: str | None = None, password: str | None = None) -> RunningRegistry:
            root = tmp_path / f"registry-{next(started)}"
            return RunningRegistry(running.enter_context(loopback.registry(root, user, password)), user, password)

        yield start


def _grid_for(built: BuiltCell, registry: RunningRegistry) -> Matrix:
    grid = built.grid
    return Matrix(grid.path, grid.spec.model_copy(update={"registry": registry.host}), grid.cells, grid.rejected)


def _publish(
    built: BuiltCell, registry: RunningRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> list[publish.Publication]:
    if registry.user:
        monkeypatch.setenv("TORCH_IMAGES_REGISTRY_USER", registry.user)
        monkeypatch.setenv("TORCH_IMAGES_REGISTRY_PASSWORD", registry.password or "")
    readme = tmp_path / "README.md"
    if not readme.exists():
        readme.write_text(f"# x\n{publish.TABLE_START}\nNothing published yet.\n{publish.TABLE_END}\n")
    return publish.publish(
        built.client, _grid_for(built, registry), [built.cell], lambda _: None, tmp_path / "records", readme
    )


def test_publish_pushes_the_verified_tag_then_aliases_and_the_pulled_image_passes_its_self_test(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    assert smoke_result.status == "pass"
    registry = start_registry()
    [item] = _publish(built, registry, tmp_path, monkeypatch)
    api = registry.api()
    tagged = api.manifest("torch", built.cell.tag)
    assert tagged is not None and tagged.digest == item.digest
    for alias in built.cell.aliases:
        moved = api.manifest("torch", alias)
        assert moved is not None and moved.digest == item.digest, alias
    sbom_manifest = api.manifest("torch", f"{built.cell.tag}.sbom")
    assert sbom_manifest is not None
    layer = json.loads(sbom_manifest.body)["layers"][0]
    document = json.loads(api.blob("torch", layer["digest"]))
    purls = {c.get("purl", "") for c in document["components"]}
    assert f"pkg:pypi/torch@{built.cell.torch.version.replace('+', '%2B')}" in purls or any(
        p.startswith("pkg:pypi/torch@") for p in purls
    )
    assert any(p.startswith("pkg:deb/debian/libc6@") for p in purls)
    assert api.manifest("torch", f"{built.cell.tag}.selftest") is not None
    record = json.loads((tmp_path / "records" / f"{built.cell.name}.json").read_text())
    assert record["digest"] == item.digest and record["selftest"]["status"] == "pass"
    assert f"`{registry.host}/torch:{built.cell.tag}`" in (tmp_path / "README.md").read_text()

    # Remove every local name of the image, pull it back from the registry, self-test it there.
    published = f"{registry.host}/torch:{built.cell.tag}"
    built.client.images.remove(published)
    built.client.images.remove(built.reference)
    pulled = built.client.images.pull(f"{registry.host}/torch", tag=built.cell.tag)
    try:
        assert pulled.id == built.image_id  # same config, same ID: what was tested is what was pushed
        assert (
            smoke.run(
                built.client,
                published,
                gpus=False,
                extra=["--only", "environment", "--only", "torch.compile"],
            ).status
            == "pass"
        )
    finally:
        pulled.tag(*built.reference.split(":", 1))

    # A downstream Dockerfile FROM the published tag builds and runs.
    (tmp_path / "downstream").mkdir()
    (tmp_path / "downstream" / "Dockerfile").write_text(
        f"FROM {published}\nRUN python -c 'import torch; print(torch.__version__)' > /v\n"
    )
    image, _ = built.client.images.build(path=str(tmp_path / "downstream"), rm=True, network_mode="host")
    try:
        out = built.client.containers.run(image.id, ["cat", "/v"], remove=True, network_mode="none").decode().strip()
        assert out.split("+")[0] == built.cell.torch.public_version
    finally:
        built.client.images.remove(image.id, force=True)

    # Publishing the same image again changes nothing.
    [again] = _publish(built, registry, tmp_path, monkeypatch)
    assert again.unchanged and again.moved_aliases == [] and again.digest == item.digest


def test_publish_with_htpasswd_accepts_right_and_refuses_wrong_credentials(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    registry = start_registry("ci", "s3cret")
    wrong = RunningRegistry(registry.host, "ci", "wrong")
    with pytest.raises(UserError, match="refused the credentials"):
        _publish(built, wrong, tmp_path, monkeypatch)
    assert registry.api().manifest("torch", built.cell.tag) is None  # nothing half-published
    [item] = _publish(built, registry, tmp_path, monkeypatch)
    assert registry.api().manifest("torch", built.cell.tag).digest == item.digest  # type: ignore[union-attr]


def test_an_image_without_a_passing_self_test_is_refused_and_nothing_is_pushed(
    built: BuiltCell,
    start_registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    registry = start_registry()
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text(f"FROM {built.image_id}\nLABEL untested=yes\n")
    untested, _ = built.client.images.build(path=str(tmp_path / "ctx"), rm=True)
    original = built.client.images.get(built.reference)
    untested.tag(*built.reference.split(":", 1))
    try:
        with pytest.raises(UserError, match=r"no passing self-test for image"):
            _publish(built, registry, tmp_path, monkeypatch)
        assert registry.api().manifest("torch", built.cell.tag) is None
    finally:
        original.tag(*built.reference.split(":", 1))
        built.client.images.remove(untested.id, force=True)


def test_a_registry_that_is_down_is_a_clear_error_after_retries(
    built: BuiltCell, smoke_result: smoke.SmokeResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    down = RunningRegistry(f"127.0.0.1:{loopback.free_port()}")
    started = time.monotonic()
    with pytest.raises(UserError, match=r"did not answer after 5 tries"):
        _publish(built, down, tmp_path, monkeypatch)
    assert time.monotonic() - started >= 0.5 + 1 + 2 + 4  # it backed off between tries
