"""Build cells on the Docker engine through the Docker SDK.

Before anything reaches the engine, the cell's locks and rendered Dockerfile must match the
matrix, and every wheel must be in the wheelhouse with its locked hash: a stale lock or a
bad file stops the build with nothing built. The build runs with host networking so RUN
steps reach the wheelhouse on loopback; wheel files never enter the build context.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import docker.models.images

from builder import paths, times
from builder.build import wheelhouse, wheelserver
from builder.engine import bases as base
from builder.errors import UserError
from builder.lock import inputs
from builder.lock.inputs import CellLocks
from builder.plan.cell import Cell
from builder.plan.matrix import Matrix
from builder.render import render, served
from builder.repro import normalize as repro

BUILD_ID_LABEL = "io.torch-images.build-id"
BUILD_CACHE_REPOSITORY = "torch-images/build-cache"
Report = Callable[[str], None]


@dataclass
class BuildResult:
    cell: str
    reference: str
    image_id: str = ""
    size_bytes: int = 0
    seconds: float = 0.0
    status: str = "pending"  # built | unchanged | failed | then smoke's verdict
    detail: str = ""
    build_id: str = ""
    intermediate: str = ""  # the engine's image before normalization, when it differs from the result


def local_reference(grid: Matrix, cell: Cell) -> str:
    return f"{grid.spec.repository}:{cell.tag}"


def preflight(cell: Cell, grid: Matrix) -> CellLocks:
    """The cell's locks, read once; refuses a cell whose locks or Dockerfile do not match matrix.yaml."""
    locks = inputs.read(cell, grid)
    problems = [*locks.problems, *render.drift_of(locks, grid)]
    if problems:
        raise UserError(problems[0])
    return locks


def context_files(cell: Cell) -> dict[str, Path]:
    """The build context, by name in the context: the cell's Dockerfile and spec.json, and the
    self-test with its data. Named the same wherever the files live (a checkout, an installed
    package, a matrix elsewhere), as the rendered Dockerfile's COPY lines expect."""
    directory = cell.directory
    return {
        f"images/{cell.name}/Dockerfile": directory / "Dockerfile",
        f"images/{cell.name}/spec.json": directory / "spec.json",
        "image/selftest.py": paths.SELFTEST,
        "image/gpu_peaks.json": paths.GPU_PEAKS,
    }


def context_tar(cell: Cell, epoch: int) -> io.BytesIO:
    """The build context as a tar of exactly context_files (small: a Dockerfile, specs, scripts)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, path in sorted(context_files(cell).items()):
            # Fixed times and owners: a checkout's file times must not reach a COPY'd layer.
            info = archive.gettarinfo(str(path), arcname=name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "", ""
            info.mode = 0o644
            with path.open("rb") as handle:
                archive.addfile(info, handle)
    buffer.seek(0)
    return buffer


def build_id(cell: Cell, base_image_id: str, backend: str) -> str:
    """A content hash of every input of the build. The rendered Dockerfile names each lock and
    helper script by its sha256 (and each lock every wheel by its own), so hashing the context
    and the base image's ID covers everything the image is made from. (Normalization is not an
    input: it happens after the build, and a normalized image says so by its creation time.)"""
    digest = hashlib.sha256()
    for name, path in sorted(context_files(cell).items()):
        digest.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    digest.update(f"{base_image_id} {backend}".encode())
    return digest.hexdigest()[:32]


def _existing_build(
    engine: docker.DockerClient, reference: str, identity: str, normalized_at: str | None
) -> docker.models.images.Image | None:
    """The image tagged `reference` if it was built from exactly these inputs (and normalized,
    when normalized_at names the fixed creation time a normalized image carries)."""
    try:
        image = engine.images.get(reference)
    except docker.errors.ImageNotFound:
        return None
    if (image.labels or {}).get(BUILD_ID_LABEL) != identity:
        return None
    if normalized_at is not None and not str(image.attrs.get("Created", "")).startswith(normalized_at):
        return None
    return image


def build_cell(
    engine: docker.DockerClient,
    grid: Matrix,
    cell: Cell,
    house: wheelhouse.Wheelhouse,
    report: Report,
    no_cache: bool = False,
    normalize: bool = True,
    backend: str = "sdk",
    reference: str | None = None,
) -> BuildResult:
    """Build one cell. An image already tagged `reference` with the same build ID is left as it
    is (status "unchanged") unless no_cache; the engine's pre-normalization image is returned as
    `intermediate` for the caller to remove (see discard_intermediates)."""
    reference = reference or local_reference(grid, cell)
    result = BuildResult(cell.name, reference)
    started = time.monotonic()
    locks = preflight(cell, grid)
    base_reference = base.ensure(engine, cell.base, grid.spec.source_date_epoch, report)
    result.build_id = build_id(cell, engine.images.get(base_reference).id, backend)
    normalized_at = times.iso_utc(grid.spec.source_date_epoch).removesuffix("Z") if normalize else None
    existing = None if no_cache else _existing_build(engine, reference, result.build_id, normalized_at)
    if existing is not None:
        report(f"{cell.name}: unchanged since its last build (build ID {result.build_id[:12]})")
        result.image_id, result.size_bytes, result.status = existing.id, int(existing.attrs["Size"]), "unchanged"
        result.seconds = time.monotonic() - started
        return result
    report(f"{cell.name}: fetching and verifying wheels")
    house.report = report
    house.prepare(cell, grid, locks.python_locks)
    house.publish_files(served.SUPPORT_FILES)
    labels = {BUILD_ID_LABEL: result.build_id}
    epoch = grid.spec.source_date_epoch
    with wheelserver.serve(house, grid.spec.wheelhouse.listen):
        if backend == "buildkit":
            error = _buildkit_build(cell, reference, base_reference, report, no_cache, epoch, labels)
        else:
            error = engine_build(engine, cell, reference, base_reference, report, no_cache, epoch, labels)
    result.seconds = time.monotonic() - started
    if error:
        result.status, result.detail = "failed", error
        return result
    raw_id = engine.images.get(reference).id
    if normalize:
        base_layers = base.layer_count(engine, base_reference)
        normalized = repro.normalize_image(engine, reference, epoch, base_layers, report)
        if normalized != raw_id:
            result.intermediate = raw_id
        result.seconds = time.monotonic() - started
    image = engine.images.get(reference)
    result.image_id, result.size_bytes, result.status = image.id, int(image.attrs["Size"]), "built"
    return result


def discard_intermediates(engine: docker.DockerClient, results: list[BuildResult]) -> None:
    """Remove the engine's pre-normalization images, with the step images only they use.

    They are the classic builder's cache: kept until every cell of one run is built, so cells
    that share steps (a runtime and its devel sibling) reuse them, then removed so that the
    engine holds only the images asked for. An unchanged cell needs no cache (its build ID
    matches); a changed one is built again from its base, with the wheels from the wheelhouse.
    """
    for result in results:
        if result.intermediate:
            with contextlib.suppress(docker.errors.ImageNotFound, docker.errors.APIError):
                engine.images.remove(result.intermediate, force=False, noprune=False)
            result.intermediate = ""


def keep_intermediates(engine: docker.DockerClient, results: list[BuildResult]) -> list[str]:
    """Tag the pre-normalization images as torch-images/build-cache:<cell> (`build --keep-build-cache`)."""
    kept = []
    for result in results:
        if result.intermediate:
            engine.images.get(result.intermediate).tag(BUILD_CACHE_REPOSITORY, result.cell)
            kept.append(f"{BUILD_CACHE_REPOSITORY}:{result.cell}")
    return kept


def engine_build(
    engine: docker.DockerClient,
    cell: Cell,
    reference: str,
    base_reference: str,
    report: Report,
    no_cache: bool,
    epoch: int,
    labels: dict[str, str],
) -> str:
    """Run the build with the engine's classic builder, reporting each step; returns the
    engine's error, or "" on success."""
    stream = engine.api.build(
        fileobj=context_tar(cell, epoch),
        custom_context=True,
        dockerfile=f"images/{cell.name}/Dockerfile",
        tag=reference,
        buildargs={"BASE_IMAGE": base_reference},
        labels=labels,
        network_mode="host",
        rm=True,
        forcerm=True,
        decode=True,
        nocache=no_cache,
    )
    last_lines: list[str] = []
    for chunk in stream:
        if "error" in chunk:
            tail = " | ".join(line for line in last_lines[-3:] if line)
            return f"{chunk['error'].strip()} ({tail})" if tail else chunk["error"].strip()
        text = chunk.get("stream", "").strip()
        if text:
            last_lines = [*last_lines[-5:], text]
            if re.match(r"^Step \d+/\d+", text):
                report(f"{cell.name}: {text[:110]}")
    return ""


