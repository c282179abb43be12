"""The workflow `python -m builder ci github` emits, run the way a hosted runner runs it.

Its `run:` steps, word for word, as a non-root user in the docker group with passwordless sudo
who cannot create user namespaces (tests/hosted_runner.py), in a fresh copy of the tree, with a
fresh cache, on the engine GitHub's ubuntu-24.04 runners now have (Docker 29 with its containerd
image store, harness/docker29.py, its data root fresh and its CLI on the user's PATH), on
a host without mmdebstrap: the cell job installs what it needs, bootstraps, builds, self-tests and stages into
a loopback registry with credentials from `docker login` (given only after the build), unsigned;
the sign job, with the key its secret holds, signs what the registry holds for that staging tag;
with `ci.rebuild_check` on in the checkout's matrix, the rebuild job builds the cell again with
BuildKit on the same engine, without cache and with no key, and pushes it beside the staged one;
the sign-rebuild job signs with its own rebuilder key (listed in publish.rebuilders) that the
registry's rebuild is the staged image's ID;
the promote job then promotes from the registry alone, waiting for that signed rebuild, and
`verify --key` finds the SBOM, the report, the signed attestations and the rebuild on the digest.

What cannot run here is listed, not faked: the `uses:` actions (checkout is a copy of the tree;
setup-python is this machine's Python 3.11; the cache starts empty), and GHCR's GITHUB_TOKEN
login (the loopback registry's secrets login takes its place). The CPU cell is the one that can
run here: its wheel folder exists on this machine, which is why `ci` names it explicitly.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import docker
import docker.errors
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from securesystemslib.signer import SSlibKey

from builder.oci.registry import Registry
from builder.plan import matrix
from builder.publish import provenance, publish, staging, verify
from builder.render import ci
from harness import docker29
from tests import hosted_runner

pytestmark = [pytest.mark.integration, pytest.mark.beside]

REPO = Path(__file__).resolve().parents[2]
CELL = "2.13.0-cpu-bookworm-runtime"
RUN_ID = "4242"
# What GitHub's runner does for these, and why the run here does without it.
NOT_TRIED = {
    "actions/checkout": "a copy of the tree under test (git's tracked and untracked files), owned by the runner's user",
    "actions/setup-python": "this machine's Python 3.11",
    "actions/cache": "the cache starts empty, as on a first run",
    "actions/upload-artifact": "the stage step's record of what it pushed stays in the workspace the jobs share",
    "actions/download-artifact": "the sign and promote jobs read that record from the shared workspace",
}


def _mmdebstrap_in_view(runner: hosted_runner.Runner) -> bool:
    return runner.as_root(["sh", "-c", "command -v mmdebstrap || true"]).stdout.strip() != ""


def _without_mmdebstrap(runner: hosted_runner.Runner) -> None:
    """A host without mmdebstrap, as a hosted runner is: the workflow must install it. Removed in
    the runner's view of the host only: the host keeps its own."""
    runner.as_root(["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "remove", "-y", "-q", "mmdebstrap"])
    assert not _mmdebstrap_in_view(runner)


@pytest.fixture
def engine29() -> Iterator[docker29.Engine]:
    """Docker 29 with its containerd image store, as GitHub's ubuntu-24.04 runners now have it
    (actions/runner-images#14105), on a fresh data root: a hosted runner's engine starts empty.
    An engine of its own (named "runner"), so the engine tests' Docker 29 may run meanwhile."""
    with docker29.running("containerd", fresh=True, name="runner") as engine:
        yield engine
    docker29.remove("containerd", name="runner")  # its data root: several GB


def _runner_cli(runner: hosted_runner.Runner) -> Path:
    """The Docker 29 CLI on the runner user's PATH, and its buildx plugin where the CLI looks
    (~/.docker/cli-plugins), as the runner image installs them with the engine (the daemon
    refuses the host's older CLI); returns the folder to put first on PATH."""
    folder = runner.home / "docker29-bin"
    folder.mkdir(exist_ok=True)
    shutil.copy2(docker29.unpacked() / "usr/bin/docker", folder / "docker")
    plugins = runner.home / ".docker" / "cli-plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    shutil.copy2(docker29.unpacked() / "usr/libexec/docker/cli-plugins/docker-buildx", plugins / "docker-buildx")
    for made in (folder, runner.home / ".docker"):
        subprocess.run(["chown", "-R", f"{runner.user}:{runner.user}", str(made)], check=True)
    return folder


REBUILDER_KEY = "rebuilders/ci-rebuild.pub"


def _with_rebuild_check(checkout: Path, rebuilder_public: bytes) -> None:
    """The checkout's matrix with ci.rebuild_check on, as a team that wants the quorum writes it:
    the rebuild job's own public key listed in publish.rebuilders, beside the matrix."""
    path = checkout / "matrix.yaml"
    text = path.read_text()
    assert "\nci:\n" in text and "rebuild_check" not in text and "\npublish:" not in text
    (checkout / REBUILDER_KEY).parent.mkdir()
    (checkout / REBUILDER_KEY).write_bytes(rebuilder_public)
    text = text.replace("\nci:\n", "\nci:\n  rebuild_check: true\n", 1)
    path.write_text(text + f"\npublish:\n  rebuilders: {{ci-rebuild: {REBUILDER_KEY}}}\n")


def _pem(key: ed25519.Ed25519PrivateKey) -> tuple[str, bytes]:
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return private.decode(), public


def test_the_emitted_github_workflow_runs_as_a_hosted_runner_from_install_to_promotion(
    engine29: docker29.Engine,
    start_registry,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    why = hosted_runner.supported()
    if why is not None:
        pytest.fail(f"this machine cannot play a hosted runner: {why}")
    running = start_registry(user="ci", password="runner-secret")
    runner = hosted_runner.Runner(env={})
    runner.create()
    rebuilder_private, rebuilder_public = _pem(ed25519.Ed25519PrivateKey.generate())
    try:
        runner.checkout(REPO)
        _with_rebuild_check(runner.workspace, rebuilder_public)
        monkeypatch.chdir(runner.workspace)  # the workflow names the checkout's matrix.yaml
        quorum = matrix.load_matrix(Path("matrix.yaml"))
        workflow = yaml.safe_load(ci.workflow(quorum, "github", registry=f"{running.host}/torch", names=[CELL]))
    except BaseException:
        runner.remove()
        raise
    finally:
        monkeypatch.chdir(REPO)  # the runner's workspace goes with the runner
    grid = matrix.load_matrix(REPO / "matrix.yaml")
    cell = grid.cell(CELL)
    assert list(workflow["jobs"]) == ["cell", "sign", "rebuild", "sign-rebuild", "promote"]  # a CPU cell: no GPU
    assert workflow["jobs"]["promote"]["needs"] == ["sign", "sign-rebuild"]
    runner.env.update({**workflow["env"], "GITHUB_REPOSITORY_OWNER": "Acme"})
    signing_key = ed25519.Ed25519PrivateKey.generate()
    pem, _ = _pem(signing_key)
    context = {
        "secrets.TORCH_IMAGES_SIGNING_KEY": pem,
        "secrets.TORCH_IMAGES_REBUILD_KEY": rebuilder_private,  # sign-rebuild's own, not the team's
        "matrix.cell": CELL,
        "matrix.runner": "ubuntu-24.04",
        "github.run_id": RUN_ID,
        "github.actor": "ci",
        "secrets.REGISTRY_USER": "ci",
        "secrets.REGISTRY_PASSWORD": "runner-secret",
        # The public half, as a repository variable: promote trusts only what the key signed.
        "vars.TORCH_IMAGES_VERIFY_KEY": signing_key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode(),
    }
    client = docker.DockerClient(base_url=engine29.docker_host, version="auto")
    assert client.version()["Version"].startswith("29.") and client.images.list() == []  # empty, as on a runner
    log: list[str] = []
    try:
        runner.env["DOCKER_HOST"] = engine29.docker_host
        runner.env["PATH"] = f"{_runner_cli(runner)}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        refused = subprocess.run(
            ["runuser", "-u", runner.user, "--", "unshare", "--user", "true"],
            capture_output=True, preexec_fn=hosted_runner.refuse_user_namespaces,
        )  # fmt: skip
        assert refused.returncode != 0, "the runner's user must not be able to create user namespaces"
        _without_mmdebstrap(runner)
        not_tried = _run_job(workflow["jobs"]["cell"], runner, context, log)
        not_tried += _run_job(workflow["jobs"]["sign"], runner, context, log)
        not_tried += _run_job(workflow["jobs"]["rebuild"], runner, context, log)
        not_tried += _run_job(workflow["jobs"]["sign-rebuild"], runner, context, log)
        not_tried += _run_job(workflow["jobs"]["promote"], runner, context, log)
        assert _mmdebstrap_in_view(runner)  # the job installed it, through sudo
    finally:
        with capsys.disabled():
            print("\n".join(log)[-8000:])
            print("\n".join(line for line in log if line.startswith("[step took")))
        runner.remove()
        for image in client.images.list(name=f"{running.host}/torch"):  # the tags the job's push made
            for tag in (t for t in image.tags if t.startswith(f"{running.host}/")):
                with contextlib.suppress(docker.errors.APIError):
                    client.images.remove(tag)
    assert sorted({name.split("@")[0] for name in not_tried}) == sorted(NOT_TRIED)

    api = Registry(running.host, Registry.login("ci", "runner-secret"), retries=1, backoff_s=0.1)
    staged = api.manifest("torch", staging.staging_tag(grid, cell, RUN_ID))
    promoted = api.manifest("torch", cell.tag)
    assert staged is not None and promoted is not None and promoted.digest == staged.digest
    signed = {*publish.ARTIFACT_TYPES.values(), provenance.BUNDLE_TYPE}  # the sign job signed with the secret's key
    assert set(api.attached("torch", staged.digest)) == signed
    image_id = json.loads(staged.body)["config"]["digest"]
    assert image_id == (REPO / "images" / CELL / "image-id").read_text().split()[0]  # the recorded build
    public = SSlibKey.from_crypto(signing_key.public_key())  # the secret's key signed what the job staged
    # the checkout's quorum: the rebuild job's public key beside its matrix, as the workflow read it
    (tmp_path / REBUILDER_KEY).parent.mkdir()
    (tmp_path / REBUILDER_KEY).write_bytes(rebuilder_public)
    quorum_grid = replace(grid, path=tmp_path / "matrix.yaml")
    quorum_grid.spec = quorum.spec
    [found] = verify.verify(api, verify.parse_reference(f"{running.host}/torch:{cell.tag}"), quorum_grid, public)
    assert found.problems == [] and found.image_id == image_id
    assert any(line.startswith("signed provenance: 2 locks match this checkout") for line in found.lines)
    assert any(line.startswith('cpu report on "cpu": pass') for line in found.lines)
    [rebuilt] = [line for line in found.lines if line.startswith("rebuilder keys whose signed rebuild gave")]
    # verify quotes what a registry's documents say: the engine a signed rebuild names included
    assert 'gave this image ID: ci-rebuild ("Docker 29.' in rebuilt and "BuildKit" in rebuilt
    steps = "\n".join(log)
    assert "installed mmdebstrap with sudo apt-get" in steps
    assert "bootstrapping debian bookworm (amd64) from its" in steps  # as root, through sudo
    assert f"{CELL}: built, recorded ID" in steps and "self-test pass" in steps
    assert f"rebuilt image {image_id[7:19]} is the staged one" in steps  # the rebuild job's BuildKit build agreed
    assert f"the rebuild gave image {image_id[7:19]}; gzip signed" in steps  # sign-rebuild, from the registry


def _run_job(
    job: dict[str, object], runner: hosted_runner.Runner, context: dict[str, str], log: list[str]
) -> list[str]:
    """Each `run:` step of the job, in order, stopping at the first that fails; returns the
    `uses:` actions it could not run."""
    not_tried = []
    steps = job["steps"]
    assert isinstance(steps, list)
    for step in steps:
        if "uses" in step:
            assert step["uses"].split("@")[0] in NOT_TRIED, f"an action this run cannot stand in for: {step['uses']}"
            not_tried.append(step["uses"])
            continue
        script = hosted_runner.substitute(step["run"], context)
        step_env = {name: hosted_runner.substitute(str(value), context) for name, value in step.get("env", {}).items()}
        started = time.monotonic()
        result = runner.run(script, step_env, log.append)
        log.append(f"[step took {time.monotonic() - started:.0f} s] {step.get('name')}")
        assert result.returncode == 0, (
            f"step {step.get('name')!r} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
    return not_tried
