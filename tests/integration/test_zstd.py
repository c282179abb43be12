"""zstd layers (`publish --compression zstd`) against the real things: a registry on loopback
(Debian's docker-registry, with htpasswd), the built CPU cell, and containerd's own client `ctr`
pulling as a node does. Docker 20.10 cannot pull zstd layers, which is why the builder uploads
them and why the gzip form keeps the plain tags."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import docker.errors
import pytest
from securesystemslib.signer import CryptoSigner

from builder.assemble import build, smoke
from builder.errors import UserError
from builder.plan.matrix import Matrix
from builder.publish import publish, recompress, signing, staging
from builder.publish.publisher import Publisher, Records
from harness import containerd
from tests.integration.conftest import BuiltCell, RunningRegistry
from tests.support.reports import dressed_as_gpu_pass

pytestmark = pytest.mark.integration
NAMESPACE = "torch-images-test"


# What these tests check (the form's shape, that containerd unpacks it, that its bytes reproduce,
# that a signing publish trusts no cache) holds at any level; the matrix's level 9 costs about
# 30 s a pass over the CPU image on 2 cores, and the tests make four passes. The bench measures
# level 9 itself (docs/benchmarks.md).
TEST_LEVEL = 3


def _zstd_grid(built: BuiltCell, registry: RunningRegistry) -> Matrix:
    grid = built.grid
    chosen = grid.spec.publish.model_copy(update={"compression": "zstd", "zstd_level": TEST_LEVEL})
    spec = grid.spec.model_copy(update={"registry": registry.host, "publish": chosen})
    return Matrix(grid.path, spec, grid.cells, grid.rejected)


def _publish_zstd(
    built: BuiltCell, registry: RunningRegistry, tmp_path: Path, signer: CryptoSigner | None = None
) -> list[publish.Publication]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{publish.TABLE_START}\n{publish.TABLE_END}\n")
    options = publish.PublishOptions(Records(tmp_path / "records", readme), signer=signer)
    return publish.publish(built.client, _zstd_grid(built, registry), [built.cell], lambda _: None, options)


def _empty_zstd_cache(monkeypatch: pytest.MonkeyPatch, where: Path) -> None:
    where.mkdir(parents=True)
    monkeypatch.setattr(recompress, "cache_dir", lambda: where)


@pytest.fixture
def credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[str, str]:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-config"))  # the host's logins play no part
    monkeypatch.setenv("TORCH_IMAGES_REGISTRY_USER", "ci")
    monkeypatch.setenv("TORCH_IMAGES_REGISTRY_PASSWORD", "zstd-secret")
    return "ci", "zstd-secret"


def test_zstd_form_is_the_same_image_containerd_pulls_it_and_its_bytes_reproduce(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,  # type: ignore[no-untyped-def]
    credentials: tuple[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not containerd.available():
        pytest.fail("containerd's ctr is needed (Debian's docker.io brings containerd); `nox -s tests` installs it")
    assert smoke_result.status == "pass"
    _empty_zstd_cache(monkeypatch, tmp_path / "cache-1")  # nothing compressed before
    user, password = credentials
    registry = start_registry(user, password, seeded=True)  # the gzip form's layers: zstd is what is tried
    _, zstd_item = _publish_zstd(built, registry, tmp_path / "first")
    api = registry.api()

    # The plain tag keeps the engine's gzip push; `-zstd` is the same config with zstd layers.
    gzip_form = api.manifest("torch", built.cell.tag)
    zstd_form = api.manifest("torch", f"{built.cell.tag}-zstd")
    assert gzip_form is not None and zstd_form is not None and zstd_form.digest == zstd_item.digest
    gzip_doc, zstd_doc = json.loads(gzip_form.body), json.loads(zstd_form.body)
    assert gzip_doc["config"]["digest"] == zstd_doc["config"]["digest"] == built.image_id
    assert {layer["mediaType"] for layer in zstd_doc["layers"]} == {recompress.ZSTD_LAYER}
    assert all("gzip" in layer["mediaType"] for layer in gzip_doc["layers"])
    assert sum(layer["size"] for layer in zstd_doc["layers"]) < sum(layer["size"] for layer in gzip_doc["layers"])
    for alias in built.cell.aliases:
        moved = api.manifest("torch", f"{alias}-zstd")
        assert moved is not None and moved.digest == zstd_form.digest, alias
    # Its own SBOM and report, naming the zstd digest as subject; its own record.
    assert set(api.attached("torch", zstd_form.digest)) == set(publish.ARTIFACT_TYPES.values())
    record = json.loads((tmp_path / "first" / "records" / f"{built.cell.name}.zstd.json").read_text())
    assert record["compression"] == "zstd" and record["digest"] == zstd_form.digest
    assert record["image_id"] == built.image_id

    # containerd pulls it, unpacking each layer against the config's diff IDs, and runs it.
    reference = f"{registry.host}/torch:{built.cell.tag}-zstd"
    containerd.clear(NAMESPACE)
    try:
        containerd.pull(NAMESPACE, reference, plain_http=True, user=f"{user}:{password}")
        pulled = containerd.manifest_digest(NAMESPACE, reference)
        assert pulled == zstd_form.digest
        config = json.loads(containerd.content(NAMESPACE, pulled))["config"]["digest"]
        assert config == built.image_id  # the image ID that was self-tested
        version = containerd.ctr(NAMESPACE, "run", "--rm", "--net-host", reference, "zstd-check",
                                 "python", "-c", "import torch; print(torch.__version__)")  # fmt: skip
        assert version.strip() == built.cell.torch.version
    finally:
        containerd.clear(NAMESPACE)

    # The same image compressed again, from an empty cache, into another registry: the same bytes.
    _empty_zstd_cache(monkeypatch, tmp_path / "cache-2")
    other = start_registry(user, password, seeded=True)
    _, again = _publish_zstd(built, other, tmp_path / "second")
    assert again.digest == zstd_form.digest

    # A rerun to the first registry finds the zstd form there and compresses nothing.
    [*_, unchanged] = _publish_zstd(built, registry, tmp_path / "third")
    assert unchanged.unchanged and unchanged.digest == zstd_form.digest

    # A cache entry changed to name another blob the registry holds (issue 35): a publish that
    # signs takes neither the cache nor the tag's manifest on trust, and pushes the right form.
    entry = next((tmp_path / "cache-2").rglob("*.json"))
    other_api = other.api()
    other_gzip = other_api.manifest("torch", built.cell.tag)
    assert other_gzip is not None
    elsewhere = json.loads(other_gzip.body)["layers"][0]  # a blob that registry does hold
    entry.write_text(json.dumps({"digest": elsewhere["digest"], "size": elsewhere["size"]}))
    how = recompress.Recompression(TEST_LEVEL, lambda _: None)
    fooled = recompress.push_zstd_form(built.client, other_api, "torch", other_gzip, how)
    assert fooled.digest != zstd_form.digest  # the unchecked cache makes a form that would not unpack
    signer = CryptoSigner.generate_ed25519()
    [*_, signed] = _publish_zstd(built, other, tmp_path / "fourth", signer)
    assert signed.digest == zstd_form.digest


@pytest.fixture(autouse=True)
def _untag_pushed(built: BuiltCell) -> object:
    """The pushes tag the image `<loopback registry>/torch:...` in the engine: removed after."""
    yield
    for tag in built.client.images.get(built.image_id).tags:
        if tag.startswith("127.0.0.1:"):
            built.client.api.remove_image(tag, noprune=True)


def test_an_engine_older_than_docker_23_cannot_pull_the_zstd_form(
    built: BuiltCell,
    start_registry,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Why the gzip form keeps the plain tags: Debian 12's Docker 20.10 fails on a zstd layer.
    (An engine that has the image ID already skips the layers, so a small image of its own.)"""
    client = built.client
    if int(client.version()["Version"].split(".")[0]) >= 23:
        pytest.skip("this engine reads zstd layers (Docker >= 23)")
    _empty_zstd_cache(monkeypatch, tmp_path / "cache")
    (tmp_path / "image").mkdir()
    (tmp_path / "image" / "file").write_bytes(b"zstd " * 1000)
    (tmp_path / "image" / "Dockerfile").write_text("FROM scratch\nCOPY file /file\n")
    image, _ = client.images.build(path=str(tmp_path / "image"), rm=True)
    registry = start_registry()
    api = registry.api()
    try:
        image.tag(f"{registry.host}/small", "gzip")
        for _ in client.api.push(f"{registry.host}/small", "gzip", stream=True, decode=True):
            pass
        gzip_form = api.manifest("small", "gzip")
        assert gzip_form is not None
        zstd_form = recompress.push_zstd_form(client, api, "small", gzip_form, recompress.Recompression(3, print))
        api.put_manifest("small", "zstd", zstd_form)
        client.images.remove(image.id, force=True)
        said = list(client.api.pull(f"{registry.host}/small", tag="zstd", stream=True, decode=True))
        assert any("failed to register layer" in str(chunk.get("error", "")) for chunk in said), said[-1:]
        with pytest.raises(docker.errors.ImageNotFound):
            client.images.get(f"{registry.host}/small:zstd")
    finally:
        with contextlib.suppress(docker.errors.ImageNotFound):
            client.images.remove(image.id, force=True)


