"""Faults in publishing (issue 58), against a real registry (Debian's distribution 2.8) and the real
builder run as CI runs it, in a process of its own: SIGTERM or SIGINT in each phase of `publish push`
(the push, the attachments, the alias moves), the registry dying and coming back during attach,
promote and prune, and two publishes of one tag at once. After each fault: one line and a non-zero
status, no alias ahead of its versioned tag, no registry-named tag left in the engine, and the same
command run again finishes the job. Opt-in (`-m faults`)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from builder.assemble import smoke
from builder.oci.registry import Registry
from builder.publish import attachments, publish, staging
from builder.publish.publisher import Publisher, Records
from harness import registry_fixtures
from tests.integration.conftest import BuiltCell, RunningRegistry
from tests.integration.test_faults import _cut_when
from tests.integration.test_publish import _grid_for
from tests.support.reports import dressed_as_gpu_pass

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]


def _checkout(built: BuiltCell, tmp_path: Path) -> Path:
    """A copy of the matrix and images/ (publish writes published/ and README.md beside the matrix)."""
    checkout = tmp_path / "checkout"
    checkout.mkdir(parents=True, exist_ok=True)
    shutil.copy(built.grid.path, checkout / "matrix.yaml")
    if not (checkout / "images").exists():
        shutil.copytree(built.grid.images_dir, checkout / "images")
    (checkout / "README.md").write_text(f"# x\n{publish.TABLE_START}\nNothing published yet.\n{publish.TABLE_END}\n")
    return checkout


def _builder(checkout: Path, host: str, *verb: str) -> list[str]:
    return [sys.executable, "-m", "builder", "--matrix", str(checkout / "matrix.yaml"), "publish", *verb,
            "--registry", host]  # fmt: skip


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "DOCKER_CONFIG": str(tmp_path / "no-docker-config"), "PYTHONUNBUFFERED": "1"}


def _registry_tags_in_engine(built: BuiltCell, host: str) -> list[str]:
    return [tag for image in built.client.images.list() for tag in image.tags if tag.startswith(host)]


def _no_alias_ahead(api: Registry, built: BuiltCell, tag: str | None = None) -> None:
    """Every alias names what the versioned tag names, or is absent (or still at its old image
    where `tag` is a staging tag): never an image the versioned tag does not."""
    versioned = api.manifest("torch", built.cell.tag)
    for alias in built.cell.aliases:
        moved = api.manifest("torch", alias)
        if moved is not None:
            assert versioned is not None and moved.digest == versioned.digest, (alias, moved.digest)


def _finished(api: Registry, built: BuiltCell) -> str:
    """The publish is whole: the versioned tag, its SBOM and report, and every alias on it."""
    tagged = api.manifest("torch", built.cell.tag)
    assert tagged is not None
    assert set(api.attached("torch", tagged.digest)) == set(publish.ARTIFACT_TYPES.values())
    assert all(api.manifest("torch", a).digest == tagged.digest for a in built.cell.aliases)  # type: ignore[union-attr]
    return tagged.digest


def _one_line(said: str) -> str:
    return [line for line in said.splitlines() if line.strip()][-1]


@pytest.mark.parametrize(
    ("stop", "status", "when"),
    [
        (signal.SIGTERM, 143, lambda line: line.startswith("pushing ")),
        (signal.SIGINT, 130, lambda line: line.startswith("attaching ")),
        (signal.SIGTERM, 143, lambda line: line.startswith("attaching ")),
        # The alias line is said once it moved: the signal may land after the registry work, with
        # only the record and the README's table left to write.
        (signal.SIGTERM, (143, 0), lambda line: line.startswith("moved ")),
    ],
    ids=["SIGTERM-push", "SIGINT-attach", "SIGTERM-attach", "SIGTERM-alias-moves"],
)
def test_a_publish_stopped_in_any_phase_leaves_no_alias_ahead_and_the_same_command_finishes(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    stop: signal.Signals,
    status: int | tuple[int, int],
    when: Callable[[str], bool],
) -> None:
    registry = start_registry(seeded=True)
    checkout = _checkout(built, tmp_path)
    command = _builder(checkout, registry.host, "push", built.cell.name)
    engine_tags_before = _registry_tags_in_engine(built, registry.host)
    running_env = _env(tmp_path)
    monkeypatch.setenv("DOCKER_CONFIG", running_env["DOCKER_CONFIG"])  # what _cut_when's process gets
    code, said = _cut_when(command, when, lambda running: running.send_signal(stop))
    assert code in (status if isinstance(status, tuple) else (status,)) and "Traceback" not in said, said[-3000:]
    if code != 0:
        assert ("terminated" if stop == signal.SIGTERM else "interrupted") in _one_line(said), said[-2000:]
    api = registry.api()
    _no_alias_ahead(api, built)
    assert _registry_tags_in_engine(built, registry.host) == engine_tags_before
    again = subprocess.run(command, cwd=checkout, capture_output=True, text=True, timeout=600, env=running_env)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    _finished(api, built)
    assert _registry_tags_in_engine(built, registry.host) == engine_tags_before
    assert (checkout / "published" / f"{built.cell.name}.json").is_file()


def _cut_by_a_dying_registry(
    registry: RunningRegistry, at: bytes, checkout: Path, verb: list[str], while_down: Callable[[Registry], None]
) -> None:
    """Run `publish VERB` through a proxy that dies at the request `at` matches: it ends after its
    retries in one line, status 2; `while_down` checks what the registry holds then; once the
    registry is back, the same command succeeds."""
    proxy = registry_fixtures.DyingProxy(int(registry.host.rsplit(":", 1)[1]), at)
    environment = _env(checkout.parent)
    with proxy.serving() as host:
        command = _builder(checkout, host, *verb)
        cut = subprocess.run(command, cwd=checkout, capture_output=True, text=True, timeout=600, env=environment)
        said = cut.stdout + cut.stderr
        assert proxy.deaths == 1 and cut.returncode == 2 and "Traceback" not in said, said[-3000:]
        assert "did not answer after" in _one_line(said), said[-2000:]
        while_down(registry.api())
        proxy.wait_until_back()
        again = subprocess.run(command, cwd=checkout, capture_output=True, text=True, timeout=600, env=environment)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]


def test_a_registry_that_dies_during_the_attachments_ends_the_publish_in_one_line_and_a_rerun_attaches(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    """The registry dies at the first artifact's manifest (after the image is under its tag) and
    comes back 20 s later: the publish ends after its retries in one line, status 2, with the
    aliases unmoved; the same command then attaches what is missing and moves them."""
    registry = start_registry(seeded=True)
    checkout = _checkout(built, tmp_path)

    def aliases_unmoved(api: Registry) -> None:
        assert all(api.manifest("torch", alias) is None for alias in built.cell.aliases)

    at = rb"^PUT /v2/torch/manifests/sha256"
    _cut_by_a_dying_registry(registry, at, checkout, ["push", built.cell.name], aliases_unmoved)
    _finished(registry.api(), built)


def test_a_registry_that_dies_during_promote_moves_no_alias_ahead_and_the_same_promote_finishes(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A staged CPU image promoted while the registry dies at the alias's move: one line, status
    2, the versioned tag on the staged image and the alias nowhere ahead of it; promote again
    finishes."""
    registry = start_registry(seeded=True)
    checkout = _checkout(built, tmp_path)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-config"))
    grid = _grid_for(built, registry)
    [staged] = staging.stage(Publisher(registry.api(), grid, lambda _: None, built.client), [built.cell], "dies")

    def tag_staged_and_no_alias_ahead(api: Registry) -> None:
        assert api.manifest("torch", built.cell.tag).digest == staged.digest  # type: ignore[union-attr]
        _no_alias_ahead(api, built)

    at = rb"^PUT /v2/torch/manifests/" + built.cell.aliases[0].encode()
    verb = ["promote", "--run", "dies", built.cell.name]
    _cut_by_a_dying_registry(registry, at, checkout, verb, tag_staged_and_no_alias_ahead)
    assert _finished(registry.api(), built) == staged.digest


