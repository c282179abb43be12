"""`python -m builder ci github|gitlab`: the CI workflow that fans the matrix out: one job per
cell (install, build, self-test, stage), a GPU stage per CUDA cell on the matrix's GPU runners,
then one promote job (templates/ci/). Like the Dockerfiles, every value the templates receive is
validated: cell names, runner labels, the registry and the matrix's path."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from builder.config import actions, grammar
from builder.config.schema import DEFAULT_MATRIX
from builder.errors import UserError
from builder.plan.cell import Cell
from builder.plan.matrix import Matrix, selected
from builder.render import render

SYSTEMS = ("github", "gitlab")
# GitHub's hosted runner per platform: arm64 cells build natively on GitHub's arm64 runners.
RUNNERS = {"linux/amd64": "ubuntu-24.04", "linux/arm64": "ubuntu-24.04-arm"}
CELL_TIMEOUT_MINUTES = 150  # a CUDA cell: about 3 GB of wheels, a 6 GB image, normalization and the self-test
GPU_TIMEOUT_MINUTES = 60  # a pull of about 3 GB and the self-test on the GPU
# Where the builder keeps wheels, .debs and bootstrapped bases (TORCH_IMAGES_CACHE): the CI cache.
CACHE_DIR = ".cache/torch-images"
# What a CI cache carries from run to run: only entries that prove themselves on use (a wheel, a
# .deb, a Packages index and a keyring by the sha256 a lock or a signed index gives, a base rootfs
# by its digest and the cell's recorded build). Records the builder derives (image IDs by engine ID,
# normalized images, reports, compressed-layer digests) and unpacked tools stay on their machine.
CI_CACHED = ("wheelhouse", "debs", "apt-indexes", "keyrings", "bases")
# Where `ci gitlab --schedule` is kept: the fan-out includes it from there when it exists.
GITLAB_SCHEDULE_FILE = ".gitlab/torch-images-security.yml"


@dataclass(frozen=True)
class Target:
    """Where the workflow publishes, and how its jobs log in there."""

    image: str  # REGISTRY/REPOSITORY, or a shell expression the job expands ($CI_REGISTRY_IMAGE/torch)
    login: str  # "ghcr" (GITHUB_TOKEN), "gitlab" (the job token), "secrets" (REGISTRY_USER/REGISTRY_PASSWORD)
    host: str  # the registry's host, for docker login


def target(grid: Matrix, system: str, registry: str | None) -> Target:
    """`--registry REGISTRY[/REPOSITORY]` where given; else the CI system's own registry: GHCR under
    the repository's owner, or the GitLab project's registry."""
    if registry is not None:
        host, _, repository = registry.partition("/")
        image = f"{host}/{repository or grid.spec.repository}"
        return Target(image, "ghcr" if host == "ghcr.io" and system == "github" else "secrets", host)
    if system == "github":
        return Target(f"ghcr.io/${{OWNER}}/{grid.spec.repository}", "ghcr", "ghcr.io")
    return Target(f"$CI_REGISTRY_IMAGE/{grid.spec.repository}", "gitlab", "$CI_REGISTRY")


def left_out(grid: Matrix, cell: Cell) -> bool:
    """A cell the matrix's ci.exclude selects: its inputs are on no runner (the CPU cells' wheels
    come from a folder of the build machine), so it is a job only when `ci` names it."""
    return selected(grid.spec.ci.exclude, cell)


def workflow(grid: Matrix, system: str, registry: str | None = None, names: list[str] | None = None) -> str:
    files = _files(grid, system)
    if registry is not None and not grammar.REGISTRY_REF.matches(registry):
        raise UserError(f"--registry {registry!r}: write {grammar.REGISTRY_REF.hint}")
    chosen = grid.select(names) if names else [c for c in grid.cells if not left_out(grid, c)]
    if not chosen:
        raise UserError("ci.exclude leaves no cell to make a job of: name the cells (`ci github CELL ...`)", grid.path)
    _check_quorum_reachable(grid, system)
    not_jobs = [c for c in grid.cells if c not in chosen]
    for cell in grid.cells:  # cell names are made of validated fields; say so here too
        if not grammar.TAG.matches(cell.name):
            raise UserError(f"cell name {cell.name!r} cannot go into a workflow: write {grammar.TAG.hint}")
    by_arch: dict[str, list[str]] = {}
    for cell in chosen:
        by_arch.setdefault(cell.arch, []).append(cell.name)
    values = {
        **files,
        "target": target(grid, system, registry),
        "repository": grid.spec.repository,
        "jobs": [
            {"cell": cell.name, "runner": RUNNERS[cell.platform], "tags": _image_tags(grid, cell)} for cell in chosen
        ],
        "left_out": [c.name for c in not_jobs],
        "gpu_jobs": gpu_jobs(grid, chosen),
        "by_arch": by_arch,
        "runner": RUNNERS["linux/amd64"],
        "timeout_minutes": CELL_TIMEOUT_MINUTES,
        "gpu_timeout_minutes": GPU_TIMEOUT_MINUTES,
        "cache_dir": CACHE_DIR,
        "cached": CI_CACHED,
        "actions": pinned_actions(),
        "schedule_file": GITLAB_SCHEDULE_FILE,
        "github_attestations": grid.spec.ci.github_attestations,
        "rebuild_check": grid.spec.ci.rebuild_check,
        # promote waits for every job before it: the GPU stage, and GitHub's attestations when asked
        "promote_needs": "[" + ", ".join(_promote_needs(grid, chosen)) + "]",
        # the manifests each cell job stages: gzip always, and the zstd form where the matrix adds it
        "forms": ["gzip", "zstd"] if grid.spec.publish.compression == "zstd" else ["gzip"],
    }
    render.check_values(values, "ci")
    return render.environment().get_template(f"ci/{system}.yml.j2").render(values)


def _check_quorum_reachable(grid: Matrix, system: str) -> None:
    """The emitted promote job runs once the run's own jobs are done: a quorum of signed rebuilds
    that they do not make would hold every tag for good, so it is refused here, in one line."""
    made = 1 if grid.spec.ci.rebuild_check and system == "github" else 0
    if grid.spec.ci.rebuild_check and not made:
        raise UserError(
            f"ci.rebuild_check: `ci {system}` emits no rebuild job, so promote would wait for one forever; "
            "leave it out, and rebuild with `verify --rebuild --sign-key` beside the pipeline",
            grid.path,
        )
    wanted = grid.spec.publish.require_rebuilds
    if wanted > made:
        raise UserError(
            f"publish.require_rebuilds is {wanted}, and the emitted workflow makes {made} signed rebuild(s) "
            "(ci.rebuild_check) before its promote job: that job could never move a tag; lower it to "
            f"{made}, and promote by hand (`publish promote`) once the other rebuilders signed",
            grid.path,
        )


def _promote_needs(grid: Matrix, chosen: list[Cell]) -> list[str]:
    needs = ["sign"]
    if gpu_jobs(grid, chosen):
        needs.append("sign-gpu")
    if grid.spec.ci.github_attestations:
        needs.append("attest")
    if grid.spec.ci.rebuild_check:
        needs.append("sign-rebuild")
    return needs


def _image_tags(grid: Matrix, cell: Cell) -> dict[str, str]:
    """The cell's image tag in each form it is staged in (the staging tags add `.staging-<run>`)."""
    forms = ["gzip", "zstd"] if grid.spec.publish.compression == "zstd" else ["gzip"]
    return {form: grid.image_tag(cell, form) for form in forms}


