"""Publishing to a real registry (Debian's docker-registry, the CNCF distribution) on loopback."""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from securesystemslib.signer import CryptoSigner

from builder import cli, verdict
from builder.assemble import build, smoke
from builder.config import vex
from builder.errors import UserError
from builder.oci.registry import OCI_MANIFEST, Manifest, Registry
from builder.plan.matrix import Matrix
from builder.publish import (
    attachments,
    cosign_tag,
    existing,
    provenance,
    publish,
    rebuild,
    reports,
    signing,
    soci,
    staging,
    verify,
)  # fmt: skip
from builder.publish.publisher import Publisher, Records
from builder.wheelhouse import wheelhouse
from harness import lazy, loopback, registry_fixtures, verifiers
from tests.integration.conftest import BuiltCell, RunningRegistry
from tests.support.reports import dressed_as_gpu_pass

pytestmark = pytest.mark.integration


def _fully_attached(api: Registry, digest: str) -> bool:
    """The image's SBOM and self-test report are both attached to its digest."""
    return set(api.attached("torch", digest)) == set(publish.ARTIFACT_TYPES.values())


def _grid_for(built: BuiltCell, registry: RunningRegistry) -> Matrix:
    grid = built.grid
    return Matrix(grid.path, grid.spec.model_copy(update={"registry": registry.host}), grid.cells, grid.rejected)


def _ci_setting(
    built: BuiltCell, running: RunningRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Matrix, Registry, Callable[[str], None], Path, Path]:
    """What a CI job has: the matrix pointed at the registry, its client, and where records and
    the README's table go; the host's docker logins play no part."""
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-config"))
    records, readme = tmp_path / "records", tmp_path / "README.md"
    readme.write_text(f"# x\n{publish.TABLE_START}\n{publish.TABLE_END}\n")
    return _grid_for(built, running), running.api(), lambda _: None, records, readme


def _publish(
    built: BuiltCell,
    registry: RunningRegistry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    signer: CryptoSigner | None = None,
) -> list[publish.Publication]:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-config"))  # the host's logins play no part
    if registry.user:
        monkeypatch.setenv("TORCH_IMAGES_REGISTRY_USER", registry.user)
        monkeypatch.setenv("TORCH_IMAGES_REGISTRY_PASSWORD", registry.password or "")
    readme = tmp_path / "README.md"
    if not readme.exists():
        readme.write_text(f"# x\n{publish.TABLE_START}\nNothing published yet.\n{publish.TABLE_END}\n")
    options = publish.PublishOptions(Records(tmp_path / "records", readme), ca_file=registry.ca, signer=signer)
    return publish.publish(built.client, _grid_for(built, registry), [built.cell], lambda _: None, options)