def test_a_registry_that_dies_during_prune_deletes_nothing_it_should_keep_and_the_same_prune_finishes(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A published image with an older pass of a device beside a newer one: prune's delete of the
    older meets a dead registry. One line, status 2, the newer pass and the SBOM kept; prune
    again deletes the older pass and nothing else."""
    registry = start_registry(seeded=True)
    checkout = _checkout(built, tmp_path)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-config"))
    api = registry.api()
    options = publish.PublishOptions(Records(checkout / "published", checkout / "README.md"))
    [item] = publish.publish(built.client, _grid_for(built, registry), [built.cell], lambda _: None, options)
    subject = api.manifest("torch", item.digest)
    assert subject is not None
    door = attachments.Door(api, "torch")
    older, newer = (
        {**dressed_as_gpu_pass(smoke_result.report), "time": t}
        for t in ("2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z")
    )
    for gpu in (older, newer):
        door.attach_report(subject, item.target, gpu, item.build_id, built.cell.tag)
    times_before = sorted(r["time"] for r in door.reports(item.digest))
    assert older["time"] in times_before and newer["time"] in times_before

    def every_report_still_there(_: Registry) -> None:
        assert sorted(r["time"] for r in door.reports(item.digest)) == times_before  # the delete never arrived

    _cut_by_a_dying_registry(registry, rb"^DELETE /v2/", checkout, ["prune", built.cell.name], every_report_still_there)
    times_after = [r["time"] for r in door.reports(item.digest)]
    assert newer["time"] in times_after and older["time"] not in times_after, times_after
    assert publish.ARTIFACT_TYPES["sbom"] in api.attached("torch", item.digest)


def test_two_publishes_of_one_tag_at_once_both_end_whole_with_each_artifact_once(
    built: BuiltCell,
    smoke_result: smoke.SmokeResult,
    start_registry,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    """Two CI jobs publishing one cell to one registry at the same moment: both end (0, or one
    line), the tag and alias name the image, and its SBOM and report are each attached once."""
    registry = start_registry(seeded=True)
    checkouts = [_checkout(built, tmp_path / str(n)) for n in range(2)]
    commands = [_builder(checkout, registry.host, "push", built.cell.name) for checkout in checkouts]
    both = [subprocess.Popen(c, cwd=ch, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(tmp_path))
            for c, ch in zip(commands, checkouts, strict=True)]  # fmt: skip
    outputs = [running.communicate(timeout=600)[0] for running in both]
    for running, said in zip(both, outputs, strict=True):
        assert running.returncode in (0, 2) and "Traceback" not in said, said[-3000:]
    assert any(running.returncode == 0 for running in both), outputs
    api = registry.api()
    digest = _finished(api, built)
    kinds = [entry.get("artifactType") for entry in api.referrers("torch", digest)]
    assert sorted(kinds) == sorted(publish.ARTIFACT_TYPES.values()), kinds
