"""The two ways an image is built from a rendered Dockerfile: the engine's classic builder
through the Docker SDK, or BuildKit through the docker CLI. Both take one BuildRequest and
return the builder's error ("" on success)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import docker
import requests
import urllib3

from builder.assemble.context import context_tar
from builder.engine import emulation
from builder.errors import UserError
from builder.plan.cell import Cell
from builder.steps import Report


@dataclass(frozen=True)
class BuildRequest:
    cell: Cell
    reference: str  # the tag the built image gets
    base_reference: str  # the base image, passed as the BASE_IMAGE build argument
    epoch: int  # SOURCE_DATE_EPOCH: the context's file times
    no_cache: bool = False
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def dockerfile(self) -> str:
        return f"images/{self.cell.name}/Dockerfile"


STEP_IMAGE = re.compile(r"^ ---> ([0-9a-f]{12,64})$")
FROM_CACHE = " ---> Using cache"
FROM_STEP = re.compile(r"^Step \d+/\d+ : FROM ", re.IGNORECASE)


def classic_build(
    engine: docker.DockerClient, request: BuildRequest, report: Report, steps: list[str] | None = None
) -> str:
    """Run the build with the engine's classic builder, reporting each step; returns the
    engine's error, or "" on success. The image each step made is appended to `steps` (the base
    a FROM names, and a step taken from the engine's cache, are others' and are not): after a
    failure or an interruption the caller removes them."""
    cell = request.cell
    emulation.ensure(cell.base.arch, report)  # another architecture's RUN steps run under qemu
    with _closed_on_exit(engine):
        stream = engine.api.build(
            fileobj=context_tar(cell, request.epoch),
            custom_context=True,
            dockerfile=request.dockerfile,
            tag=request.reference,
            buildargs={"BASE_IMAGE": request.base_reference},
            labels=request.labels,
            network_mode="host",
            platform=cell.platform,  # another architecture's RUN steps run under emulation
            rm=True,
            forcerm=True,
            decode=True,
            nocache=request.no_cache,
        )
        try:
            return _follow(stream, cell, report, steps)
        except (urllib3.exceptions.HTTPError, requests.exceptions.RequestException) as lost:
            # dockerd stopped or restarted under the build: one line, after the caller's clean-up
            raise UserError(
                f"{cell.name}: the engine's connection broke in the middle of the build ({type(lost).__name__}); "
                "check the engine (`python -m builder engine`) and build again"
            ) from None


@contextlib.contextmanager
def _closed_on_exit(engine: docker.DockerClient) -> Iterator[None]:
    """Keep the responses the engine's client opens inside the block, and close them at its end.

    The classic builder runs for as long as its client reads: an interrupted build (SIGTERM,
    Ctrl-C) that only dropped the stream would leave the connection open while the traceback
    holds it, and the engine would go on running the step in flight, which keeps its parent
    step images from being removed. A closed connection makes the engine cancel the build."""
    opened: list[requests.Response] = []

    def keep(response: requests.Response, *args: object, **kwargs: object) -> None:
        opened.append(response)

    hooks = engine.api.hooks.setdefault("response", [])
    hooks.append(keep)
    try:
        yield
    finally:
        hooks.remove(keep)
        for response in opened:
            response.close()


def _follow(stream: Iterator[dict[str, object]], cell: Cell, report: Report, steps: list[str] | None) -> str:
    """Read a classic build's stream to its end: its error, or "" when it built."""
    last_lines: list[str] = []
    others = False  # the image the stream names next is not this build's: the base (FROM) or a cached step
    for chunk in stream:
        if "error" in chunk:
            tail = " | ".join(line for line in last_lines[-3:] if line)
            return f"{str(chunk['error']).strip()} ({tail})" if tail else str(chunk["error"]).strip()
        text = str(chunk.get("stream", "")).rstrip()
        made = STEP_IMAGE.match(text)
        if made and steps is not None and not others:
            steps.append(made.group(1))
        if text:
            others = text == FROM_CACHE or bool(FROM_STEP.match(text.strip()))
        text = text.strip()
        if text:
            last_lines = [*last_lines[-5:], text]
            if re.match(r"^Step \d+/\d+", text):
                report(f"{cell.name}: {text[:110]}")
    return ""