def test_publish_pushes_the_verified_tag_then_aliases_and_the_pulled_image_passes_its_self_test(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    assert smoke_result.status == "pass"
    registry = start_registry()
    # First a dry run: the gate and the registry read, what would happen said, nothing written.
    said: list[str] = []
    dry = publish.PublishOptions(Records(tmp_path / "records", tmp_path / "README.md"), dry_run=True)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-config"))
    assert publish.publish(built.client, _grid_for(built, registry), [built.cell], said.append, dry) == []
    assert f"dry run: would push {built.cell.tag} (gzip, image {built.image_id[:19]}), new, then attach its SBOM " \
           "and self-test report" in said  # fmt: skip
    assert f"dry run: then would move {', '.join(built.cell.aliases)} to {built.cell.tag}" in said
    assert registry.api().manifest("torch", built.cell.tag) is None and not (tmp_path / "records").exists()
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
    assert (
        f"pkg:pypi/torch@{built.cell.torch.version.replace('+', '%2B')}" in purls
    )  # the exact build, local tag included
    assert any(p.startswith("pkg:deb/debian/libc6@") for p in purls)
    assert api.manifest("torch", f"{built.cell.tag}.selftest") is not None
    assert _fully_attached(api, item.digest)  # found from the image's digest alone
    record = json.loads((tmp_path / "records" / f"{built.cell.name}.json").read_text())
    assert record["digest"] == item.digest and record["selftest"]["status"] == "pass"
    build_id = built.client.images.get(built.image_id).labels["io.torch-images.build-id"]
    assert record["build_id"] == build_id and len(build_id) == 32
    assert f"`{registry.host}/torch:{built.cell.tag}`" in (tmp_path / "README.md").read_text()

    # Remove every local name of the image, pull it back from the registry, self-test it there.
    published = f"{registry.host}/torch:{built.cell.tag}"
    # The engine pushed it by that name, and the name went with the push (issue 58).
    assert published not in (built.client.images.get(built.image_id).tags or [])
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


def test_publish_through_token_authentication_over_https_with_the_registrys_ca(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    # What Docker Hub, GHCR, Quay, Harbor, GitLab and ECR do: a Bearer challenge naming a token
    # service, which takes the basic credentials and returns a signed token for the scope asked.
    registry = start_registry("ci", "t0ken-s3cret", tls=True, token=True)
    assert registry.issuer is not None and registry.ca is not None
    wrong = RunningRegistry(registry.host, "ci", "wrong", registry.ca)
    with pytest.raises(UserError) as refused:
        _publish(built, wrong, tmp_path, monkeypatch)
    assert "refused the credentials from TORCH_IMAGES_REGISTRY_USER" in refused.value.line()
    assert "wrong" not in refused.value.line() and registry.issuer.refused >= 1
    assert registry.api().manifest("torch", built.cell.tag) is None  # nothing half-published

    [item] = _publish(built, registry, tmp_path, monkeypatch)
    api = registry.api()
    assert api.manifest("torch", built.cell.tag).digest == item.digest  # type: ignore[union-attr]
    for alias in built.cell.aliases:
        assert api.manifest("torch", alias).digest == item.digest  # type: ignore[union-attr]
    assert _fully_attached(api, item.digest)
    assert any("repository:torch:" in scope and "push" in scope for scope in registry.issuer.issued)
    record = (tmp_path / "records" / f"{built.cell.name}.json").read_text()
    assert "t0ken-s3cret" not in record and "t0ken-s3cret" not in (tmp_path / "README.md").read_text()

    # The registry's certificate is checked: another CA's is refused in one line.
    other = registry_fixtures.server_certificate(tmp_path / "other-pki")
    stranger = Registry(registry.host, Registry.login("ci", "t0ken-s3cret"), retries=0, ca_file=other.ca)
    with pytest.raises(
        UserError, match=r"its TLS certificate is not trusted \(SSLError\); give its CA with --registry-ca FILE"
    ):
        stranger.check()


def test_an_expired_token_is_renewed_and_a_new_scope_gets_a_new_token(start_registry) -> None:  # type: ignore[no-untyped-def]
    # distribution accepts a token up to 60 s past its expiry (clock-skew leeway): expiring 58 s
    # before it is issued, a token is good for 2 s.
    registry = start_registry("ci", "s3cret", token=True, ttl_s=2 - 60)
    api = registry.api()
    api.check()
    digest = api.upload_blob("torch", b"first")
    issued = len(registry.issuer.issued)
    time.sleep(3)  # the token has expired: the registry answers 401 with a fresh challenge
    assert api.blob("torch", digest) == b"first"
    assert len(registry.issuer.issued) > issued


def test_a_rerun_finishes_a_publish_cut_short_before_its_artifacts_and_moves_aliases_last(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    # Seen before: the registry stopped during publishing; the rerun moved the aliases but never
    # pushed the SBOM and report. A publish is complete only with all three.
    registry = start_registry(seeded=True)

    def cut(*args: object, **kwargs: object) -> str:
        raise UserError("registry went away")

    with monkeypatch.context() as broken:
        broken.setattr(Registry, "push_artifact", cut)
        with pytest.raises(UserError, match="registry went away"):
            _publish(built, registry, tmp_path, monkeypatch)
    api = registry.api()
    pushed = api.manifest("torch", built.cell.tag)
    assert pushed is not None and api.referrers("torch", pushed.digest) == []
    assert all(api.manifest("torch", alias) is None for alias in built.cell.aliases)  # no alias moved

    [item] = _publish(built, registry, tmp_path, monkeypatch)
    assert item.unchanged and sorted(item.attached) == ["sbom", "selftest"]
    assert _fully_attached(api, item.digest)
    assert all(api.manifest("torch", alias).digest == item.digest for alias in built.cell.aliases)  # type: ignore[union-attr]
    [again] = _publish(built, registry, tmp_path, monkeypatch)
    assert again.unchanged and again.attached == [] and again.moved_aliases == []


def test_skip_existing_does_not_build_a_cell_whose_build_id_is_in_the_registry(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    registry, empty = start_registry(seeded=True), start_registry()
    grid = _grid_for(built, registry)
    [item] = _publish(built, registry, tmp_path, monkeypatch)

    def build_against(running: RunningRegistry) -> build.BuildResult:
        published = functools.partial(existing.is_published, running.api(), grid, built.cell)
        return build.build_cell(
            built.client, grid, build.preflight(built.cell, grid), wheelhouse.Wheelhouse(), lambda _: None,
            build.BuildOptions(published=published),
        )  # fmt: skip

    skipped = build_against(registry)
    assert skipped.status == "in registry" and skipped.image_id == ""
    assert build.recorded_in_registry(built.cell) == skipped.build_id  # what the stage step after it reads
    assert existing.published_build_id(registry.api(), "torch", built.cell.tag) == skipped.build_id == item.build_id
    assert build_against(empty).status == "unchanged"  # not in that registry: the engine's copy is found instead


def test_ci_stages_each_cell_then_promotes_from_the_registry_alone(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    running = start_registry(seeded=True)
    grid, api, say, records, readme = _ci_setting(built, running, tmp_path, monkeypatch)

    tag = staging.staging_tag(built.grid, built.cell, "r1")
    said: list[str] = []
    assert staging.stage(Publisher(api, grid, said.append, built.client), [built.cell], "r1", dry_run=True) == []
    assert any(line.startswith(f"dry run: would push {tag} (gzip") for line in said), said
    assert not any("would move" in line for line in said) and api.manifest("torch", tag) is None
    [staged] = staging.stage(Publisher(api, grid, say, built.client), [built.cell], "r1")
    assert api.manifest("torch", tag).digest == staged.digest  # type: ignore[union-attr]
    assert api.manifest("torch", built.cell.tag) is None  # staging moves no versioned tag
    assert all(api.manifest("torch", alias) is None for alias in built.cell.aliases)

    # The gate reads the registry: a run that staged nothing, or an image whose attached
    # report is not a pass for exactly that image, promotes nothing.
    with pytest.raises(UserError, match=r"not staged \(.*staging-r2 is not in"):
        staging.promote(Publisher(api, grid, say), [built.cell], "r2", Records(records, readme))
    good = api.manifest("torch", tag)
    assert good is not None
    body = json.dumps({**json.loads(good.body), "annotations": {"test": "another image"}}).encode()
    other = Manifest.of(body, good.media_type)
    api.put_manifest("torch", staging.staging_tag(built.grid, built.cell, "bad"), other)
    failing = json.dumps({**smoke_result.report, "status": "fail"}).encode()
    api.push_artifact("torch", "bad.selftest", failing, publish.ARTIFACT_TYPES["selftest"], {}, other)
    api.push_artifact("torch", "bad.sbom", b"{}", publish.ARTIFACT_TYPES["sbom"], {}, other)
    with pytest.raises(UserError, match=r"no passing self-test report for image .*status is not pass"):
        staging.promote(Publisher(api, grid, say), [built.cell], "bad", Records(records, readme))
    assert api.manifest("torch", built.cell.tag) is None
    # The review's case: a report of the right image saying pass, with no checks at all.
    hollow = Manifest.of(
        json.dumps({**json.loads(good.body), "annotations": {"test": "hollow"}}).encode(), good.media_type
    )
    api.put_manifest("torch", staging.staging_tag(built.grid, built.cell, "hollow"), hollow)
    empty = json.dumps({**smoke_result.report, "status": "pass", "checks": [], "failed": []}).encode()
    api.push_artifact("torch", "hollow.selftest", empty, publish.ARTIFACT_TYPES["selftest"], {}, hollow)
    api.push_artifact("torch", "hollow.sbom", b"{}", publish.ARTIFACT_TYPES["sbom"], {}, hollow)
    with pytest.raises(UserError, match="lacks checks the self-test runs: host, environment"):
        staging.promote(Publisher(api, grid, say), [built.cell], "hollow", Records(records, readme))
    assert api.manifest("torch", built.cell.tag) is None

    # Promotion needs no engine: the versioned tag takes the staged manifest, then the aliases.
    [promoted] = staging.promote(Publisher(api, grid, say), [built.cell], "r1", Records(records, readme))
    assert api.manifest("torch", built.cell.tag).digest == staged.digest  # type: ignore[union-attr]
    assert all(api.manifest("torch", a).digest == staged.digest for a in built.cell.aliases)  # type: ignore[union-attr]
    assert api.manifest("torch", f"{built.cell.tag}.selftest") is not None
    record = json.loads((records / f"{built.cell.name}.json").read_text())
    assert record["digest"] == staged.digest and record["build_id"] == staged.build_id and promoted.image_id

    # A cell `build --skip-existing` did not build (no local image) is staged from the registry.
    build.record_in_registry(built.cell, built.build_id)  # as that build, in the same job, left it
    local = built.client.images.get(built.reference)
    built.client.images.remove(built.reference)
    try:
        [again] = staging.stage(Publisher(api, grid, say, built.client), [built.cell], "r3")
    finally:
        local.tag(*built.reference.split(":", 1))
    assert again.digest == staged.digest
    assert api.manifest("torch", staging.staging_tag(built.grid, built.cell, "r3")).digest == staged.digest  # type: ignore[union-attr]


def test_a_promote_cut_after_the_versioned_tag_leaves_no_alias_ahead_and_the_same_promote_finishes(
    built: BuiltCell,
    start_registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    """Issue 58: promote stopped (SIGTERM, a CI cancel) right after a cell's versioned tag moved,
    before the names of its artifacts and the aliases: no alias points anywhere yet, and the same
    promote, run again, names the artifacts and moves the aliases."""
    running = start_registry(seeded=True)
    grid, api, say, records, readme = _ci_setting(built, running, tmp_path, monkeypatch)
    [staged] = staging.stage(Publisher(api, grid, say, built.client), [built.cell], "cut")
    put = api.put_manifest

    def cut_after_the_versioned_tag(repository: str, reference: str, manifest: Manifest) -> None:
        if reference != built.cell.tag:
            raise KeyboardInterrupt  # what the builder raises on SIGTERM
        put(repository, reference, manifest)

    monkeypatch.setattr(api, "put_manifest", cut_after_the_versioned_tag)
    with pytest.raises(KeyboardInterrupt):
        staging.promote(Publisher(api, grid, say), [built.cell], "cut", Records(records, readme))
    monkeypatch.setattr(api, "put_manifest", put)
    assert api.manifest("torch", built.cell.tag).digest == staged.digest  # type: ignore[union-attr]
    assert built.cell.aliases and all(api.manifest("torch", alias) is None for alias in built.cell.aliases)
    assert api.manifest("torch", f"{built.cell.tag}.sbom") is None
    [again] = staging.promote(Publisher(api, grid, say), [built.cell], "cut", Records(records, readme))
    assert again.unchanged and api.manifest("torch", f"{built.cell.tag}.sbom") is not None
    assert all(api.manifest("torch", a).digest == staged.digest for a in built.cell.aliases)  # type: ignore[union-attr]


def test_reports_sit_side_by_side_a_cpu_report_cannot_pass_a_gpu_gate_and_verify_says_what_is_attached(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],  # type: ignore[no-untyped-def]
) -> None:
    running = start_registry(seeded=True)
    grid, api, say, records, readme = _ci_setting(built, running, tmp_path, monkeypatch)
    [staged] = staging.stage(Publisher(api, grid, say, built.client), [built.cell], "g1")
    tag = staging.staging_tag(built.grid, built.cell, "g1")
    subject = api.manifest("torch", tag)
    assert subject is not None

    # A second machine's report joins the first on the digest; neither replaces the other. (The
    # first is the cache's report for this image ID: the latest self-test of it on any engine
    # here, which may be another test's on Docker 29.)
    first = smoke.passing_report(built.image_id)
    assert first is not None
    second = {**smoke_result.report, "host": "another-runner"}
    attachments.Door(api, "torch").attach_report(subject, tag, second, staged.build_id, built.cell.tag)
    attached = attachments.Door(api, "torch").reports(staged.digest)
    assert sorted(r["host"] for r in attached) == sorted([first["host"], "another-runner"])

    # The cell's tags made to wait for a GPU: its real (CPU) reports cannot open that gate.
    gated = replace(built.cell, gpu_gate="required")
    with pytest.raises(UserError, match=r"no passing GPU self-test .* ran on cpu, not on a CUDA device"):
        staging.promote(Publisher(api, grid, say), [gated], "g1", Records(records, readme))
    assert api.manifest("torch", built.cell.tag) is None
    optional = replace(built.cell, gpu_gate="optional")  # optional: untested may go, and says so
    [promoted] = staging.promote(Publisher(api, grid, say), [optional], "g1", Records(records, readme))
    assert json.loads((records / f"{built.cell.name}.json").read_text())["gpu"] == {
        "status": "not tested", "gate": "optional"
    }  # fmt: skip
    assert "GPU: not tested" in readme.read_text()

    # verify, with no engine: the SBOM, both reports, and the build ID against the record.
    monkeypatch.chdir(tmp_path)
    reference = f"{running.host}/torch:{built.cell.tag}"
    assert cli.main(["--matrix", str(grid.path), "verify", reference]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert f"-> {promoted.digest}" in out and "SBOM: attached" in out
    assert "verified (unsigned: what is attached was checked, not who attached it" in captured.err
    assert out.count('cpu report on "cpu": pass') == 2 and "PROBLEM" not in out

    # A SOCI index (as `publish.soci` or `soci push` attaches it for lazy pulling: several zTOC
    # layers, its own type) is named as such, and another tool's referrer is named and not read:
    # verify still passes.
    ztocs = [api.upload_blob("torch", f"ztoc {n}".encode()) for n in range(2)]
    for artifact_type, layers in ((soci.INDEX_TYPE, ztocs), ("application/vnd.example.notes+json", ztocs[:1])):
        document = {
            "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": artifact_type,
            "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": api.upload_blob("torch", b"{}"),
                       "size": 2},
            "layers": [{"mediaType": "application/octet-stream", "digest": digest, "size": 6} for digest in layers],
            "subject": {"mediaType": subject.media_type, "digest": subject.digest, "size": len(subject.body)},
        }  # fmt: skip
        api.put_referrer(
            "torch", Manifest.of(json.dumps(document).encode(), OCI_MANIFEST), subject.digest, artifact_type, {}
        )
    assert cli.main(["--matrix", str(grid.path), "verify", reference]) == 0
    out = capsys.readouterr().out
    assert "SOCI index for lazy pulling: 1 (not signed" in out and "PROBLEM" not in out
    assert "also attached, not read (not what publish attaches): 1 (application/vnd.example.notes+json)" in out

    # A report of another image attached to this digest, and an artifact of another digest
    # listed among its referrers, are both named and fail verify.
    foreign = {**smoke_result.report, "image_id": "sha256:" + "d" * 64}
    attachments.Door(api, "torch").attach_report(
        subject, tag, {**foreign, "host": "x"}, staged.build_id, built.cell.tag
    )
    stray = Manifest.of(
        json.dumps({**json.loads(subject.body), "annotations": {"a": "b"}}).encode(), subject.media_type
    )
    api.put_manifest("torch", "stray", stray)
    elsewhere = api.push_artifact("torch", "stray.sbom", b"{}", publish.ARTIFACT_TYPES["sbom"], {}, stray)
    index = api.manifest("torch", api.referrers_tag(subject.digest))
    assert index is not None
    listed = json.loads(index.body)
    listed["manifests"].append(
        {**listed["manifests"][0], "digest": elsewhere, "size": len(api.manifest("torch", elsewhere).body)}
    )  # type: ignore[union-attr]
    api.put_manifest(
        "torch", api.referrers_tag(subject.digest), Manifest.of(json.dumps(listed).encode(), index.media_type)
    )
    assert cli.main(["--matrix", str(grid.path), "verify", reference]) == 1
    out = capsys.readouterr().out
    assert "the report is for another image (dddddddddddd)" in out
    assert f"artifact {elsewhere[:19]} belongs to another digest" in out


def test_a_connection_cut_mid_push_is_retried_and_nothing_is_half_published(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    behind = start_registry()
    proxy = registry_fixtures.CuttingProxy(int(behind.host.rsplit(":", 1)[1]))
    with proxy.serving() as host:
        cut = RunningRegistry(host)
        [item] = _publish(built, cut, tmp_path, monkeypatch)
    assert proxy.cuts == 1  # the push really lost its connection once
    api = behind.api()  # what the registry itself holds, without the proxy
    assert api.manifest("torch", built.cell.tag).digest == item.digest  # type: ignore[union-attr]
    assert _fully_attached(api, item.digest)
    assert all(api.manifest("torch", a).digest == item.digest for a in built.cell.aliases)  # type: ignore[union-attr]


def _key_files(directory: Path) -> tuple[Path, Path]:
    key = ed25519.Ed25519PrivateKey.generate()
    directory.mkdir(parents=True, exist_ok=True)
    private, public = directory / "signing.pem", directory / "signing.pub"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public


def test_a_signed_publish_verifies_with_its_key_and_every_tampering_fails_in_one_line(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],  # type: ignore[no-untyped-def]
) -> None:
    private, public = _key_files(tmp_path / "team")
    _, stranger = _key_files(tmp_path / "stranger")
    running = start_registry(seeded=True)
    [item] = _publish(built, running, tmp_path, monkeypatch, provenance.load_signer(private))
    monkeypatch.chdir(tmp_path)
    reference, matrix_file = f"{running.host}/torch:{built.cell.tag}", str(built.grid.path)

    def verify_with(key: Path) -> tuple[int, str]:
        code = cli.main(["--matrix", matrix_file, "verify", reference, "--key", str(key)])
        captured = capsys.readouterr()
        return code, captured.out + captured.err

    code, out = verify_with(public)
    assert code == 0, out
    assert "verified (signed: each attestation above was checked against the key" in out and str(public) in out
    assert "signed provenance: 2 locks match this checkout" in out and 'signed cpu self-test on "cpu": pass' in out
    # GitHub's artifact attestation (ci.github_attestations) sits beside ours: a bundle signed
    # keyless, with a certificate as its verification material. No key verifies it, and it is
    # neither a problem nor counted: verify names it and says what checks it.
    api = running.api()
    subject = api.manifest("torch", built.cell.tag)
    assert subject is not None
    stranger_signer = provenance.load_signer(_key_files(tmp_path / "github")[0])
    assert stranger_signer is not None
    about = provenance.Subject(f"{running.host}/torch", subject.digest, item.image_id, item.build_id)
    github = json.loads(
        provenance.bundle(provenance.provenance_statement(about, built.cell, "github"), stranger_signer)
    )
    github["verificationMaterial"] = {"certificate": {"rawBytes": base64.b64encode(b"a Fulcio certificate").decode()}}
    annotations = {"dev.sigstore.bundle.content": "dsse-envelope",
                   provenance.COSIGN_PREDICATE_ANNOTATION: provenance.PROVENANCE}  # fmt: skip
    api.push_artifact("torch", "github.att", json.dumps(github).encode(), provenance.BUNDLE_TYPE, annotations, subject)
    code, out = verify_with(public)
    assert code == 0, out
    assert f"({provenance.PROVENANCE}): signed keyless (a Sigstore certificate), not by a key: not checked" in out
    code, out = verify_with(stranger)
    # provenance, the report and its test result, the SBOM as CycloneDX and as SPDX
    assert code == 1 and out.count("its signature does not verify with the given key") == 5
    assert "no signed provenance attestation from the given key" in out

    # The same statement with one byte of its payload flipped, attached beside the good one.
    good = api.artifact("torch", api.manifest("torch", f"{built.cell.tag}.provenance").digest)  # type: ignore[union-attr]
    payload = bytearray(base64.b64decode(good["dsseEnvelope"]["payload"]))
    payload[payload.index(b'"buildId"') + 12] ^= 1
    envelope = {**good["dsseEnvelope"], "payload": base64.b64encode(bytes(payload)).decode()}
    flipped = json.dumps({**good, "dsseEnvelope": envelope}).encode()
    api.push_artifact("torch", "flipped.att", flipped, provenance.BUNDLE_TYPE, {}, subject)
    # The same, in the bare-envelope form images signed before the bundles carry.
    api.push_artifact("torch", "flipped-bare.att", json.dumps(envelope).encode(), provenance.ENVELOPE_TYPE, {}, subject)
    # A statement the team's key did sign, about another digest, attached to this one.
    signer = provenance.load_signer(private)
    assert signer is not None
    elsewhere = provenance.Subject(f"{running.host}/torch", "sha256:" + "e" * 64, item.image_id, item.build_id)
    attachments.Door(api, "torch").attach_statement(
        subject, "elsewhere.att",
        provenance.selftest_statement(elsewhere, smoke_result.report), signer,
    )  # fmt: skip
    code, out = verify_with(public)
    assert code == 1
    assert out.count("its signature does not verify with the given key") == 2  # the flipped byte, both forms
    assert "signed, but about another digest or image" in out

    # A checkout whose lock is not the one the provenance names.
    lock = built.cell.directory / "requirements.lock"
    other_lock = tmp_path / "requirements.lock"
    other_lock.write_bytes(lock.read_bytes() + b"# another lock\n")
    real_inputs = provenance.build_inputs
    monkeypatch.setattr(
        provenance, "build_inputs",
        lambda cell: {**real_inputs(cell), f"images/{cell.name}/requirements.lock": other_lock},
    )  # fmt: skip
    code, out = verify_with(public)
    assert code == 1 and f"locks differ from this checkout's: images/{built.cell.name}/requirements.lock" in out
    monkeypatch.undo()

    # The tag re-pointed at a manifest with this image's config over other layers (issue 35): a
    # publish that signs does not take it for the image, and pushes and signs the real one.
    body = json.loads(subject.body)
    body["layers"][0] = {**body["layers"][0], "digest": body["config"]["digest"], "size": body["config"]["size"]}
    api.put_manifest("torch", built.cell.tag, Manifest.of(json.dumps(body).encode(), subject.media_type))
    [again] = _publish(built, running, tmp_path, monkeypatch, provenance.load_signer(private))
    assert again.digest == item.digest and api.manifest("torch", built.cell.tag).digest == item.digest  # type: ignore[union-attr]


def test_with_the_teams_key_promote_trusts_only_what_it_signed(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    """The red team's two worst cases (issue 35), on a real registry: a made-up GPU pass, and a
    staged image swapped for another. Neither is signed by the team's key, so neither opens the
    gate; what the key signed still does."""
    private, public = _key_files(tmp_path / "team")
    stranger_private, _ = _key_files(tmp_path / "stranger")
    signer, key = provenance.load_signer(private), provenance.load_public_key(public)
    assert signer is not None
    running = start_registry(seeded=True)
    grid, api, say, records, readme = _ci_setting(built, running, tmp_path, monkeypatch)
    [staged] = staging.stage(Publisher(api, grid, say, built.client, signer), [built.cell], "k1")
    tag = staging.staging_tag(built.grid, built.cell, "k1")
    subject = api.manifest("torch", tag)
    assert subject is not None

    # A made-up GPU pass, attached unsigned and signed by a stranger's key: a cell whose tags
    # wait for a GPU stays where it is. (Without a key the gate reads it as attached: that is
    # why promote says so when it runs without one.)
    forged = dressed_as_gpu_pass(smoke_result.report)
    assert verdict.why_not_a_gpu_pass(forged, staged.image_id) is None  # it would pass an unsigned gate
    attachments.Door(api, "torch").attach_report(subject, tag, forged, staged.build_id, built.cell.tag)
    stranger = provenance.load_signer(stranger_private)
    assert stranger is not None
    about = provenance.Subject(f"{running.host}/torch", subject.digest, staged.image_id, staged.build_id)
    attachments.Door(api, "torch").attach_signed_report(subject, tag, about, forged, stranger)
    gated = replace(built.cell, gpu_gate="required")
    with pytest.raises(UserError, match=r"no passing GPU self-test .*\(signed reports only\)"):
        staging.promote(Publisher(api, grid, say, key=key), [gated], "k1", Records(records, readme))
    assert api.manifest("torch", built.cell.tag) is None

    # The staging tag re-pointed at another image with an SBOM and a passing report of its own,
    # nothing signed: refused for want of a signed provenance about that digest.
    swapped = Manifest.of(
        json.dumps({**json.loads(subject.body), "annotations": {"swapped": "in"}}).encode(), subject.media_type
    )
    api.put_manifest("torch", staging.staging_tag(built.grid, built.cell, "k2"), swapped)
    attachments.Door(api, "torch").attach_report(swapped, "k2", smoke_result.report, staged.build_id, built.cell.tag)
    api.push_artifact("torch", "k2.sbom", b"{}", publish.ARTIFACT_TYPES["sbom"], {}, swapped)
    with pytest.raises(UserError, match=r"no signed provenance from the trusted key on sha256:"):
        staging.promote(Publisher(api, grid, say, key=key), [built.cell], "k2", Records(records, readme))
    assert api.manifest("torch", built.cell.tag) is None

    # Without a key, the digests the stage job recorded (CI carries them to promote as an
    # artifact) catch the same swap: the staging tag moved since it was pushed.
    record = tmp_path / "staged"
    staging.write_staged(Publisher(api, grid, say, built.client), "k1", [staged], record)
    api.put_manifest("torch", tag, swapped)
    with pytest.raises(UserError, match=rf"{tag} now points at {swapped.digest[:19]}, the stage job pushed"):
        staging.promote(Publisher(api, grid, say), [built.cell], "k1", Records(records, readme), record)
    api.put_manifest("torch", tag, subject)
    assert api.manifest("torch", built.cell.tag) is None

    # What the team's key signed about the staged digest opens the gate, and the record keeps it.
    publisher = Publisher(api, grid, say, key=key)
    [promoted] = staging.promote(publisher, [built.cell], "k1", Records(records, readme), record)
    assert api.manifest("torch", built.cell.tag).digest == staged.digest == promoted.digest  # type: ignore[union-attr]


def test_cosign_and_oras_read_what_a_signed_publish_attached(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    """Issue 37, with the real verifiers (Debian's cosign 3.1.1 and oras 1.3.3, offline): cosign's
    `verify-attestation --key` accepts the SLSA provenance, the in-toto test result and the SBOM
    (CycloneDX and SPDX) a signed publish attached, and refuses them with another key or a
    flipped byte; `oras discover` lists every artifact with its type."""
    private, public = _key_files(tmp_path / "team")
    _, stranger = _key_files(tmp_path / "stranger")
    running = start_registry(seeded=True)
    # A reviewed not-affected decision (vex.yaml beside the matrix), for the VEX attestation.
    decision = vex.Decision("GHSA-cpwx-vrp4-4pq7", "jinja2", ("*",), "vulnerable_code_not_in_execute_path",
                            "the images never render templates from untrusted input")  # fmt: skip
    monkeypatch.setattr(vex, "load", lambda matrix_path: (decision,))
    [item] = _publish(built, running, tmp_path, monkeypatch, provenance.load_signer(private))
    cosign, oras = verifiers.tool("cosign"), verifiers.tool("oras")
    environment = verifiers.offline_environment(tmp_path / "home")
    reference = f"{running.host}/torch@{item.digest}"

    def verify_attestation(kind: str, key: Path, image: str = reference) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(cosign), "verify-attestation", "--key", str(key), "--insecure-ignore-tlog", "--type", kind,
             "--allow-insecure-registry", image],
            capture_output=True, text=True, env=environment, timeout=120, check=False,
        )  # fmt: skip

    for kind, predicate_type in (
        ("slsaprovenance1", provenance.PROVENANCE),
        (provenance.TEST_RESULT, provenance.TEST_RESULT),
        ("cyclonedx", provenance.CYCLONEDX),
        ("spdxjson", provenance.SPDX),
        (provenance.OPENVEX, provenance.OPENVEX),
    ):
        accepted = verify_attestation(kind, public)
        assert accepted.returncode == 0, accepted.stderr[-2000:]
        statements = [
            json.loads(base64.b64decode(json.loads(line)["payload"])) for line in accepted.stdout.splitlines()
        ]
        assert {s["predicateType"] for s in statements} == {predicate_type}
        assert all(s["subject"][0]["digest"]["sha256"] == item.digest[7:] for s in statements)
        refused = verify_attestation(kind, stranger)
        assert refused.returncode != 0 and "signature" in refused.stderr
    [result] = [json.loads(base64.b64decode(json.loads(line)["payload"]))
                for line in verify_attestation(provenance.TEST_RESULT, public).stdout.splitlines()]  # fmt: skip
    assert result["predicate"]["result"] in ("PASSED", "WARNED") and "sdpa" in result["predicate"]["passedTests"]

    # One flipped byte: the same image under another digest, carrying only a changed copy of the
    # provenance bundle.
    api = running.api()
    subject = api.manifest("torch", item.digest)
    assert subject is not None
    other = Manifest.of(
        json.dumps({**json.loads(subject.body), "annotations": {"copy": "1"}}).encode(), subject.media_type
    )
    api.put_manifest("torch", "copy", other)
    good = api.artifact("torch", api.manifest("torch", f"{built.cell.tag}.provenance").digest)  # type: ignore[union-attr]
    payload = bytearray(base64.b64decode(good["dsseEnvelope"]["payload"]))
    payload[payload.index(item.digest[7:].encode())] ^= 1
    flipped = {**good, "dsseEnvelope": {**good["dsseEnvelope"], "payload": base64.b64encode(bytes(payload)).decode()}}
    annotations = {
        "dev.sigstore.bundle.content": "dsse-envelope",
        "dev.sigstore.bundle.predicateType": provenance.PROVENANCE,
    }
    api.push_artifact("torch", "copy.att", json.dumps(flipped).encode(), provenance.BUNDLE_TYPE, annotations, other)
    broken = verify_attestation("slsaprovenance1", public, f"{running.host}/torch@{other.digest}")
    assert broken.returncode != 0

    # cosign 2's form alone: the image and its `sha256-<hex>.att` tag in a repository of their
    # own, without the referrers (cosign 3 reads both forms, so only this tells them apart).
    att = api.manifest("torch", cosign_tag.tag(item.digest))
    assert att is not None
    att_layers = json.loads(att.body)["layers"]
    assert len(att_layers) == 6  # the same envelopes as the six bundles
    assert all(layer["mediaType"] == "application/vnd.dsse.envelope.v1+json" for layer in att_layers)
    for manifest in (subject, att):
        document = json.loads(manifest.body)
        for blob in [document["config"], *document["layers"]]:
            mounted = requests.post(
                f"http://{running.host}/v2/legacy/blobs/uploads/?mount={blob['digest']}&from=torch", timeout=30
            )
            assert mounted.status_code == 201, mounted.text
    api.put_manifest("legacy", item.digest, subject)
    api.put_manifest("legacy", cosign_tag.tag(item.digest), att)
    assert api.referrers("legacy", item.digest) == []
    legacy = f"{running.host}/legacy@{item.digest}"
    for kind in ("slsaprovenance1", provenance.TEST_RESULT, "cyclonedx", "spdxjson", provenance.OPENVEX):
        accepted = verify_attestation(kind, public, legacy)
        assert accepted.returncode == 0, accepted.stderr[-2000:]
        refused = verify_attestation(kind, stranger, legacy)
        assert refused.returncode != 0

    listed = subprocess.run(
        [str(oras), "discover", "--plain-http", "--format", "json", reference],
        capture_output=True, text=True, env=environment, timeout=60, check=False,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr[-2000:]
    types = [entry["artifactType"] for entry in json.loads(listed.stdout).get("referrers", [])]
    # provenance, the report and its test result, the SBOM as CycloneDX and as SPDX, the VEX
    assert types.count(provenance.BUNDLE_TYPE) == 6
    assert publish.ARTIFACT_TYPES["sbom"] in types and publish.ARTIFACT_TYPES["selftest"] in types


def test_pruning_deletes_stale_reports_and_their_statements_and_never_a_failure(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    """Issue 39: every GPU run adds a report (and two signed statements) to a digest, up to the
    cap the gates read. `publish prune --key` deletes another image's passes, junk, and
    a device's older passes that a newer pass the key verifies supersedes, with their signed
    statements and cosign-form layers; a failure stays. Without the key, a signed pass stays."""
    private, public = _key_files(tmp_path / "team")
    signer = provenance.load_signer(private)
    assert signer is not None
    running = start_registry(seeded=True)
    [item] = _publish(built, running, tmp_path, monkeypatch, signer)
    api, tag = running.api(), built.cell.tag
    subject = api.manifest("torch", tag)
    assert subject is not None
    about = provenance.Subject(f"{running.host}/torch", subject.digest, item.image_id, item.build_id)

    def attach(report: dict[str, object], signed: bool = True) -> None:
        attachments.Door(api, "torch").attach_report(subject, tag, report, item.build_id, tag)
        if signed:
            attachments.Door(api, "torch").attach_signed_report(subject, tag, about, report, signer)

    # The report publish attached (the build machine's latest self-test of this image).
    [newest] = attachments.Door(api, "torch").reports(subject.digest)
    assert newest["image_id"] == item.image_id and newest["status"] == "pass"
    attach({**newest, "time": "2020-01-01T00:00:00Z"})  # an older pass of the same device
    attach({**newest, "image_id": "sha256:" + "d" * 64}, signed=False)  # another image's
    failed = {**newest, "status": "fail", "failed": ["sdpa"], "device": "NVIDIA H200", "time": "2019-01-01T00:00:00Z"}
    attach(failed)
    api.push_artifact("torch", "junk.selftest", b"not a report", reports.SELFTEST_TYPE, {}, subject)
    assert len(api.referrers("torch", subject.digest, reports.SELFTEST_TYPE)) == 5
    statements_before = len(attachments.Door(api, "torch").listed(subject.digest, provenance.SIGNED_TYPES))
    att_before = len(json.loads(api.manifest("torch", cosign_tag.tag(subject.digest)).body)["layers"])  # type: ignore[union-attr]

    monkeypatch.chdir(tmp_path)
    argv = ["--matrix", str(built.grid.path), "publish", "prune", "--registry", running.host, built.cell.name]
    assert cli.main(argv) == 0  # without the key: the older signed pass is not known to be superseded
    assert sorted(
        r["time"] for r in attachments.Door(api, "torch").reports(subject.digest) if r["status"] == "pass"
    ) == sorted([newest["time"], "2020-01-01T00:00:00Z"])
    argv += ["--key", str(public)]
    assert cli.main(argv) == 0

    left = attachments.Door(api, "torch").reports(subject.digest)
    assert sorted((r["time"], r["status"]) for r in left) == sorted(
        [(newest["time"], "pass"), ("2019-01-01T00:00:00Z", "fail")]
    )
    # The older pass's two signed statements went, in both forms; the rest of the signing stayed.
    assert len(attachments.Door(api, "torch").listed(subject.digest, provenance.SIGNED_TYPES)) == statements_before - 2
    att_after = len(json.loads(api.manifest("torch", cosign_tag.tag(subject.digest)).body)["layers"])  # type: ignore[union-attr]
    assert att_after == att_before - 2
    key = provenance.load_public_key(public)
    kept = [provenance.verified_statement(api.artifact("torch", str(e["digest"])), str(e["artifactType"]), key,
                                          subject.digest, item.image_id)
            for e in attachments.Door(api, "torch").listed(subject.digest, provenance.SIGNED_TYPES)]  # fmt: skip
    times = {s["predicate"].get("time") for s in kept if s["predicateType"] == provenance.SELFTEST}
    assert times == {newest["time"], "2019-01-01T00:00:00Z"}
    # Nothing left to prune: a second run deletes nothing.
    assert cli.main(argv) == 0 and len(attachments.Door(api, "torch").reports(subject.digest)) == 2


def test_publish_soci_attaches_an_index_by_which_a_node_starts_the_image_lazily(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    """`publish.soci: true` makes the index with the real soci CLI (Debian's package, which
    publish fetches itself) and pushes it beside the
    unchanged gzip image; a node of its own (containerd and soci-snapshotter, from empty) then
    mounts the image's large layers lazily by it and runs torch."""
    assert smoke_result.status == "pass" and lazy.available()
    # No soci on PATH here: publish fetches Debian's package data/tools.yaml pins, by its sha256.
    assert shutil.which("soci") is None
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-config"))
    registry = start_registry(tls=True, seeded=True)  # soci-snapshotter 0.4 fetches indexes over HTTPS only
    grid = _grid_for(built, registry)
    # Both forms: v1 is what soci-snapshotter 0.4.1 (the newest packaged) starts lazily; v2, the
    # default, is checked for its structure with the real tools (no v0.10+ snapshotter here).
    both = grid.spec.publish.model_copy(update={"soci": True, "soci_index": "both"})
    spec = grid.spec.model_copy(update={"publish": both})
    lazy_grid = Matrix(grid.path, spec, grid.cells, grid.rejected)
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{publish.TABLE_START}\n{publish.TABLE_END}\n")

    team_key = CryptoSigner.generate_ed25519()  # a later publish keeps only an index the team's key named

    def publish_once() -> publish.Publication:
        options = publish.PublishOptions(Records(tmp_path / "records", readme), ca_file=registry.ca, signer=team_key)
        [item] = publish.publish(built.client, lazy_grid, [built.cell], lambda _: None, options)
        return item

    item = publish_once()
    api = registry.api()
    index_digest = api.attached("torch", item.digest)[soci.INDEX_TYPE]
    image = api.manifest("torch", item.digest)
    index = api.manifest("torch", index_digest)
    assert image is not None and index is not None
    ztocs = soci.check_index(json.loads(index.body), image)  # the index as pushed indexes this image
    assert ztocs and all(api.has_blob("torch", ztoc) for ztoc in ztocs)
    assert "SOCI index" in item.attached
    again = publish_once()  # already attached, and named in the team's signed statement: not made again
    assert again.digest == item.digest and "SOCI index" not in again.attached
    assert [e["digest"] for e in api.referrers("torch", item.digest, soci.INDEX_TYPE)] == [index_digest]

    # A node: the registry's storage served over plain HTTP too, where soci-snapshotter 0.4
    # fetches a loopback registry's layers (harness/lazy.py).
    assert registry.root is not None and registry.ca is not None
    plain_root = tmp_path / "registry-plain"
    plain_root.mkdir()
    (plain_root / "data").symlink_to(registry.root / "data")
    with loopback.registry(plain_root) as plain:
        start = lazy.first_start(tmp_path / "node", registry.ca, f"{registry.host}/torch:{built.cell.tag}", plain)
    assert start.lazy_layers >= 1, start
    assert "tensor([2., 2.])" in start.output

    # v2: the SOCI-enabled image under <tag>-soci, made from the same zTOCs.
    enabled_tag = soci.enabled_tag(built.cell.tag)
    enabled = api.manifest("torch", enabled_tag)
    assert enabled is not None and enabled.media_type == "application/vnd.oci.image.index.v1+json"
    assert soci.enabled_ztocs(api, "torch", enabled_tag, image) == ztocs
    assert "SOCI-enabled image" in item.attached and "SOCI-enabled image" not in again.attached
    # oras copies it whole to another repository, as it would any multi-platform image (the index,
    # both manifests, the config, every layer and zTOC), and the engine pulls it from there as the
    # same image: the same config, so the same image ID.
    oras = verifiers.tool("oras")
    copied = subprocess.run(
        [str(oras), "cp", "--from-ca-file", str(registry.ca), "--to-ca-file", str(registry.ca),
         f"{registry.host}/torch:{enabled_tag}", f"{registry.host}/elsewhere:{enabled_tag}"],
        capture_output=True, text=True, env=verifiers.offline_environment(tmp_path / "oras-home"), check=False,
    )  # fmt: skip
    assert copied.returncode == 0, copied.stdout + copied.stderr
    assert soci.enabled_ztocs(api, "elsewhere", enabled_tag, image) == ztocs
    pulled = built.client.images.pull(f"{registry.host}/elsewhere", tag=enabled_tag)
    try:
        assert pulled.id == built.image_id
    finally:
        built.client.images.remove(f"{registry.host}/elsewhere:{enabled_tag}")


def test_a_third_partys_sbom_attached_first_is_neither_taken_for_the_images_nor_signed(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    """Issue 47: with push rights alone, a party attached its own SBOM to the image before the
    team's signing run; publish took it for the image's SBOM and the team's key signed it. The
    key signs only the SBOM the builder makes, and publish attaches that one beside the other."""
    private, public = _key_files(tmp_path / "team")
    running = start_registry(seeded=True)
    [item] = _publish(built, running, tmp_path, monkeypatch)  # unsigned: the image and its own SBOM
    api, sbom_type = running.api(), publish.ARTIFACT_TYPES["sbom"]
    subject = api.manifest("torch", built.cell.tag)
    assert subject is not None
    [ours] = api.referrers("torch", subject.digest, sbom_type)
    api.delete_manifest("torch", str(ours["digest"]))  # as if the party came before it
    api.drop_from_referrers_tag("torch", subject.digest, {str(ours["digest"])})
    forged = {"bomFormat": "CycloneDX", "specVersion": "1.6", "components": [{"name": "trust-me", "version": "1"}]}
    api.push_artifact("torch", "forged.sbom", json.dumps(forged).encode(), sbom_type, {}, subject)

    _publish(built, running, tmp_path, monkeypatch, provenance.load_signer(private))
    listed = api.referrers("torch", subject.digest, sbom_type)
    documents = [api.artifact("torch", str(entry["digest"])) for entry in listed]
    assert len(documents) == 2 and forged in documents  # the party's stays; the image's own is back beside it
    key = provenance.load_public_key(public)
    signed = [
        provenance.verified_statement(api.artifact("torch", str(e["digest"])), str(e["artifactType"]), key,
                                      subject.digest, item.image_id)
        for e in attachments.Door(api, "torch").listed(subject.digest, provenance.SIGNED_TYPES)
    ]  # fmt: skip
    [cyclonedx] = [s["predicate"] for s in signed if s["predicateType"] == provenance.CYCLONEDX]
    assert cyclonedx != forged and cyclonedx in documents
    assert all(c.get("name") != "trust-me" for c in cyclonedx["components"])


def test_junk_annotated_as_the_teams_statements_does_not_stop_the_key_signing(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    """Issue 47: three junk artifacts annotated as provenance, self-test and CycloneDX statements
    made a publish holding the key sign nothing, silently. What is signed is what the key verifies."""
    private, public = _key_files(tmp_path / "team")
    running = start_registry(seeded=True)
    [item] = _publish(built, running, tmp_path, monkeypatch)  # unsigned
    api = running.api()
    subject = api.manifest("torch", built.cell.tag)
    assert subject is not None
    for kind in (provenance.PROVENANCE, provenance.SELFTEST, provenance.CYCLONEDX):
        api.push_artifact("torch", f"junk-{abs(hash(kind))}", b"{}", provenance.BUNDLE_TYPE,
                          {provenance.PREDICATE_ANNOTATION: kind}, subject)  # fmt: skip
    _publish(built, running, tmp_path, monkeypatch, provenance.load_signer(private))
    key = provenance.load_public_key(public)
    kinds = attachments.Door(api, "torch").verified_kinds(subject.digest, item.image_id, key)
    assert {provenance.PROVENANCE, provenance.SELFTEST, provenance.CYCLONEDX} <= kinds


def test_anyone_can_rebuild_a_published_tag_and_get_its_image_id(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],  # type: ignore[no-untyped-def]
) -> None:
    """Issue 48: `verify --rebuild REF` builds the tag's cell again here, without cache, from this
    checkout, and compares the builder's image ID with the published config digest."""
    private, public = _key_files(tmp_path / "team")
    running = start_registry(seeded=True)
    [item] = _publish(built, running, tmp_path, monkeypatch, provenance.load_signer(private))
    monkeypatch.chdir(tmp_path)
    reference = f"{running.host}/torch:{built.cell.tag}"
    try:
        code = cli.main(["--matrix", str(built.grid.path), "verify", "--rebuild", "--key", str(public), reference])
        out = capsys.readouterr().out
        assert code == 0, out
        assert f"rebuilt {reference}: the same image ID {item.image_id}" in out
        assert "its signed provenance names this checkout's locks and build ID" in out
    finally:
        build.remove_image(built.client, f"torch-images/rebuild:{built.cell.name}")


def _tampered(api: Registry, tag: str) -> str:
    """The published image with one file of its top layer changed by hand, pushed under the same
    tag (another digest); returns the path changed."""
    manifest = api.manifest("torch", tag)
    assert manifest is not None
    document = json.loads(manifest.body)
    config = json.loads(api.blob("torch", document["config"]["digest"]))
    top = document["layers"][-1]
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(api.blob("torch", top["digest"], 1 << 30)))) as old:
        members = [(m, old.extractfile(m).read() if m.isfile() else None) for m in old.getmembers()]  # type: ignore[union-attr]
    changed = next(m.name for m, data in members if m.isfile() and m.name.endswith("spec.json"))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as new:
        for member, data in members:
            if member.name == changed and data is not None:
                data = data + b"\n"
                member.size = len(data)
            new.addfile(member, io.BytesIO(data) if data is not None else None)
    raw = buffer.getvalue()
    layer = gzip.compress(raw, mtime=0)
    config["rootfs"]["diff_ids"][-1] = "sha256:" + hashlib.sha256(raw).hexdigest()
    config_bytes = json.dumps(config, sort_keys=True).encode()
    document["config"] = {**document["config"], "digest": api.upload_blob("torch", config_bytes),
                          "size": len(config_bytes)}  # fmt: skip
    document["layers"][-1] = {**top, "digest": api.upload_blob("torch", layer), "size": len(layer)}
    api.put_manifest("torch", tag, Manifest.of(json.dumps(document).encode(), manifest.media_type))
    return changed


def test_a_rebuild_names_the_first_differing_layer_and_its_paths_and_another_lock_is_refused_first(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],  # type: ignore[no-untyped-def]
) -> None:
    """Issue 48: a published image whose one layer was changed by hand differs, at that layer and
    path; a checkout whose lock is not the provenance's is refused before anything is built."""
    private, public = _key_files(tmp_path / "team")
    running = start_registry(seeded=True)
    _publish(built, running, tmp_path, monkeypatch, provenance.load_signer(private))
    api = running.api()
    changed = _tampered(api, built.cell.tag)
    reference = verify.parse_reference(f"{running.host}/torch:{built.cell.tag}")
    published = rebuild.resolve(api, reference)
    found = rebuild.Rebuilt(published, built.cell.name, built.image_id)
    # The comparison a rebuild ends with, against the image the host's engine built from this checkout.
    rebuild.compare_layers(built.client, api, "torch", published, built.reference, found)
    assert not found.same and found.differing_layer == len(published.diff_ids) - 1
    assert any(line.startswith(f"{changed}: content differs") for line in found.paths), found.paths

    # Another lock in the checkout: refused by the signed provenance, before any build.
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    shutil.copy(built.grid.path, checkout / "matrix.yaml")
    shutil.copytree(built.grid.images_dir, checkout / "images")
    lock_file = checkout / "images" / built.cell.name / "requirements.lock"
    lock_file.write_text(lock_file.read_text() + "    # via nothing\n")
    before = {image.id for image in built.client.images.list(all=True)}
    _publish(built, running, tmp_path, monkeypatch, provenance.load_signer(private))  # the genuine image again
    monkeypatch.chdir(tmp_path)
    argv = ["--matrix", str(checkout / "matrix.yaml"), "verify", "--rebuild", "--key", str(public), str(reference)]
    assert cli.main(argv) == 2
    said = capsys.readouterr().err
    assert "requirements.lock" in said and "check out the commit" in said
    assert {image.id for image in built.client.images.list(all=True)} <= before  # nothing built


def test_a_rebuild_names_a_layer_appended_by_docker_commit_and_the_file_in_it(
    built: BuiltCell, start_registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 57: the commonest tampering, one file copied into a container of the published image
    and the container committed and pushed under the tag, is named as the layer added and the
    file in it, not only as configs that differ."""
    running = start_registry(seeded=True)
    _publish(built, running, tmp_path, monkeypatch)
    tampered = f"{running.host}/torch:{built.cell.tag}"
    container = built.client.containers.create(built.reference, command=["true"])
    planted = io.BytesIO()
    with tarfile.open(fileobj=planted, mode="w") as archive:
        info = tarfile.TarInfo("planted.sh")
        info.size, info.mode = 6, 0o755
        archive.addfile(info, io.BytesIO(b"echo x"))
    try:
        container.put_archive("/usr/local/bin", planted.getvalue())
        committed = container.commit(repository=f"{running.host}/torch", tag=built.cell.tag)
    finally:
        container.remove()
    try:
        for line in built.client.images.push(f"{running.host}/torch", built.cell.tag, stream=True, decode=True):
            assert "error" not in line, line
        api = running.api()
        published = rebuild.resolve(api, verify.parse_reference(tampered))
        found = rebuild.Rebuilt(published, built.cell.name, built.image_id)
        rebuild.compare_layers(built.client, api, "torch", published, built.reference, found)
    finally:
        built.client.images.remove(committed.id, force=True)
    assert not found.same and found.differing_layer == len(published.diff_ids) - 1
    assert "the published image has 1 layer(s) more than the rebuild" in found.notes, found.notes
    assert "usr/local/bin/planted.sh: only in the published layer" in found.paths, found.paths


def test_promote_counts_rebuilder_keys_that_agree_and_never_the_teams_key_or_one_key_twice(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    """Issue 55: with publish.require_rebuilds: 2, a tag moves only when two rebuilder keys of
    publish.rebuilders signed a rebuild that gave the staged image's ID. One key holder cannot move
    it: not with the team's key, not with one rebuilder key under two engine names (classic and
    BuildKit, say); a rebuild of another image does not count. alice and bob agreeing do."""
    private, public = _key_files(tmp_path / "team")
    signer, key = provenance.load_signer(private), provenance.load_public_key(public)
    assert signer is not None
    running = start_registry(seeded=True)
    grid, api, say, records, readme = _ci_setting(built, running, tmp_path, monkeypatch)
    keys: dict[str, CryptoSigner] = {}
    for name in ("alice", "bob"):
        rebuilder_private, _ = _key_files(tmp_path / "rebuilders" / name)
        loaded = provenance.load_signer(rebuilder_private)
        assert loaded is not None
        keys[name] = loaded
    quorum = {"require_rebuilds": 2, "rebuilders": {n: f"rebuilders/{n}/signing.pub" for n in keys}}
    grid = replace(grid, path=tmp_path / "matrix.yaml")  # the rebuilders' keys are read beside it
    grid.spec = grid.spec.model_copy(update={"publish": grid.spec.publish.model_copy(update=quorum)})
    [staged] = staging.stage(Publisher(api, grid, say, built.client, signer), [built.cell], "q1")
    subject = api.manifest("torch", staging.staging_tag(built.grid, built.cell, "q1"))
    assert subject is not None
    about = provenance.Subject(f"{running.host}/torch", subject.digest, staged.image_id, staged.build_id)
    said: list[str] = []

    def rebuilt(by: CryptoSigner, engine: str, image_id: str) -> None:
        statement = provenance.rebuild_statement(replace(about, image_id=image_id), engine, "test", "2026-12-07T00:00Z")
        tag = f"q1.rebuild-{hashlib.sha256((by.public_key.keyid + engine + image_id).encode()).hexdigest()[:12]}"
        attachments.Door(api, "torch").attach_statement(subject, tag, statement, by)

    def promote() -> list[publish.Publication]:
        return staging.promote(Publisher(api, grid, said.append, key=key), [built.cell], "q1", Records(records, readme))

    with pytest.raises(UserError, match=r"publish\.require_rebuilds is 2; .* from 0 rebuilder key\(s\): none"):
        promote()
    rebuilt(signer, "Docker 20.10.24 (overlay2)", staged.image_id)  # the team's own: never a rebuilder
    rebuilt(signer, "Docker 29.1.3 (containerd store)", staged.image_id)
    rebuilt(keys["alice"], "Docker 20.10.24 (overlay2)", staged.image_id)
    rebuilt(keys["alice"], "Docker 20.10.24 (overlay2), BuildKit", staged.image_id)  # one key, two "engines"
    rebuilt(keys["bob"], "Docker 29.1.3 (containerd store)", "sha256:" + "d" * 64)  # disagreed: another image
    with pytest.raises(UserError, match=r"from 1 rebuilder key\(s\): alice \(\"Docker 20\.10\.24"):
        promote()
    assert api.manifest("torch", built.cell.tag) is None
    rebuilt(keys["bob"], "Docker 29.1.3 (containerd store)", staged.image_id)
    [promoted] = promote()
    assert promoted.digest == staged.digest
    assert any("rebuilt to the same image ID by alice" in line and "bob" in line for line in said)


def test_the_sign_job_signs_what_the_run_staged_as_the_registry_holds_it_and_no_look_alike(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    """Issue 55, CI's shape on a real registry: the cell job stages with no key and records what it
    attached; the sign job, with the key and no engine, signs the staged digest's provenance and
    the report and SBOM with the recorded bytes, as the registry holds them. A made-up GPU pass a
    push-rights party attached beside them is never signed; a record that names bytes not attached
    to the digest signs nothing; a rerun signs nothing twice; promote with the key then moves the tag."""
    private, public = _key_files(tmp_path / "team")
    signer, key = provenance.load_signer(private), provenance.load_public_key(public)
    assert signer is not None
    running = start_registry(seeded=True)
    grid, api, say, records, readme = _ci_setting(built, running, tmp_path, monkeypatch)
    stager = Publisher(api, grid, say, built.client)  # no key in the job that built
    [staged] = staging.stage(stager, [built.cell], "s1")
    record = tmp_path / "staged"
    staging.write_staged(stager, "s1", [staged], record)
    tag = staging.staging_tag(built.grid, built.cell, "s1")
    subject = api.manifest("torch", tag)
    assert subject is not None
    door = attachments.Door(api, "torch")
    assert door.verified_kinds(subject.digest, staged.image_id, key) == set()  # nothing signed yet
    forged = dressed_as_gpu_pass(smoke_result.report)
    door.attach_report(subject, tag, forged, staged.build_id, built.cell.tag)  # a look-alike, not recorded

    # A dry run decides as the run would and writes nothing: each write it would make, said.
    would: list[str] = []
    dry = Publisher(api, grid, would.append, signer=signer, dry_run=True)
    [dry_line] = signing.sign(dry, [built.cell], "s1", record)
    assert "dry run: would sign provenance" in dry_line
    assert any(f"would sign and attach {tag}.provenance" in line for line in would), would
    assert door.verified_kinds(subject.digest, staged.image_id, key) == set()  # still nothing signed
    no_engine = Publisher(api, grid, say, signer=signer)  # the sign job: registry and key, no engine
    [line] = signing.sign(no_engine, [built.cell], "s1", record)
    assert "signed provenance" in line and "SBOM (CycloneDX, SPDX)" in line and "cpu self-test (pass)" in line
    signed = door.signed(subject.digest, staged.image_id, key, provenance.MAX_VERIFIED)
    reports_signed = [s.predicate for s in signed if s.predicate_type == provenance.SELFTEST]
    assert [r["device"] for r in reports_signed] == [smoke_result.report["device"]]  # the forged H200 pass: never
    [again] = signing.sign(no_engine, [built.cell], "s1", record)
    assert "signed nothing new" in again
    assert len(door.signed(subject.digest, staged.image_id, key, provenance.MAX_VERIFIED)) == len(signed)

    wrong = tmp_path / "wrong"
    wrong.mkdir()
    recorded_text = json.loads((record / f"{tag}.json").read_text())
    recorded_text["attached"]["selftest"] = "sha256:" + hashlib.sha256(json.dumps(forged).encode()).hexdigest()
    (wrong / f"{tag}.json").write_text(json.dumps(recorded_text))
    with pytest.raises(UserError, match=r"none with those bytes is attached to it; nothing more signed"):
        signing.sign(no_engine, [built.cell], "s1", wrong)

    [promoted] = staging.promote(
        Publisher(api, grid, say, key=key), [built.cell], "s1", Records(records, readme), record
    )
    assert api.manifest("torch", built.cell.tag).digest == staged.digest == promoted.digest  # type: ignore[union-attr]
