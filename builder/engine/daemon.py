"""The Docker engine: connect through the Docker SDK, or say in one line how to start one."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import docker
import docker.errors

from builder.engine import privilege
from builder.errors import UserError

DOCKERD_LOG = Path("/var/log/torch-images-dockerd.log")
# Program -> Debian package that a fresh host needs for builds (the engine, the base bootstrap,
# and gpgv, which checks the signature of each suite index that debian.lock is made from).
HOST_TOOLS = {"dockerd": "docker.io", "mmdebstrap": "mmdebstrap", "gpgv": "gpgv"}
# ... and for the tests: a real registry (the CNCF distribution, as Debian packages it) with
# htpasswd authentication, openssl for the certificates the tests make, and sudo for the run of
# the emitted workflow as a hosted runner's non-root user.
TEST_TOOLS = {
    "docker-registry": "docker-registry",
    "htpasswd": "apache2-utils",
    "openssl": "openssl",
    "gpg": "gnupg",
    "sudo": "sudo",
}


def socket_name() -> str:
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


def client() -> docker.DockerClient:
    """A client for an engine that answers, or a UserError naming the socket and the fix."""
    try:
        engine = docker.from_env(version="auto", timeout=600)  # the API version the daemon speaks
        engine.ping()
        return engine
    except docker.errors.DockerException:
        raise UserError(
            f"no Docker engine answers at {socket_name()}; start one (`sudo dockerd &`), "
            "or run `nox -s engine` as root to install and start Debian's docker.io"
        ) from None


def answers() -> bool:
    try:
        docker.from_env(version="auto", timeout=5).ping()
        return True
    except docker.errors.DockerException:
        return False


def _program_missing(program: str) -> bool:
    # Debian installs docker-registry in /usr/bin, which a minimal PATH may lack.
    return shutil.which(program) is None and not Path("/usr/bin", program).exists()


def missing_packages(test_tools: bool) -> list[str]:
    tools = {**HOST_TOOLS, **(TEST_TOOLS if test_tools else {})}
    return [package for program, package in tools.items() if _program_missing(program)]


def can_apt_install() -> bool:
    """As root, or through passwordless sudo (a CI runner), on a machine with apt."""
    return privilege.root_prefix() is not None and shutil.which("apt-get") is not None


def apt_install(packages: list[str]) -> None:
    """Install Debian packages on the host (root, apt), without recommends."""
    update = privilege.as_root(["apt-get", "update", "-q"])
    install = privilege.as_root(
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages], {"DEBIAN_FRONTEND": "noninteractive"}
    )
    if update is None or install is None:
        raise UserError(f"installing {', '.join(packages)} needs root or passwordless sudo")
    subprocess.run(update, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(install, check=True, stdout=subprocess.DEVNULL)


def ensure_running(install: bool, test_tools: bool = False) -> str:
    """Install what a fresh host lacks (with install, as root or through passwordless sudo, with
    apt) and start dockerd if none answers.

    Installs Debian's docker.io and mmdebstrap when missing (with test_tools also
    docker-registry, apache2-utils, openssl, gnupg and sudo), and starts dockerd in the background, logging
    to DOCKERD_LOG. Returns what it did, for the caller to print.
    """
    did = []
    missing = missing_packages(test_tools)
    if missing and install and can_apt_install():
        apt_install(missing)
        how = "apt-get" if os.geteuid() == 0 else "sudo apt-get"
        did.append(f"installed {', '.join(missing)} with {how}")
    elif missing:
        did.append(
            f"missing {', '.join(missing)} (install them with apt-get, or run this with --install as root "
            "or with passwordless sudo)"
        )
    if answers():
        return "; ".join([*did, "a Docker engine answers"])
    if os.geteuid() != 0:
        raise UserError(f"no Docker engine answers at {socket_name()} and this is not root; start dockerd yourself")
    if shutil.which("dockerd") is None:
        raise UserError("dockerd is not installed; install Debian's docker.io (apt-get install docker.io)")
    with DOCKERD_LOG.open("ab") as log:
        subprocess.Popen(["dockerd"], stdout=log, stderr=log, start_new_session=True)
    for _ in range(60):
        if answers():
            did.append(f"started dockerd in the background (log: {DOCKERD_LOG})")
            return "; ".join(did)
        time.sleep(1)
    raise UserError(f"dockerd did not answer within 60 s; see {DOCKERD_LOG}")


def description(engine: docker.DockerClient) -> str:
    """The engine in a few words, as records and signed rebuilds name it: its version and store."""
    info = engine.info()
    store = "containerd store" if "containerd" in str(info.get("DriverStatus", "")) else str(info.get("Driver", ""))
    return f"Docker {engine.version().get('Version', '?')} ({store})"