def _cli_version(cli: str) -> tuple[str, str]:
    """A docker CLI's own version and the API version it speaks (asked without a daemon)."""
    answer = subprocess.run(
        [cli, "version", "--format", "{{.Client.Version}} {{.Client.APIVersion}}"],
        capture_output=True, text=True, check=False, env={**os.environ, "DOCKER_HOST": "unix:///nonexistent"},
    ).stdout.split()  # fmt: skip
    return (answer[0], answer[1]) if len(answer) == 2 else ("", "")


def _api(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def legacy_docker_cli(cli: str) -> bool:
    """Whether a docker CLI predates 23.0: such a CLI (Debian's 20.10) runs the classic builder by
    default and BuildKit with DOCKER_BUILDKIT=1; later ones run BuildKit only, through buildx."""
    version = _cli_version(cli)[0]
    return bool(version) and int(version.split(".")[0]) < 23


def cli_candidates() -> list[str]:
    """The docker CLIs on this host: PATH's first (the user's choice), then the distro's."""
    return [
        cli for cli in dict.fromkeys([shutil.which("docker") or "", "/usr/bin/docker"]) if cli and Path(cli).exists()
    ]


def buildkit_command(engine: docker.DockerClient) -> tuple[list[str], dict[str, str]] | str:
    """A docker CLI that runs BuildKit builds against this engine, and how to call it; or why none.

    The daemon refuses a CLI older than its minimum API version (Docker 29 refuses Debian's 20.10
    CLI), so only CLIs it accepts are tried. Debian's docker.io 20.10 CLI builds with BuildKit
    when DOCKER_BUILDKIT=1; newer CLIs need the buildx plugin (and refuse BuildKit builds without it).
    """
    minimum = str(engine.version().get("MinAPIVersion", "1.12"))
    accepted = [cli for cli in cli_candidates() if _api(_cli_version(cli)[1] or "0") >= _api(minimum)]
    for cli in accepted:
        if subprocess.run([cli, "buildx", "version"], capture_output=True, check=False).returncode == 0:
            return [cli, "buildx", "build", "--load"], {}
        if legacy_docker_cli(cli):
            return [cli, "build"], {"DOCKER_BUILDKIT": "1"}
    if not accepted:
        return (
            f"BuildKit needs a docker CLI this engine accepts (API {minimum} or newer) and none is installed "
            "(apt-get install docker.io docker-buildx); or build with --backend sdk"
        )
    return (
        f"BuildKit needs the buildx plugin for {accepted[0]}, and it is not installed "
        "(apt-get install docker-buildx); or build with --backend sdk"
    )


def buildkit_build(engine: docker.DockerClient, request: BuildRequest, report: Report) -> str:
    """Run the build with BuildKit through the docker CLI; returns the error, or "" on success."""
    emulation.ensure(request.cell.base.arch, report)  # another architecture's RUN steps run under qemu
    found = buildkit_command(engine)
    if isinstance(found, str):
        raise UserError(found)
    command, extra_env = found
    cell = request.cell
    command = [
        *command, "--progress", "plain", "--network", "host", "--platform", cell.platform,
        "--build-arg", f"BASE_IMAGE={request.base_reference}",
        "-f", request.dockerfile, "-t", request.reference, *(["--no-cache"] if request.no_cache else []),
        *(part for key, value in request.labels.items() for part in ("--label", f"{key}={value}")), "-",
    ]  # fmt: skip
    process = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **extra_env},
    )
    assert process.stdin is not None and process.stdout is not None
    last_lines: list[str] = []
    try:
        process.stdin.write(context_tar(cell, request.epoch).getvalue())
        process.stdin.close()
        for raw in process.stdout:
            line = raw.decode(errors="replace").rstrip()
            last_lines = [*last_lines[-5:], line]
            if re.match(r"^#\d+ \[", line):
                report(f"{cell.name}: {line[:110]}")
    except BaseException:
        # Interrupted: the CLI is not left building on its own (a SIGTERM reaches only this
        # process); stopping it makes BuildKit cancel the build.
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)
        process.kill()
        raise
    if process.wait() != 0:
        return " | ".join(line for line in last_lines[-3:] if line)
    return ""
