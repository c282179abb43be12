"""Emulation's binfmt entry: the pinned qemu package's own line, under the builder's name and
with the interpreter inside the unpacked package; refused, one line, where that cannot be."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from builder.engine import bases, emulation
from builder.errors import UserError
from builder.plan.matrix import load_matrix

REPO = Path(__file__).resolve().parents[2]
MAGIC = r"\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00"
MASK = r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff"


def unpacked_qemu(root: Path, flags: str = "OPF", target: str = "../../bin/qemu-aarch64") -> Path:
    """A qemu-user package as Debian 13 lays it out: the program, the -binfmt-P name linking to
    it, and the binfmt.d line."""
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/qemu-aarch64").write_bytes(b"\x7fELF")
    (root / "usr/libexec/qemu-binfmt").mkdir(parents=True)
    (root / "usr/libexec/qemu-binfmt/aarch64-binfmt-P").symlink_to(target)
    (root / "usr/share/qemu/binfmt.d").mkdir(parents=True)
    line = f":qemu-aarch64:M::{MAGIC}:{MASK}:/usr/libexec/qemu-binfmt/aarch64-binfmt-P:{flags}\n"
    (root / "usr/share/qemu/binfmt.d/qemu-aarch64.conf").write_text(line)
    return root


def test_the_entry_is_the_packages_line_under_the_builders_name_and_interpreter(tmp_path: Path) -> None:
    root = unpacked_qemu(tmp_path / "qemu")
    line = emulation.register_line("arm64", root)
    interpreter = root / "usr/libexec/qemu-binfmt/aarch64-binfmt-P"
    assert line == f":torch-images-qemu-aarch64:M::{MAGIC}:{MASK}:{interpreter}:OPF"


def test_a_package_line_without_the_fix_binary_flag_is_refused(tmp_path: Path) -> None:
    # Without F the kernel opens the interpreter in each container, where it is not.
    root = unpacked_qemu(tmp_path / "qemu", flags="OP")
    with pytest.raises(UserError) as refused:
        emulation.register_line("arm64", root)
    assert "is not a binfmt_misc magic entry with the F flag" in refused.value.line()


def test_an_interpreter_that_leads_out_of_the_package_is_refused(tmp_path: Path) -> None:
    root = unpacked_qemu(tmp_path / "qemu", target="/usr/bin/true")
    with pytest.raises(UserError) as refused:
        emulation.register_line("arm64", root)
    assert "has no /usr/libexec/qemu-binfmt/aarch64-binfmt-P" in refused.value.line()


def test_the_entry_counts_as_registered_only_when_enabled_with_the_pinned_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(emulation, "BINFMT", tmp_path)
    root = tmp_path / "qemu-10"
    entry = tmp_path / "torch-images-qemu-aarch64"
    assert not emulation.registered("arm64", root)
    entry.write_text(f"enabled\ninterpreter {root}/usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: POF\n")
    assert emulation.registered("arm64", root)
    assert not emulation.registered("arm64", tmp_path / "qemu-9")  # another pin: registered again
    entry.write_text(f"disabled\ninterpreter {root}/usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: POF\n")
    assert not emulation.registered("arm64", root)


def test_without_root_emulation_is_one_line_saying_how(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emulation, "BINFMT", tmp_path)
    monkeypatch.setattr(emulation, "host_architecture", lambda: "amd64")
    monkeypatch.setattr(emulation, "qemu_root", lambda: unpacked_qemu(tmp_path / "qemu"))
    monkeypatch.setattr(emulation.privilege, "root_prefix", lambda: None)
    with pytest.raises(UserError) as refused:
        emulation.ensure("arm64")
    assert refused.value.line() == (
        "arm64 programs cannot run here: registering qemu with binfmt_misc needs root; "
        "run `python -m builder engine --emulate arm64` as root (or with passwordless sudo)"
    )


def _bootstrap_failed(stderr: str) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(["mmdebstrap"], 1, stdout="", stderr=stderr)


def test_a_failed_bootstrap_says_mmdebstraps_reason_not_its_closing_line() -> None:
    # mmdebstrap 1.3.5's own words on an x86 machine that never had qemu-user-static.
    reason = "E: setup failed: E: cannot find /usr/bin/qemu-aarch64-static"
    said = f"I: automatically chosen format: tar\n{reason}\nE: mmdebstrap failed to run\n"
    assert bases.failure_reason(_bootstrap_failed(said)) == reason


def test_a_bootstrap_reason_reaches_the_terminal_escaped_and_without_error_lines_its_last() -> None:
    assert bases.failure_reason(_bootstrap_failed("E: no \x1b]0;title\x07 such\nE: mmdebstrap failed to run")) == (
        "E: no \\x1b]0;title\\x07 such"
    )
    assert bases.failure_reason(_bootstrap_failed("W: something\nKilled\n")) == "Killed"
    assert bases.failure_reason(_bootstrap_failed("")) == "no output"


def test_an_arm64_bootstrap_on_x86_skips_mmdebstraps_own_qemu_check_and_a_native_one_adds_nothing() -> None:
    """mmdebstrap's check wants the host's arch-test and /usr/bin/qemu-aarch64-static; the builder
    checks its own binfmt entry instead (emulation.ensure), so neither is needed."""
    base = load_matrix(REPO / "matrix.yaml").cell("2.13.0-cpu-bookworm-runtime").base
    foreign = "arm64" if emulation.host_architecture() != "arm64" else "amd64"
    assert bases.foreign_options(dataclasses.replace(base, arch=foreign)) == [
        f"--architectures={foreign}", "--skip=check/qemu",
    ]  # fmt: skip
    assert bases.foreign_options(dataclasses.replace(base, arch=emulation.host_architecture())) == []
