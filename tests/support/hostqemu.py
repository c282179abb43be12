"""The host's own qemu out of sight, for the emulation tests: they must pass on a machine that never
had Debian's qemu-user-static, whose mmdebstrap finds no /usr/bin/qemu-aarch64-static and no
arch-test, and whose kernel has no binfmt entry but the builder's.

On a machine that has them, a bootstrap runs in a mount namespace of its own where an overlay on
/usr/bin whites those programs out, and the host's qemu binfmt entries are disabled while the tests
run (enabled again after). On a machine that has none, nothing is changed, and `hidden` says so."""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.engine import bases, emulation

HOST_PROGRAMS = ("qemu-aarch64-static", "qemu-aarch64", "arch-test")


def host_programs() -> list[Path]:
    return [Path("/usr/bin") / name for name in HOST_PROGRAMS if (Path("/usr/bin") / name).exists()]


def host_entries() -> list[Path]:
    """The kernel's enabled binfmt entries for qemu that are not the builder's."""
    if not emulation.BINFMT.is_dir():
        return []
    return [
        entry
        for entry in emulation.BINFMT.iterdir()
        if entry.name.startswith("qemu-") and entry.read_text().startswith("enabled")
    ]


def _without_programs(command: list[str], whiteouts: Path) -> list[str]:
    """`command` in a mount namespace of its own whose /usr/bin has the host's qemu whited out."""
    work = whiteouts.with_name("work")
    mount = f"mount -t overlay overlay -o lowerdir=/usr/bin,upperdir={whiteouts},workdir={work} /usr/bin"
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'{mount} && exec "$@"', "sh", *command]


@contextlib.contextmanager
def hidden() -> Iterator[list[str]]:
    """While open, no host qemu is seen by a bootstrap or by the kernel; yields what was hidden."""
    programs, entries = host_programs(), host_entries()
    with contextlib.ExitStack() as stack:
        if programs:
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="torch-images-noqemu-")))
            (scratch / "upper").mkdir()
            (scratch / "work").mkdir()
            for program in programs:  # an overlay whiteout: a character device 0,0 of the same name
                subprocess.run(["mknod", str(scratch / "upper" / program.name), "c", "0", "0"], check=True)
            patch = stack.enter_context(pytest.MonkeyPatch.context())
            original = bases.run_bootstrap_tool
            patch.setattr(
                bases,
                "run_bootstrap_tool",
                lambda command, epoch: original(_without_programs(command, scratch / "upper"), epoch),
            )
        for entry in entries:
            entry.write_text("0")
            stack.callback(entry.write_text, "1")
        yield [*(str(p) for p in programs), *(str(e) for e in entries)]


def describe(what: list[str]) -> str:
    return "hid " + " ".join(shlex.quote(w) for w in what) if what else "no host qemu here to hide"