def pinned_actions() -> dict[str, str]:
    """Each GitHub action's `uses:` text, pinned by commit (data/github-actions.yaml)."""
    return {name: pin.uses for name, pin in actions.load().items()}


def gpu_jobs(grid: Matrix, cells: list[Cell]) -> list[dict[str, object]]:
    """The GPU stage: one job per CUDA cell on a runner with the matrix's labels for its
    architecture. A cell whose gate is required and which no runner can test is refused here:
    its tags could never be promoted."""
    jobs: list[dict[str, object]] = []
    for cell in (c for c in cells if c.gpu_gate != "none"):
        labels = grid.spec.ci.gpu_runner_for(cell.arch)
        if not labels and cell.gpu_gate == "required":
            raise UserError(
                f"{cell.name} needs a passing GPU self-test before its tags move, and ci.gpu_runner names no "
                f"{cell.arch} runner: add its labels (ci: {{gpu_runner: {{{cell.arch}: [self-hosted, gpu]}}}}), "
                "or list the cell under ci.gpu_optional",
                grid.path,
            )
        if labels:
            jobs.append({"cell": cell.name, "runner": labels, "optional": cell.gpu_gate == "optional"})
    return jobs


def _files(grid: Matrix, system: str) -> dict[str, str]:
    """What every workflow names: the matrix file (and the option that names it, where it is not
    the default) and the images folder, as the checkout's root sees them."""
    if system not in SYSTEMS:
        raise UserError(f"no CI system {system!r}: write one of {', '.join(SYSTEMS)}")
    matrix_file = _relative(grid.path)
    return {
        "matrix_file": matrix_file,
        "matrix_option": "" if matrix_file == str(DEFAULT_MATRIX) else f"--matrix {matrix_file} ",
        "images_dir": _relative(grid.images_dir),
    }


def _relative(path: Path) -> str:
    """A path inside the checkout, as the workflow (run from the checkout's root) names it."""
    text = os.path.relpath(path.resolve(), Path.cwd())
    if not grammar.RELATIVE_DIR.matches(text):
        raise UserError(f"{path} is outside this checkout; run `ci` from the root of the checkout that holds it")
    return text


def schedule(grid: Matrix, system: str) -> str:
    """The daily jobs: audit, update --security, and a pull (merge) request when a lock moved; with
    the matrix's `follow:` key also update --releases, and a pull request when the matrix moved (an
    issue when it only proposes a base)."""
    values = {
        **_files(grid, system),
        "follow_releases": grid.spec.follow is not None,
        "runner": RUNNERS["linux/amd64"],
        "actions": pinned_actions(),
        "schedule_file": GITLAB_SCHEDULE_FILE,
    }
    render.check_values(values, "ci")
    return render.environment().get_template(f"ci/{system}-schedule.yml.j2").render(values)
