"""The Docker engine: connect through the Docker SDK, or say in one line how to start one."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import docker
import docker.errors

from builder.errors import UserError

DOCKERD_LOG = Path("/var/log/torch-images-dockerd.log")


def socket_name() -> str:
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


def client() -> docker.DockerClient:
    """A client for an engine that answers, or a UserError naming the socket and the fix."""
    try:
        engine = docker.from_env(timeout=600)
        engine.ping()
        return engine
    except docker.errors.DockerException:
        raise UserError(
            f"no Docker engine answers at {socket_name()}; start one (`sudo dockerd &`), "
            "or run `nox -s engine` as root to install and start Debian's docker.io"
        ) from None


def answers() -> bool:
    try:
        docker.from_env(timeout=5).ping()
        return True
    except docker.errors.DockerException:
        return False


def ensure_running(install: bool) -> str:
    """Start (and with install, first install) a Docker engine when none answers.

    Only as root on a Debian-like host: it runs `apt-get install docker.io` and starts dockerd
    in the background, logging to DOCKERD_LOG. Returns what it did, for the caller to print.
    """
    if answers():
        return "a Docker engine already answers"
    if os.geteuid() != 0:
        raise UserError(f"no Docker engine answers at {socket_name()} and this is not root; start dockerd yourself")
    did = []
    if shutil.which("dockerd") is None:
        if not install or shutil.which("apt-get") is None:
            raise UserError("dockerd is not installed; install Debian's docker.io (apt-get install docker.io)")
        subprocess.run(["apt-get", "update", "-q"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "docker.io"],
            check=True,
            stdout=subprocess.DEVNULL,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
        did.append("installed Debian's docker.io")
    with DOCKERD_LOG.open("ab") as log:
        subprocess.Popen(["dockerd"], stdout=log, stderr=log, start_new_session=True)
    for _ in range(60):
        if answers():
            did.append(f"started dockerd in the background (log: {DOCKERD_LOG})")
            return "; ".join(did)
        time.sleep(1)
    raise UserError(f"dockerd did not answer within 60 s; see {DOCKERD_LOG}")
