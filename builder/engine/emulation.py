"""Running another architecture's programs on this host (arm64 on x86): a static qemu-user,
registered with the kernel's binfmt_misc. Bootstrapping an arm64 base, and building and testing
on it, run under it.

The qemu is the one data/tools.yaml pins (Debian 13's), fetched by its sha256 into the cache and
registered under an entry of the builder's own (`torch-images-qemu-aarch64`), with the F flag so
that the kernel holds the interpreter open and containers need no copy of it. Not the host's
qemu-user-static: Debian 12's 7.2 segfaults loading torch's CUDA arm64 build. The kernel tries the
newest entry first, so the host's own entry, if any, stays as it was and is simply not used.

Nothing else of the host's is needed: mmdebstrap's own check of a foreign architecture (arch-test,
and the host's /usr/bin/qemu-aarch64-static, which it wants unless an entry named qemu-aarch64 has
the F flag) is skipped, since `ensure` has checked the builder's entry (bases.foreign_options)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from functools import cache
from pathlib import Path

from builder.config import platform as platforms
from builder.config import tools as tool_specs
from builder.engine import debfile, privilege
from builder.errors import UserError

BINFMT = Path("/proc/sys/fs/binfmt_misc")
# Debian architecture -> qemu's program for it (qemu-aarch64)
ARCHITECTURES = {p.debian: p.qemu for p in platforms.PLATFORMS.values()}
QEMU_PACKAGE = "qemu-user"
ENTRY_PREFIX = "torch-images-"
# The CPU qemu plays for a self-test: the one nearest the machines the architecture's images run
# on. arm64: Grace's Neoverse V2 (Armv9.0, SVE2 at 128 bits, bf16, i8mm); qemu 10.0 has no
# neoverse-v2, and its neoverse-n2 has the same vector unit. qemu's default CPU (max) has 256-bit
# SVE, for which Inductor emits C++ that Debian 12's GCC 12 stops on (an internal compiler error
# in svld1_f32): a failure of a CPU the images are not tried on, not of Grace's.
SELFTEST_CPUS = {"arm64": "neoverse-n2"}


def host_architecture() -> str:
    return platforms.host().debian


def entry(arch: str) -> Path:
    return BINFMT / f"{ENTRY_PREFIX}{ARCHITECTURES[arch]}"


@cache
def qemu_root() -> Path:
    """The pinned qemu-user package, fetched and unpacked into the cache (once), and checked
    once a process: every build step, bootstrap and self-test of another architecture asks."""
    spec = tool_specs.spec()
    tool = spec.tools.get(QEMU_PACKAGE)
    host = host_architecture()
    if tool is None or host not in tool.debs:
        raise UserError(f"data/tools.yaml pins no {host} .deb of {QEMU_PACKAGE}; add one there")
    deb = tool.debs[host]
    root = debfile.tool_root(QEMU_PACKAGE, tool.version, deb.sha256)
    cached = root.with_name(root.name + ".deb")
    debfile.fetch(f"{spec.mirror.rstrip('/')}/{deb.path}", deb.sha256, cached, "data/tools.yaml pins")
    return debfile.unpacked(cached, root, tool.version)


def register_line(arch: str, root: Path) -> str:
    """binfmt_misc's register line for `arch`: the package's own (its magic, mask and flags),
    under the builder's entry name and with the unpacked interpreter."""
    program = ARCHITECTURES[arch]
    conf = root / "usr/share/qemu/binfmt.d" / f"{program}.conf"
    if not conf.is_file():
        raise UserError(f"{QEMU_PACKAGE} in data/tools.yaml has no {conf.name}; pin a package that has")
    fields = conf.read_text().strip().split(":")
    if len(fields) != 8 or fields[2] != "M" or "F" not in fields[7] or not fields[6].startswith("/"):
        raise UserError(f"{conf} is not a binfmt_misc magic entry with the F flag: {conf.read_text()[:120]!r}")
    # The package's interpreter name, inside the unpacked root: Debian's qemu preserves the
    # program's argv[0] (the P flag) when it is called by a name ending in -binfmt-P.
    interpreter = root / fields[6].lstrip("/")
    if not interpreter.resolve().is_file() or not interpreter.resolve().is_relative_to(root.resolve()):
        raise UserError(f"{QEMU_PACKAGE} in data/tools.yaml has no {fields[6]}; pin a package that has")
    fields[1], fields[6] = f"{ENTRY_PREFIX}{program}", str(interpreter)
    return ":".join(fields)


def registered(arch: str, root: Path | None = None) -> bool:
    """Whether the builder's entry for `arch` is enabled (with the interpreter under `root`)."""
    try:
        text = entry(arch).read_text()
    except OSError:
        return False
    found = re.search(r"^interpreter (\S+)$", text, re.MULTILINE)
    inside = found is not None and (root is None or Path(found.group(1)).is_relative_to(root))
    return text.startswith("enabled") and inside


def ensure(arch: str, report: Callable[[str], None] = print) -> None:
    """Nothing to do for the host's own architecture. Otherwise the builder's binfmt entry must
    run the pinned qemu; as root (or through sudo) it is registered, and it says so."""
    if arch not in ARCHITECTURES:
        raise UserError(f"no emulation known for {arch!r}; write one of {', '.join(ARCHITECTURES)}")
    if arch == host_architecture():
        return
    root = qemu_root()
    if registered(arch, root):
        return
    if privilege.root_prefix() is None:
        raise UserError(
            f"{arch} programs cannot run here: registering qemu with binfmt_misc needs root; "
            f"run `python -m builder engine --emulate {arch}` as root (or with passwordless sudo)"
        )
    _register(arch, register_line(arch, root))
    if not registered(arch, root):
        raise UserError(f"registered {entry(arch).name} with binfmt_misc, but the kernel does not list it enabled")
    report(f"registered {arch} emulation: {entry(arch).name} runs the qemu of {root.name} (data/tools.yaml)")


def _register(arch: str, line: str) -> None:
    """Replace the builder's entry (another pinned qemu's) with `line`."""
    if not (BINFMT / "register").exists():  # no systemd here to mount it
        _as_root(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)])
    if entry(arch).exists():
        _as_root(["sh", "-c", f"echo -1 > {entry(arch)}"])
    _as_root(["sh", "-c", 'printf "%s" "$1" > /proc/sys/fs/binfmt_misc/register', "register", line])


def _as_root(command: list[str]) -> None:
    prefixed = privilege.as_root(command)
    if prefixed is None:
        raise UserError(f"{' '.join(command[:2])} needs root")
    done = subprocess.run(prefixed, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise UserError(f"{' '.join(command[:3])} failed: {done.stderr.strip()[-200:]}")


def selftest_environment(arch: str) -> dict[str, str]:
    """What a self-test under emulation runs with: QEMU_CPU, which qemu reads from the program's
    environment, naming the CPU to play (SELFTEST_CPUS)."""
    cpu = SELFTEST_CPUS.get(arch)
    return {"QEMU_CPU": cpu} if cpu else {}
