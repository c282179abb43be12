"""Running a host command as root: directly when the builder is root, through passwordless sudo
where the machine has it (GitHub's and GitLab's hosted runners do), else not at all.

Why not user namespaces: mmdebstrap's unshare mode needs unprivileged user namespaces, which
GitHub's ubuntu-24.04 runners refuse (AppArmor restricts them; actions/runner-images#10443).
A bootstrap as root through sudo works there and on every runner that has sudo."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess


@functools.cache
def root_prefix() -> tuple[str, ...] | None:
    """() as root, ("sudo", "-n") where sudo runs without a password, None where neither."""
    if os.geteuid() == 0:
        return ()
    if shutil.which("sudo") is None:
        return None
    try:
        answered = subprocess.run(["sudo", "-n", "true"], capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return ("sudo", "-n") if answered.returncode == 0 else None


def as_root(command: list[str], environment: dict[str, str] | None = None) -> list[str] | None:
    """`command` run as root with `environment` set (sudo resets the environment, so it goes on
    the command line through env), or None where root is out of reach."""
    prefix = root_prefix()
    if prefix is None:
        return None
    settings = [f"{name}={value}" for name, value in (environment or {}).items()]
    return [*prefix, "env", *settings, *command]  # env: as root too, so the settings always apply
