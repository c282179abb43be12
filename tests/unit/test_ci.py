"""`python -m builder ci github|gitlab`: workflows that fan the matrix out, checked offline
against the CI systems' published schemas (check-jsonschema's built-in copies)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from builder.config import actions
from builder.config.schema import CiSpec, Selector
from builder.errors import UserError
from builder.plan import matrix as matrix_module
from builder.plan.matrix import load_matrix
from builder.publish import staging
from builder.render import ci

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = {"github": "vendor.github-workflows", "gitlab": "vendor.gitlab-ci"}


def _validate(system: str, text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / f"{system}.yml"
    path.write_text(text)
    command = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", SCHEMAS[system], str(path)]
    return subprocess.run(command, capture_output=True, text=True)


@pytest.fixture
def grid(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.chdir(REPO)
    return load_matrix(Path("matrix.yaml"))


@pytest.mark.parametrize("system", sorted(SCHEMAS))
def test_the_workflow_is_valid_for_its_ci_system_and_a_broken_one_is_not(system: str, grid, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    text = ci.workflow(grid, system)
    checked = _validate(system, text, tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # Control: the same workflow with a misspelt key fails the same check.
    broken = text.replace("runs-on:", "run-on:") if system == "github" else text.replace("stage: cells", "stages: 3")
    assert broken != text and _validate(system, broken, tmp_path).returncode != 0


def test_cells_from_an_index_are_jobs_and_a_cell_of_local_wheels_only_when_named(grid) -> None:  # type: ignore[no-untyped-def]
    github = yaml.safe_load(ci.workflow(grid, "github"))
    jobs = github["jobs"]["cell"]["strategy"]["matrix"]["include"]
    local = [c.name for c in grid.cells if ci.left_out(grid, c)]
    assert local == ["2.13.0-cpu-bookworm-runtime", "2.13.0-cpu-bookworm-devel"]  # TORCH_WHEEL_DIR: no runner has it
    assert [job["cell"] for job in jobs] == [c.name for c in grid.cells if c.name not in local]
    # each cell on a runner of its platform: arm64 cells build natively, not under emulation
    assert {job["cell"]: job["runner"] for job in jobs} == {
        j["cell"]: ci.RUNNERS[grid.cell(j["cell"]).platform] for j in jobs
    }
    assert "ubuntu-24.04-arm" in {job["runner"] for job in jobs}
    assert github["jobs"]["cell"]["strategy"]["fail-fast"] is False
    # promote names exactly the cells that are jobs (`--all` would wait for the left-out ones)
    promote = github["jobs"]["promote"]["steps"][-1]["run"].split()
    # after "--run ${{ github.run_id }} --staged-record staged"
    assert promote[promote.index("--run") + 6 :] == [job["cell"] for job in jobs]
    named = yaml.safe_load(ci.workflow(grid, "github", names=local))
    assert [job["cell"] for job in named["jobs"]["cell"]["strategy"]["matrix"]["include"]] == local
    assert "gpu" not in named["jobs"] and named["jobs"]["promote"]["needs"] == ["sign"]  # CPU cells: no GPU stage


def test_every_cell_job_installs_what_it_needs_caches_by_its_locks_and_builds_with_the_users_session(grid) -> None:  # type: ignore[no-untyped-def]
    steps = yaml.safe_load(ci.workflow(grid, "github"))["jobs"]["cell"]["steps"]
    runs = [step.get("run", "") for step in steps]
    install, build = (
        runs.index("./nox -s engine"),
        next(i for i, r in enumerate(runs) if r.startswith("./nox -s build")),
    )
    assert install < build  # mmdebstrap (through sudo) before the build that bootstraps with it
    assert runs[build] == './nox -s build -- --registry "$IMAGE" --skip-existing ${{ matrix.cell }}'
    login = next(i for i, r in enumerate(runs) if "docker login" in r)
    stage = next(i for i, r in enumerate(runs) if "publish -- stage" in r)
    assert build < login < stage  # issue 55: no registry token while build code runs
    assert runs[stage].endswith(
        'stage --registry "$IMAGE" --run ${{ github.run_id }} --staged-record staged ${{ matrix.cell }}'
    )
    assert not any("docker image prune" in run for run in runs)  # a runner's engine is not emptied
    assert (
        "SIGNING_KEY" not in str(steps)
        and "environment" not in yaml.safe_load(ci.workflow(grid, "github"))["jobs"]["cell"]
    )
    cache = next(step for step in steps if step.get("uses", "").startswith("actions/cache@"))
    # Issue 58: a CI cache comes back from anywhere, so it carries only entries checked on use by
    # their sha256 (or a base by the cell's record); the builder's derived records stay behind.
    assert cache["with"]["path"].split() == [f"~/.cache/torch-images/{folder}" for folder in
                                            ("wheelhouse", "debs", "apt-indexes", "keyrings", "bases")]  # fmt: skip
    assert (
        cache["with"]["key"]
        == "torch-images-${{ matrix.cell }}-${{ hashFiles(format('images/{0}/*.lock', matrix.cell)) }}"
    )
    assert steps.index(cache) < build


def test_each_cuda_cell_has_a_gpu_job_on_its_architectures_runner_and_promote_waits_for_them(grid) -> None:  # type: ignore[no-untyped-def]
    github = yaml.safe_load(ci.workflow(grid, "github"))
    gpu = github["jobs"]["gpu"]
    entries = {entry["cell"]: entry for entry in gpu["strategy"]["matrix"]["include"]}
    assert set(entries) == {c.name for c in grid.cells if c.is_cuda}
    assert entries["2.15.0-cu13.2-bookworm-runtime"]["runner"] == ["self-hosted", "linux", "x64", "gpu"]
    assert entries["2.15.0-cu13.2-bookworm-runtime-arm64"]["runner"] == ["self-hosted", "linux", "arm64", "gpu"]
    assert gpu["needs"] == "sign" and gpu["runs-on"] == "${{ matrix.runner }}"
    [test] = [s for s in gpu["steps"] if "gpu-test" in s.get("run", "")]
    assert test["run"].endswith("--run ${{ github.run_id }} --staged-record gpu-staged ${{ matrix.cell }}")
    # issue 55: the GPU runner never holds the key; a job that runs no image signs its report
    assert test["env"] == {"TORCH_IMAGES_VERIFY_KEY": "${{ vars.TORCH_IMAGES_VERIFY_KEY }}"}
    assert "SIGNING_KEY" not in str(gpu) and "environment" not in gpu
    signer = github["jobs"]["sign-gpu"]
    assert signer["needs"] == "gpu" and signer["environment"] == "torch-images-release"
    assert not any("gpu-test" in s.get("run", "") or "build" in s.get("run", "") for s in signer["steps"])
    assert github["jobs"]["promote"]["needs"] == ["sign", "sign-gpu"]
    gitlab = yaml.safe_load(ci.workflow(grid, "gitlab"))
    job = gitlab["gpu 2.15.0-cu13.2-bookworm-runtime-arm64"]
    assert job["tags"] == ["self-hosted", "linux", "arm64", "gpu"] and job["stage"] == "gpu"
    assert "sign gpu 2.15.0-cu13.2-bookworm-runtime-arm64" in gitlab["promote"]["needs"]
    assert gitlab["sign gpu 2.15.0-cu13.2-bookworm-runtime-arm64"]["needs"] == [
        "cell",
        job_name := "gpu 2.15.0-cu13.2-bookworm-runtime-arm64",
    ]
    assert "SIGNING_KEY" not in str(gitlab[job_name]) and "environment" not in gitlab[job_name]


def test_a_required_gpu_gate_without_a_runner_is_refused_and_an_optional_one_does_not_hold_the_run(grid) -> None:  # type: ignore[no-untyped-def]
    grid.spec = grid.spec.model_copy(update={"ci": CiSpec(gpu_runner=["gpu"])})  # x86-64 runners only
    with pytest.raises(UserError, match=r"2\.15\.0-cu13\.2-bookworm-runtime-arm64 needs a passing GPU self-test"):
        ci.workflow(grid, "github")
    grid.spec = grid.spec.model_copy(
        update={"ci": CiSpec(gpu_runner=["gpu"], gpu_optional=[Selector(platform="linux/arm64")])}
    )
    grid.cells = [replace(c, gpu_gate=matrix_module._gpu_gate(c, grid.spec)) for c in grid.cells]
    github = yaml.safe_load(ci.workflow(grid, "github"))
    entries = {e["cell"]: e for e in github["jobs"]["gpu"]["strategy"]["matrix"]["include"]}
    assert "2.15.0-cu13.2-bookworm-runtime-arm64" not in entries  # no arm64 GPU runner, and its gate is optional
    assert all(e["optional"] is False and e["runner"] == ["gpu"] for e in entries.values())
    assert github["jobs"]["gpu"]["continue-on-error"] == "${{ matrix.optional }}"
    assert github["jobs"]["sign-gpu"]["continue-on-error"] == "${{ matrix.optional }}"


def test_the_registry_is_ghcr_or_gitlabs_own_by_default_and_another_logs_in_with_secrets(grid) -> None:  # type: ignore[no-untyped-def]
    github = ci.workflow(grid, "github")
    assert 'echo "IMAGE=ghcr.io/${GITHUB_REPOSITORY_OWNER,,}/torch"' in github
    parsed = yaml.safe_load(github)
    assert parsed["permissions"] == {}  # each job names its own (issue 55)
    # every job pushes or attaches but the GPU job, which only pulls (its report goes to sign-gpu)
    assert {name: job["permissions"]["packages"] for name, job in parsed["jobs"].items() if name != "gpu"} == {
        name: "write" for name in parsed["jobs"] if name != "gpu"
    }
    assert parsed["jobs"]["gpu"]["permissions"] == {"contents": "read", "packages": "read"}
    login = next(s for s in parsed["jobs"]["cell"]["steps"] if "docker login" in s.get("run", ""))
    assert login["env"]["TOKEN"] == "${{ secrets.GITHUB_TOKEN }}"
    harbor = yaml.safe_load(ci.workflow(grid, "github", registry="harbor.example.com/ml/torch"))
    steps = harbor["jobs"]["promote"]["steps"]
    assert any('IMAGE=harbor.example.com/ml/torch"' in s.get("run", "") for s in steps)
    assert (
        next(s for s in steps if "docker login" in s.get("run", ""))["env"]["PASSWORD"]
        == "${{ secrets.REGISTRY_PASSWORD }}"
    )
    gitlab = yaml.safe_load(ci.workflow(grid, "gitlab"))
    assert gitlab["variables"]["IMAGE"] == "$CI_REGISTRY_IMAGE/torch"
    assert gitlab[".login"] == [
        'echo "$CI_REGISTRY_PASSWORD" | docker login "$CI_REGISTRY" --username "$CI_REGISTRY_USER" --password-stdin'
    ]
    for hostile in ("ghcr.io/acme/torch\nrun: x", "Ghcr.io/Acme", "ghcr.io/../x", "$(id)"):
        with pytest.raises(UserError, match="--registry"):
            ci.workflow(grid, "github", registry=hostile)


def test_another_matrix_is_named_in_every_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    text = ci.workflow(load_matrix(Path("examples/trtllm.yaml")), "github")
    commands = [line for line in text.splitlines() if "./nox -s build" in line or "./nox -s publish" in line]
    assert commands and all("--matrix examples/trtllm.yaml " in line for line in commands)


@pytest.mark.parametrize("system", sorted(SCHEMAS))
def test_the_daily_security_job_audits_moves_only_fixes_and_proposes_the_change(
    system: str,
    grid,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    text = ci.schedule(grid, system)
    checked = _validate(system, text, tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    parsed = yaml.safe_load(text)
    if system == "github":
        assert parsed[True]["schedule"] == [{"cron": "17 4 * * *"}]  # YAML 1.1 reads the key `on` as true
        assert parsed["permissions"] == {}
        job = parsed["jobs"]["security"]
        # audit and update parse the internet's data: no write token in the job, none in .git/config
        assert job["permissions"] == {"contents": "read"}
        assert job["steps"][0]["with"] == {"persist-credentials": False}
        runs = [step.get("run", "") for step in job["steps"]]
        assert "GH_TOKEN" not in str(job)
    else:
        assert parsed["security"]["rules"] == [{"if": '$CI_PIPELINE_SOURCE == "schedule"'}]
        assert "environment" not in parsed["security"]  # the push token is scoped to the request job's
        runs = parsed["security"]["script"]
        fan_out = yaml.safe_load(ci.workflow(grid, "gitlab"))
        assert fan_out["cell"]["rules"][0] == {"if": '$CI_PIPELINE_SOURCE == "schedule"', "when": "never"}
        # Issue 39: the generated fan-out includes the generated schedule where it is kept, so no
        # user edits a file that says "do not edit".
        assert fan_out["include"] == [
            {"local": ci.GITLAB_SCHEDULE_FILE, "rules": [{"exists": [ci.GITLAB_SCHEDULE_FILE]}]}
        ]
        assert f"Keep it as {ci.GITLAB_SCHEDULE_FILE}" in text and ".gitlab-ci.yml (`include:" not in text
    audit, update, patch = (next(i for i, r in enumerate(runs) if needle in r) for needle in
                            ("./nox -s audit", "./nox -s update -- --security", "git diff --cached"))  # fmt: skip
    assert audit < update <= patch
    assert '[ "$status" -le 1 ]' in runs[audit]  # findings do not stop the job; a failed audit does
    # The advisories' text reaches the pull request escaped, and no token reaches a command line.
    assert "--markdown > audit.md" in runs[audit]
    assert "TORCH_IMAGES_PUSH_TOKEN}@" not in text and "oauth2:$" not in text


def test_the_jobs_that_sign_or_move_tags_are_kept_to_the_default_or_protected_branches(grid) -> None:  # type: ignore[no-untyped-def]
    """Issue 35: the signing key reaches only runs of the branch that may publish, and promote
    is told which key to trust."""
    github = yaml.safe_load(ci.workflow(grid, "github"))
    for name in ("sign", "sign-gpu", "promote"):
        assert github["jobs"][name]["environment"] == "torch-images-release", name
    # issue 55: the key only where nothing built runs
    holding = [name for name, job in github["jobs"].items() if "TORCH_IMAGES_SIGNING_KEY" in str(job)]
    assert holding == ["sign", "sign-gpu"]
    for name in holding:
        runs = " ".join(s.get("run", "") for s in github["jobs"][name]["steps"])
        assert "nox -s build" not in runs and "nox -s engine" not in runs and "gpu-test" not in runs
        assert not any("actions/cache" in s.get("uses", "") for s in github["jobs"][name]["steps"])
    promote = next(s for s in github["jobs"]["promote"]["steps"] if "publish -- promote" in s.get("run", ""))
    assert promote["env"] == {"TORCH_IMAGES_VERIFY_KEY": "${{ vars.TORCH_IMAGES_VERIFY_KEY }}"}
    gitlab = yaml.safe_load(ci.workflow(grid, "gitlab"))
    protected = [{"if": '$CI_PIPELINE_SOURCE == "schedule"', "when": "never"},
                 {"if": '$CI_COMMIT_REF_PROTECTED == "true"', "when": "on_success"}, {"when": "never"}]  # fmt: skip
    assert gitlab["promote"]["rules"] == protected
    assert all(gitlab[job]["rules"] == protected for job in gitlab if job.startswith(("gpu ", "sign")))
    script = gitlab["cell"]["script"]
    protected_only = next(i for i, line in enumerate(script) if "CI_COMMIT_REF_PROTECTED" in str(line))
    build = next(i for i, line in enumerate(script) if "nox -s build" in str(line))
    login = next(i for i, line in enumerate(script) if "docker login" in str(line))
    assert build < protected_only < login < len(script) - 1 and "publish -- stage" in script[-1]
    text = ci.workflow(grid, "gitlab")
    assert "masked, *protected* CI/CD variable" in text and "scoped to the environment" in text
    keyed = [job for job in gitlab if isinstance(gitlab[job], dict) and "environment" in gitlab[job]]
    assert keyed and all(job.startswith("sign") for job in keyed)
    assert all(gitlab[job]["tags"] == ["torch-images-sign"] and gitlab[job]["cache"] == [] for job in keyed)
    # What the stage jobs pushed travels to sign and promote by digest (an artifact), and they read it.
    assert gitlab["cell"]["artifacts"]["paths"] == ["staged/"] and '--staged-record "staged/$CELL"' in script[-1]
    assert "--staged-record all-staged" in gitlab["promote"]["script"][-1]
    upload = next(s for s in github["jobs"]["cell"]["steps"] if s.get("uses", "").startswith("actions/upload-artifact"))
    download = next(s for s in github["jobs"]["promote"]["steps"] if "download-artifact" in s.get("uses", ""))
    assert upload["with"]["path"] == download["with"]["path"] == "staged/"
    assert download["with"]["pattern"] == "staged-*" and "--staged-record staged" in promote["run"]


def test_runner_labels_that_read_as_other_yaml_types_stay_strings(grid) -> None:  # type: ignore[no-untyped-def]
    """Issue 35: labels such as `true`, `null` or `1.10`, written unquoted, became a boolean, a
    null and the number 1.1."""
    labels = ["true", "null", "1.10", "gpu"]
    grid.spec = grid.spec.model_copy(update={"ci": CiSpec(gpu_runner={"amd64": labels, "arm64": labels})})
    github = yaml.safe_load(ci.workflow(grid, "github"))
    runners = [e["runner"] for e in github["jobs"]["gpu"]["strategy"]["matrix"]["include"]]
    assert runners and all(r == labels for r in runners)
    gitlab = yaml.safe_load(ci.workflow(grid, "gitlab"))
    assert gitlab["gpu 2.15.0-cu13.2-bookworm-runtime"]["tags"] == labels


def test_every_action_the_workflows_use_is_pinned_by_commit_with_its_release_beside_it(grid) -> None:  # type: ignore[no-untyped-def]
    """Issue 35: a tag (`actions/checkout@v4`) runs whatever its owners point it at that day."""
    pins = actions.load()
    grid.spec = grid.spec.model_copy(update={"ci": grid.spec.ci.model_copy(update={"github_attestations": True})})
    texts = [ci.workflow(grid, "github"), ci.schedule(grid, "github")]
    lines = [line.strip() for text in texts for line in text.splitlines() if "uses:" in line]
    assert len(lines) >= 10
    for line in lines:
        match = re.fullmatch(r"(?:- )?uses: ([\w.-]+/[\w.-]+)@([0-9a-f]{40}) # (v[0-9.]+)", line)
        assert match, line
        pin = pins[match[1]]
        assert (match[2], match[3]) == (pin.commit, pin.version), line
    assert {re.search(r"uses: ([\w.-]+/[\w.-]+)@", line)[1] for line in lines} == set(pins)  # type: ignore[index]


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("{version: v4, commit: v4}", "a commit: 40 lower-case hex digits"),
        ("{version: main, commit: " + "a" * 40 + "}", "a release tag such as v4.2.2"),
        ("{version: v4, commit: " + "A" * 40 + "}", "a commit: 40 lower-case hex digits"),
    ],
)
def test_an_action_pinned_by_a_movable_name_is_refused_in_one_line(entry: str, says: str, tmp_path: Path) -> None:
    path = tmp_path / "github-actions.yaml"
    path.write_text(f"actions:\n  actions/checkout: {entry}\n")
    with pytest.raises(UserError) as refused:
        actions.load(path)
    assert says in str(refused.value) and "github-actions.yaml:2" in str(refused.value)


@pytest.mark.parametrize("name", ["actions/..", "actions/."])
def test_an_action_named_as_a_relative_folder_is_refused_in_one_line(name: str, tmp_path: Path) -> None:
    path = tmp_path / "github-actions.yaml"
    path.write_text(f"actions:\n  {name}: {{version: v4, commit: {'a' * 40}}}\n")
    with pytest.raises(UserError) as refused:
        actions.load(path)
    assert "owner/repository" in str(refused.value) and "github-actions.yaml:2" in str(refused.value)


def test_githubs_attestations_are_opt_in_and_attest_each_staged_manifest_with_its_own_permissions(
    grid,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    """Issue 37: GitHub's artifact attestations, behind ci.github_attestations, each staged form's
    digest a subject. Issue 47: id-token: write only in a job of its own that runs GitHub's attest
    action and nothing of the checkout's, never in the job that builds (any of its steps could
    mint the repository's OIDC token)."""
    plain = yaml.safe_load(ci.workflow(grid, "github"))
    assert "id-token" not in str(plain) and "actions/attest@" not in ci.workflow(grid, "github")
    assert plain["permissions"] == {}
    grid.spec = grid.spec.model_copy(
        update={
            "ci": grid.spec.ci.model_copy(update={"github_attestations": True}),
            "publish": grid.spec.publish.model_copy(update={"compression": "zstd"}),
        }
    )
    text = ci.workflow(grid, "github")
    checked = _validate("github", text, tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    jobs = yaml.safe_load(text)["jobs"]
    assert jobs["attest"]["permissions"] == {
        "contents": "read", "packages": "write", "id-token": "write", "attestations": "write",
        "artifact-metadata": "write",
    }  # fmt: skip
    assert [name for name, job in jobs.items() if "id-token" in str(job.get("permissions"))] == ["attest"]
    assert jobs["attest"]["needs"] == "cell" and "attest" in jobs["promote"]["needs"]
    steps = jobs["attest"]["steps"]
    assert not any("nox" in s.get("run", "") or "pip" in s.get("run", "") for s in steps)  # nothing installed
    assert not any(s.get("uses", "").startswith(("actions/checkout@", "actions/setup-python@")) for s in steps)
    assert not any(s.get("uses", "").startswith("actions/attest@") for s in jobs["cell"]["steps"])
    digests = next(i for i, s in enumerate(steps) if s.get("id") == "staged")
    attests = [i for i, s in enumerate(steps) if s.get("uses", "").startswith("actions/attest@")]
    assert digests < attests[0] and len(attests) == 2
    subjects = [steps[i]["with"] for i in attests]
    assert [s["subject-digest"] for s in subjects] == [
        "${{ steps.staged.outputs.gzip }}", "${{ steps.staged.outputs.zstd }}"
    ]  # fmt: skip
    assert all(s["subject-name"] == "${{ env.IMAGE }}" and s["push-to-registry"] is True for s in subjects)


def test_the_staged_digests_step_asks_the_registry_under_the_tags_the_matrix_and_run_name(grid, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The attest job takes no digest from a file a build wrote: its step's shell, run with a
    `docker` that answers as the registry would, asks for `<image tag>.staging-<run>` of each form."""
    grid.spec = grid.spec.model_copy(
        update={
            "ci": grid.spec.ci.model_copy(update={"github_attestations": True}),
            "publish": grid.spec.publish.model_copy(update={"compression": "zstd"}),
        }
    )
    job = yaml.safe_load(ci.workflow(grid, "github"))["jobs"]["attest"]
    entry = next(e for e in job["strategy"]["matrix"]["include"] if e["cell"] == grid.flagship.name)
    assert entry["gzip"] == grid.image_tag(grid.flagship) and entry["zstd"] == grid.image_tag(grid.flagship, "zstd")
    assert not any(s.get("uses", "").startswith("actions/download-artifact@") for s in job["steps"])
    step = next(s for s in job["steps"] if s.get("id") == "staged")
    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\n[ "$1 $2 $3" = "buildx imagetools inspect" ] || exit 9\n'
                    'printf "sha256:%s\\n" "$(printf %s "$4" | sha256sum | cut -c1-64)"\n')  # fmt: skip
    fake.chmod(0o755)
    values = {"${{ github.run_id }}": "7", "${{ matrix.gzip }}": entry["gzip"], "${{ matrix.zstd }}": entry["zstd"]}
    env = {name: values[value] for name, value in step["env"].items()}
    output = tmp_path / "output"
    env.update({"PATH": f"{fake.parent}:{os.environ['PATH']}", "GITHUB_OUTPUT": str(output), "IMAGE": "r.example/t"})
    subprocess.run(["bash", "-eo", "pipefail", "-c", step["run"]], cwd=tmp_path, env=env, check=True)

    def digest(tag: str) -> str:
        return "sha256:" + hashlib.sha256(f"r.example/t:{tag}.staging-7".encode()).hexdigest()

    assert sorted(output.read_text().splitlines()) == [f"gzip={digest(entry['gzip'])}", f"zstd={digest(entry['zstd'])}"]


def test_the_rebuild_check_builds_each_cell_again_with_buildkit_and_promote_waits_for_it(
    grid,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    """Issue 48: with ci.rebuild_check, a job of its own rebuilds each cell with another builder
    than the cell job's. Issue 55: it holds no key and no registry token while it builds; a job
    that builds nothing signs with a rebuilder's own key where the registry's rebuild is the
    staged image, and promote (which then counts at least one signed rebuild) waits for it."""
    assert "rebuild" not in yaml.safe_load(ci.workflow(grid, "github"))["jobs"]
    grid.spec = grid.spec.model_copy(update={"ci": grid.spec.ci.model_copy(update={"rebuild_check": True})})
    text = ci.workflow(grid, "github")
    checked = _validate("github", text, tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    jobs = yaml.safe_load(text)["jobs"]
    rebuild, sign = jobs["rebuild"], jobs["sign-rebuild"]
    assert rebuild["needs"] == "sign" and sign["needs"] == "rebuild" and "sign-rebuild" in jobs["promote"]["needs"]
    assert "environment" not in rebuild and "KEY" not in str(rebuild)  # no key of any kind where it builds
    runs = [s.get("run", "") for s in rebuild["steps"]]
    [built] = [i for i, r in enumerate(runs) if "./nox -s build" in r]
    assert all(flag in runs[built] for flag in ("--backend buildkit", "--no-cache", "--fresh-base"))
    assert (
        built
        < next(i for i, r in enumerate(runs) if "docker login" in r)
        < next(i for i, r in enumerate(runs) if "publish -- stage-rebuild" in r)
    )
    assert sign["environment"] == "torch-images-rebuild"  # the rebuilder key's, not the team key's
    assert not any("./nox -s build" in s.get("run", "") or "actions/cache@" in s.get("uses", "") for s in sign["steps"])
    [step] = [s for s in sign["steps"] if "publish -- sign-rebuild" in s.get("run", "")]
    # a rebuilder key of its own, never the team's (promote would not count the team's)
    assert set(step["env"]) == {"TORCH_IMAGES_REBUILD_KEY", "TORCH_IMAGES_VERIFY_KEY"}
    assert "TORCH_IMAGES_SIGNING_KEY" not in str(sign)
    assert not any("--backend" in s.get("run", "") for s in jobs["cell"]["steps"])  # the cell job: classic
    assert staging.required_rebuilds(grid) == 1


@pytest.mark.parametrize(
    ("system", "ci_update", "publish_update", "refusal"),
    [
        ("gitlab", {"rebuild_check": True}, {}, "`ci gitlab` emits no rebuild job"),
        ("github", {}, {"require_rebuilds": 1}, "the emitted workflow makes 0 signed rebuild(s)"),
        (
            "github",
            {"rebuild_check": True},
            {"require_rebuilds": 2},
            "require_rebuilds is 2, and the emitted workflow makes 1",
        ),
    ],
)
def test_a_quorum_the_emitted_workflow_cannot_meet_is_refused_in_one_line(
    grid, system: str, ci_update: dict[str, object], publish_update: dict[str, object], refusal: str
) -> None:  # type: ignore[no-untyped-def]
    grid.spec = grid.spec.model_copy(
        update={
            "ci": grid.spec.ci.model_copy(update=ci_update),
            "publish": grid.spec.publish.model_copy(update=publish_update),
        }
    )
    with pytest.raises(UserError, match=re.escape(refusal)) as refused:
        ci.workflow(grid, system)
    assert "\n" not in refused.value.line()


PROPOSALS = {"releases": ("releases.md", "cat releases.md\n"), "security": ("audit.md", "--osv osv-pypi\n")}


def _proposal_jobs(grid, job: str = "releases") -> tuple[dict[str, object], dict[str, object]]:  # type: ignore[no-untyped-def]
    """The step that makes the proposal's patch (no token) and the one that opens the request."""
    jobs = yaml.safe_load(ci.schedule(grid, "github"))["jobs"]
    assert jobs[job]["permissions"] == {"contents": "read"}  # it runs the builder: no write token
    assert jobs[f"{job}-request"]["needs"] == job
    assert not any("nox" in step.get("run", "") for step in jobs[f"{job}-request"]["steps"])  # runs no build code
    propose = next(step for step in jobs[job]["steps"] if f"--{job}" in step.get("run", ""))
    request = next(step for step in jobs[f"{job}-request"]["steps"] if "gh pr create" in step.get("run", ""))
    return propose, request


def _run_proposal_jobs(
    grid, repo: Path, tmp_path: Path, ok: bool = True, job: str = "releases"
) -> tuple[int, list[str]]:  # type: ignore[no-untyped-def]
    """The emitted steps' own scripts, run by bash with real git: the proposing step's lines after
    `update` (which the test stands in for) make the patch in `repo`; then, in the same checkout as
    a fresh one (the patch and text under proposal/, as the artifact brings them), the request
    step, with a bare repository as the remote and a `gh` that records what it is asked."""
    propose, request = _proposal_jobs(grid, job)
    text, update_ends = PROPOSALS[job]
    after_update = str(propose["run"]).split(update_ends, 1)[1]
    made = subprocess.run(["bash", "-e", "-c", after_update], cwd=repo, capture_output=True, text=True)
    assert made.returncode == 0, made.stdout + made.stderr
    (repo / "proposal").mkdir()
    for name in (text, f"{job}.patch"):
        (repo / name).rename(repo / "proposal" / name)
    _git(repo, "reset", "--quiet", "--hard")
    _git(repo, "clean", "--quiet", "-d", "--force", "--exclude", "proposal")
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    calls = tmp_path / "gh-calls"
    gh = tools / "gh"
    gh.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n[ "$1 $2" = "issue list" ] && echo 0\nexit 0\n')
    gh.chmod(0o755)
    env = {**os.environ, **request["env"], "PATH": f"{tools}:{os.environ['PATH']}",  # type: ignore[dict-item]
           "GH_TOKEN": "t0ken", "RUN_ID": "7", "SERVER_URL": f"file://{tmp_path}", "REPOSITORY": "remote"}  # fmt: skip
    done = subprocess.run(["bash", "-e", "-c", str(request["run"])], cwd=repo, env=env, capture_output=True, text=True)
    assert (done.returncode == 0) == ok, done.stdout + done.stderr
    return done.returncode, calls.read_text().splitlines() if calls.exists() else []


def _committed_repo(tmp_path: Path, matrix: str) -> Path:
    repo = tmp_path / "repo"
    _git(tmp_path, "init", "--quiet", str(repo))
    (repo / "matrix.yaml").write_text(matrix)
    (repo / "images").mkdir()
    (repo / "images" / "plan.json").write_text("{}\n")  # a checkout has its images folder
    _git(repo, "add", "matrix.yaml", "images")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "--quiet", "-m", "first")
    return repo


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def test_the_daily_releases_jobs_propose_a_new_release_in_a_pull_request_with_its_new_cells(
    grid,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """Issue 59: once `update --releases` edited the matrix and rendered a new cell, the job that
    ran it (no write token) keeps a patch; the request job, which runs none of it, pushes a branch
    with exactly those files and opens a pull request carrying the proposal."""
    remote = tmp_path / "remote.git"
    _git(tmp_path, "init", "--quiet", "--bare", str(remote))
    repo = _committed_repo(tmp_path, 'axes: {torch: ["2.13.0"]}\n')
    # What `update --releases` leaves: the matrix edited, a new cell's folder, the proposal's text.
    (repo / "matrix.yaml").write_text('axes: {torch: ["2.14.1"]}\n')
    (repo / "images" / "2.14.1-cu13.0-bookworm-runtime").mkdir(parents=True)
    (repo / "images" / "2.14.1-cu13.0-bookworm-runtime" / "Dockerfile").write_text("FROM scratch\n")
    (repo / "releases.md").write_text("- torch 2.14.1 (CUDA 13.0; Pythons 3.10, 3.11, 3.12, 3.13, 3.14)\n")
    _, calls = _run_proposal_jobs(grid, repo, tmp_path)
    assert calls == ["pr create --head releases-7 --title New upstream releases the matrix follows "
                     "--body-file proposal/releases.md"]  # fmt: skip
    pushed = _git(remote, "show", "--name-only", "--format=", "releases-7").split()
    assert sorted(pushed) == ["images/2.14.1-cu13.0-bookworm-runtime/Dockerfile", "matrix.yaml"]
    assert "t0ken" not in _git(repo, "config", "--list")  # the token reached git for the push only


def test_a_proposal_patch_that_touches_other_files_is_refused_and_nothing_is_pushed(
    grid,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """The patch comes from a job that ran build code: one that reaches past the matrix, images/
    and data/ (a workflow, say) opens nothing."""
    repo = _committed_repo(tmp_path, 'axes: {torch: ["2.13.0"]}\n')
    (repo / "matrix.yaml").write_text('axes: {torch: ["2.14.1"]}\n')
    (repo / "releases.md").write_text("- torch 2.14.1\n")
    planted = repo / ".github" / "workflows" / "x.yml"
    planted.parent.mkdir(parents=True)
    planted.write_text("on: push\n")
    _git(repo, "add", str(planted))  # staged beside what the proposing step adds
    code, calls = _run_proposal_jobs(grid, repo, tmp_path, ok=False)
    assert code == 1 and calls == []


def test_the_daily_releases_jobs_open_an_issue_for_a_proposed_base_and_nothing_when_nothing_is_new(
    grid,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    repo = _committed_repo(tmp_path, "axes: {}\n")
    (repo / "releases.md").write_text("No new upstream release that `follow:` asks for.\n")
    assert _run_proposal_jobs(grid, repo, tmp_path)[1] == []
    _git(repo, "clean", "--quiet", "-d", "--force")
    (repo / "releases.md").write_text("- new base proposed\n\nA base for resolute, to add to `bases:`\n")
    calls = _run_proposal_jobs(grid, repo, tmp_path)[1]
    assert [call.split(" --")[0] for call in calls] == ["issue list", "issue create"]
    assert "--body-file proposal/releases.md" in calls[1]


def _gitlab_remote(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A bare repository standing in for GitLab (git's insteadOf; it takes push options as GitLab
    does), a checkout, and the environment a GitLab job gives its script."""
    remote = tmp_path / "remote.git"
    _git(tmp_path, "init", "--quiet", "--bare", str(remote))
    _git(remote, "config", "receive.advertisePushOptions", "true")
    repo = _committed_repo(tmp_path, 'axes: {torch: ["2.13.0"]}\n')
    env = {**os.environ, "CI_PIPELINE_ID": "7", "CI_SERVER_HOST": "gitlab.invalid", "CI_PROJECT_PATH": "remote",
           "CI_DEFAULT_BRANCH": "main", "CI_PIPELINE_URL": "https://gitlab.invalid/pipeline/1",
           "TORCH_IMAGES_PUSH_TOKEN": "t0ken",
           "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": f"url.file://{tmp_path}/.insteadOf",
           "GIT_CONFIG_VALUE_0": "https://gitlab.invalid/"}  # fmt: skip
    return remote, repo, env


def test_the_gitlab_releases_jobs_push_the_moved_matrix_with_a_merge_request_and_nothing_else(
    grid,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """The GitLab schedule's two releases jobs, their own script blocks run by bash with real git:
    the one that runs `update` (in no environment, so a token scoped to `torch-images-push` never
    reaches it) keeps a patch; the request job, which runs none of it, pushes to a bare repository
    standing in for GitLab (git's insteadOf) that takes push options as GitLab does."""
    schedule = yaml.safe_load(ci.schedule(grid, "gitlab"))
    job, request = schedule["releases"], schedule["releases-request"]
    assert job["rules"] == request["rules"] == [{"if": '$CI_PIPELINE_SOURCE == "schedule"'}]
    assert "environment" not in job and request["environment"]["name"] == "torch-images-push"
    assert request["needs"] == ["releases"] and not any("nox" in line for line in request["script"])
    assert job["script"][:3] == ["./nox -s engine", "./nox -s update -- --releases --markdown > releases.md",
                                 "cat releases.md"]  # fmt: skip
    remote, repo, env = _gitlab_remote(tmp_path)

    def run_jobs() -> subprocess.CompletedProcess[str]:
        made = subprocess.run(["bash", "-e", "-c", job["script"][3]], cwd=repo, capture_output=True, text=True)
        assert made.returncode == 0, made.stderr
        _git(repo, "reset", "--quiet", "--hard")  # the request job's fresh checkout, with the artifacts
        _git(repo, "clean", "--quiet", "-d", "--force", "--exclude", "releases.patch", "--exclude", "releases.md")
        return subprocess.run(["bash", "-e", "-c", request["script"][0]], cwd=repo, env=env, capture_output=True,
                              text=True)  # fmt: skip

    unmoved = run_jobs()
    assert unmoved.returncode == 0 and "did not move" in unmoved.stdout
    (repo / "matrix.yaml").write_text('axes: {torch: ["2.14.1"]}\n')
    (repo / "images" / "2.14.1-cu13.0-bookworm-runtime").mkdir(parents=True)
    (repo / "images" / "2.14.1-cu13.0-bookworm-runtime" / "Dockerfile").write_text("FROM scratch\n")
    moved = run_jobs()
    assert moved.returncode == 0, moved.stdout + moved.stderr
    pushed = _git(remote, "show", "--name-only", "--format=", "releases-7").split()
    assert sorted(pushed) == ["images/2.14.1-cu13.0-bookworm-runtime/Dockerfile", "matrix.yaml"]
    assert "t0ken" not in _git(repo, "config", "--list")


def test_the_daily_security_jobs_propose_a_moved_lock_in_a_pull_request_and_nothing_else(
    grid,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """Issue 55: `audit` and `update --security` parse the internet's data, so the job that runs
    them holds no write token; it keeps the moved locks as a patch, and the request job, which
    runs none of it, pushes exactly those and opens the pull request with the audit's findings."""
    remote = tmp_path / "remote.git"
    _git(tmp_path, "init", "--quiet", "--bare", str(remote))
    repo = _committed_repo(tmp_path, 'axes: {torch: ["2.13.0"]}\n')
    (repo / "audit.md").write_text("no finding\n")
    assert _run_proposal_jobs(grid, repo, tmp_path, job="security")[1] == []  # no lock moved: nothing opened
    _git(repo, "clean", "--quiet", "-d", "--force")
    (repo / "images" / "plan.json").write_text('{"moved": true}\n')  # what update --security rewrote
    (repo / "audit.md").write_text("- libssl3 3.0.15-1 has a fix in 3.0.16-1\n")
    calls = _run_proposal_jobs(grid, repo, tmp_path, job="security")[1]
    assert calls == ["pr create --head security-fixes-7 --title Security fixes for the locked packages "
                     "--body-file proposal/audit.md"]  # fmt: skip
    assert _git(remote, "show", "--name-only", "--format=", "security-fixes-7").split() == ["images/plan.json"]
    assert "t0ken" not in _git(repo, "config", "--list")


def test_a_security_patch_that_reaches_past_the_images_folder_is_refused(
    grid,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """A security update moves locks and Dockerfiles only: a patch that also edits the matrix (or a
    workflow) came from a build that was not only updating, and opens nothing."""
    repo = _committed_repo(tmp_path, 'axes: {torch: ["2.13.0"]}\n')
    (repo / "images" / "plan.json").write_text('{"moved": true}\n')
    (repo / "audit.md").write_text("- a finding\n")
    _git(repo, "add", "images")
    (repo / "matrix.yaml").write_text('axes: {torch: ["9.9.9"]}\n')
    _git(repo, "add", "matrix.yaml")  # staged beside what the proposing step adds
    code, calls = _run_proposal_jobs(grid, repo, tmp_path, ok=False, job="security")
    assert code == 1 and calls == []


def test_the_gitlab_security_jobs_push_only_the_moved_locks_with_a_merge_request(
    grid,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    schedule = yaml.safe_load(ci.schedule(grid, "gitlab"))
    job, request = schedule["security"], schedule["security-request"]
    assert "environment" not in job and request["environment"]["name"] == "torch-images-push"
    assert request["needs"] == ["security"] and not any("nox" in line for line in request["script"])
    assert job["artifacts"]["paths"] == ["audit.md", "security.patch"]
    remote, repo, env = _gitlab_remote(tmp_path)
    (repo / "images" / "plan.json").write_text('{"moved": true}\n')
    made = subprocess.run(["bash", "-e", "-c", job["script"][-1]], cwd=repo, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    _git(repo, "reset", "--quiet", "--hard")  # the request job's fresh checkout, with the artifacts
    done = subprocess.run(["bash", "-e", "-c", request["script"][0]], cwd=repo, env=env, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert _git(remote, "show", "--name-only", "--format=", "security-fixes-7").split() == ["images/plan.json"]
    assert "t0ken" not in _git(repo, "config", "--list")