def test_ci_stages_and_promotes_both_forms_and_the_gpu_stage_attaches_to_both(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-config"))
    _empty_zstd_cache(monkeypatch, tmp_path / "cache")
    registry = start_registry(seeded=True)
    grid, api, say = _zstd_grid(built, registry), registry.api(), (lambda _: None)
    publisher = Publisher(api, grid, say, built.client)
    staged = staging.stage(publisher, [built.cell], "z1")
    assert [item.compression for item in staged] == ["gzip", "zstd"]
    zstd_tag = staging.staging_tag(grid, built.cell, "z1", "zstd")
    assert zstd_tag == f"{built.cell.tag}-zstd.staging-z1"
    zstd_staged = api.manifest("torch", zstd_tag)
    assert zstd_staged is not None and recompress.is_zstd_form(zstd_staged, built.image_id)
    assert api.manifest("torch", f"{built.cell.tag}-zstd") is None  # staging moves no versioned tag

    # What the GPU stage keeps of its report (one image ID, so one record per staged form), and
    # the sign job then attaches and signs on each form; a report about another image is refused.
    second_report = dressed_as_gpu_pass(smoke_result.report)  # the GPU stage's report (none ran here)
    kept = tmp_path / "staged"
    staging.write_staged(publisher, "z1", staged, kept)
    for item in staged:
        staging.write_gpu_report(kept, staging.staging_tag(grid, built.cell, "z1", item.compression), item.digest,
                                 {**second_report, "image_id": "sha256:" + "0" * 64})  # fmt: skip
    signer = Publisher(api, grid, say, signer=CryptoSigner.generate_ed25519())
    with pytest.raises(UserError, match="report is for another image than the staged one"):
        signing.sign(signer, [built.cell], "z1", kept)
    for item in staged:
        staging.write_gpu_report(kept, staging.staging_tag(grid, built.cell, "z1", item.compression), item.digest,
                                 second_report)  # fmt: skip
    signing.sign(signer, [built.cell], "z1", kept)
    assert all(len(publisher.door.reports(item.digest)) == 2 for item in staged)

    records, readme = tmp_path / "records", tmp_path / "README.md"
    readme.write_text(f"# x\n{publish.TABLE_START}\n{publish.TABLE_END}\n")
    said: list[str] = []
    dry = Publisher(api, grid, said.append, built.client)
    assert staging.promote(dry, [built.cell], "z1", Records(records, readme), dry_run=True) == []
    assert api.manifest("torch", built.cell.tag) is None and not records.exists()  # nothing written
    assert f"dry run: {built.cell.tag}: would move from nothing to {staged[0].digest[:19]}" in said
    assert f"dry run: {built.cell.tag}-zstd: would move from nothing to {staged[1].digest[:19]}" in said
    promoted = staging.promote(publisher, [built.cell], "z1", Records(records, readme))
    assert {item.target: item.digest for item in promoted} == {
        built.cell.tag: staged[0].digest,
        f"{built.cell.tag}-zstd": staged[1].digest,
    }
    for alias in built.cell.aliases:
        assert api.manifest("torch", f"{alias}-zstd").digest == staged[1].digest  # type: ignore[union-attr]
    assert (records / f"{built.cell.name}.zstd.json").exists()
    assert f"{built.cell.tag}-zstd`" in readme.read_text()

    # A cell --skip-existing did not build is staged from the registry, in both forms.
    build.record_in_registry(built.cell, built.build_id)  # as that build, in the same job, left it
    local = built.client.images.get(built.reference)
    built.client.images.remove(built.reference)
    try:
        again = staging.stage(publisher, [built.cell], "z2")
    finally:
        local.tag(*built.reference.split(":", 1))
    assert [item.digest for item in again] == [item.digest for item in staged]