def legacy_docker_cli(cli: str) -> bool:
    """Whether a docker CLI predates 23.0: such a CLI (Debian's 20.10) runs the classic builder by
    default and BuildKit with DOCKER_BUILDKIT=1; later ones run BuildKit only, through buildx."""
    version = subprocess.run(
        [cli, "version", "--format", "{{.Client.Version}}"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return bool(version) and int(version.split(".")[0]) < 23


def buildkit_command() -> tuple[list[str], dict[str, str]] | None:
    """A docker CLI that runs BuildKit builds against this engine, and how to call it.

    Debian's docker.io 20.10 CLI builds with BuildKit when DOCKER_BUILDKIT=1; newer CLIs need
    the buildx plugin (and refuse BuildKit builds without it).
    """
    for cli in dict.fromkeys(["/usr/bin/docker", shutil.which("docker") or ""]):
        if not cli or not Path(cli).exists():
            continue
        if subprocess.run([cli, "buildx", "version"], capture_output=True, check=False).returncode == 0:
            return [cli, "buildx", "build", "--load"], {}
        if legacy_docker_cli(cli):
            return [cli, "build"], {"DOCKER_BUILDKIT": "1"}
    return None


def _buildkit_build(
    cell: Cell,
    reference: str,
    base_reference: str,
    report: Report,
    no_cache: bool,
    epoch: int,
    labels: dict[str, str],
) -> str:
    """Run the build with BuildKit through the docker CLI; returns the error, or "" on success."""
    found = buildkit_command()
    if found is None:
        raise UserError(
            "no docker CLI here runs BuildKit builds (Debian's docker.io 20.10 or one with buildx); use --backend sdk"
        )
    command, extra_env = found
    command = [
        *command, "--progress", "plain", "--network", "host", "--build-arg", f"BASE_IMAGE={base_reference}",
        "-f", f"images/{cell.name}/Dockerfile", "-t", reference, *(["--no-cache"] if no_cache else []),
        *(part for key, value in labels.items() for part in ("--label", f"{key}={value}")), "-",
    ]  # fmt: skip
    process = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **extra_env},
    )
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(context_tar(cell, epoch).getvalue())
    process.stdin.close()
    last_lines: list[str] = []
    for raw in process.stdout:
        line = raw.decode(errors="replace").rstrip()
        last_lines = [*last_lines[-5:], line]
        if re.match(r"^#\d+ \[", line):
            report(f"{cell.name}: {line[:110]}")
    if process.wait() != 0:
        return " | ".join(line for line in last_lines[-3:] if line)
    return ""


def remove_image(engine: docker.DockerClient, reference: str) -> None:
    with contextlib.suppress(docker.errors.ImageNotFound):
        engine.images.remove(reference, force=True)
