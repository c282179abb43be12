"""Build cells on the Docker engine through the Docker SDK.

Before anything reaches the engine, the cell's locks and rendered Dockerfile must match the
matrix, and every wheel must be in the wheelhouse with its locked hash: a stale lock or a
bad file stops the build with nothing built. The build runs with host networking so RUN
steps reach the wheelhouse on loopback; wheel files never enter the build context.
"""

from __future__ import annotations

import contextlib
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

from builder import base, lock, render, repro, wheelhouse
from builder.cell import Cell
from builder.errors import UserError
from builder.matrix import Matrix

REPO_ROOT = Path(__file__).resolve().parent.parent
Report = Callable[[str], None]


@dataclass
class BuildResult:
    cell: str
    reference: str
    image_id: str = ""
    size_bytes: int = 0
    seconds: float = 0.0
    status: str = "pending"  # built | failed | then smoke's verdict
    detail: str = ""


def local_reference(grid: Matrix, cell: Cell) -> str:
    return f"{grid.spec.repository}:{cell.tag}"


def preflight(cell: Cell, grid: Matrix) -> None:
    """Refuse to build a cell whose lock or Dockerfile does not match matrix.yaml."""
    problems = lock.check_cell(cell, grid) + render.drift([cell], grid)
    if problems:
        raise UserError(problems[0])


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
    reference = reference or local_reference(grid, cell)
    result = BuildResult(cell.name, reference)
    started = time.monotonic()
    preflight(cell, grid)
    report(f"{cell.name}: fetching and verifying wheels")
    house.prepare(cell, grid, lock.read_locks(cell))
    house.publish_files(render.SUPPORT_FILES)
    base_reference = base.ensure(engine, cell.base, grid.spec.source_date_epoch, report)
    with wheelhouse.serve(house, grid.spec.wheelhouse.listen):
        error = _stream_build(engine, cell, reference, base_reference, report, no_cache, grid.spec.source_date_epoch)
    result.seconds = time.monotonic() - started
    if error:
        result.status, result.detail = "failed", error
        return result
    if normalize:
        base_layers = base.layer_count(engine, base_reference)
        repro.normalize_image(engine, reference, grid.spec.source_date_epoch, base_layers, report)
        result.seconds = time.monotonic() - started
    image = engine.images.get(reference)
    result.image_id, result.size_bytes, result.status = image.id, int(image.attrs["Size"]), "built"
    return result


def context_paths(cell: Cell) -> list[Path]:
    """The files a cell's build needs: the `!path` allowlist of .dockerignore, this cell's images/ only."""
    allowed = [
        line[1:].strip().rstrip("/")
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    paths: list[Path] = []
    for entry in allowed:
        root = REPO_ROOT / (lock.cell_dir(cell).as_posix() if entry == "images" else entry)
        paths += sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    return [p.relative_to(REPO_ROOT) for p in paths if p.exists()]


def context_tar(cell: Cell, epoch: int) -> io.BytesIO:
    """The build context as a tar of exactly context_paths (small: locks, specs, scripts)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path in context_paths(cell):
            # Fixed times and owners: a checkout's file times must not reach a COPY'd layer.
            info = archive.gettarinfo(str(REPO_ROOT / path), arcname=path.as_posix())
            info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "", ""
            with (REPO_ROOT / path).open("rb") as handle:
                archive.addfile(info, handle)
    buffer.seek(0)
    return buffer


def _stream_build(
    engine: docker.DockerClient,
    cell: Cell,
    reference: str,
    base_reference: str,
    report: Report,
    no_cache: bool,
    epoch: int,
) -> str:
    """Run the build, reporting each step; returns the engine's error, or "" on success."""
    dockerfile = (lock.cell_dir(cell) / "Dockerfile").as_posix()
    stream = engine.api.build(
        fileobj=context_tar(cell, epoch),
        custom_context=True,
        dockerfile=dockerfile,
        tag=reference,
        buildargs={"BASE_IMAGE": base_reference},
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
        version = subprocess.run(
            [cli, "version", "--format", "{{.Client.Version}}"], capture_output=True, text=True, check=False
        ).stdout.strip()
        if version and int(version.split(".")[0]) < 23:
            return [cli, "build"], {"DOCKER_BUILDKIT": "1"}
    return None


def _buildkit_build(cell: Cell, reference: str, base_reference: str, report: Report, no_cache: bool, epoch: int) -> str:
    """Run the build with BuildKit through the docker CLI; returns the error, or "" on success."""
    found = buildkit_command()
    if found is None:
        raise UserError(
            "no docker CLI here runs BuildKit builds (Debian's docker.io 20.10 or one with buildx); use --backend sdk"
        )
    command, extra_env = found
    dockerfile = (lock.cell_dir(cell) / "Dockerfile").as_posix()
    command = [
        *command, "--progress", "plain", "--network", "host", "--build-arg", f"BASE_IMAGE={base_reference}",
        "-f", dockerfile, "-t", reference, *(["--no-cache"] if no_cache else []), "-",
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
