"""Running another architecture's programs on this host (arm64 on x86): Debian's
qemu-user-static, registered with the kernel's binfmt_misc by binfmt-support. Bootstrapping an
arm64 base, and building and testing on it, run under it."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from builder.config import platform as platforms
from builder.engine import daemon
from builder.errors import UserError

BINFMT = Path("/proc/sys/fs/binfmt_misc")
# Debian architecture -> qemu's binfmt entry for it
ARCHITECTURES = {p.debian: p.qemu for p in platforms.PLATFORMS.values()}
PACKAGES = ["qemu-user-static", "binfmt-support", "arch-test"]
TOOLS = ["arch-test"]  # mmdebstrap checks a foreign architecture with it before it bootstraps one


def host_architecture() -> str:
    return platforms.host().debian


def registered(arch: str) -> bool:
    return (BINFMT / ARCHITECTURES[arch]).exists()


def ensure(arch: str, report: Callable[[str], None] = print) -> None:
    """Nothing to do for the host's own architecture. Otherwise the binfmt entry must be there;
    as root with apt, the packages are installed and registered (and it says so)."""
    if arch not in ARCHITECTURES:
        raise UserError(f"no emulation known for {arch!r}; write one of {', '.join(ARCHITECTURES)}")
    if arch == host_architecture() or (registered(arch) and all(shutil.which(t) for t in TOOLS)):
        return
    if not daemon.can_apt_install():
        raise UserError(f"{arch} programs cannot run here: install {' and '.join(PACKAGES)} (apt-get install), as root")
    daemon.apt_install(PACKAGES)
    if not (BINFMT / "register").exists():  # no systemd here to mount it
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], check=True)
    subprocess.run(["update-binfmts", "--enable", ARCHITECTURES[arch]], check=True, capture_output=True)
    if not registered(arch):
        raise UserError(f"installed {', '.join(PACKAGES)} but {ARCHITECTURES[arch]} is not registered")
    report(f"installed {', '.join(PACKAGES)} with apt-get and registered {arch} emulation ({ARCHITECTURES[arch]})")
