"""Host commands as root (builder/engine/privilege.py): directly, or through passwordless sudo."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from builder.engine import bases, privilege


@pytest.mark.parametrize(("prefix", "expected"), [((), []), (("sudo", "-n"), ["sudo", "-n"])])
def test_the_environment_reaches_the_command_as_root_and_through_sudo(
    monkeypatch: pytest.MonkeyPatch, prefix: tuple[str, ...], expected: list[str]
) -> None:
    monkeypatch.setattr(privilege, "root_prefix", lambda: prefix)
    assert privilege.as_root(["mmdebstrap", "x"], {"SOURCE_DATE_EPOCH": "1733097600"}) == [
        *expected, "env", "SOURCE_DATE_EPOCH=1733097600", "mmdebstrap", "x",
    ]  # fmt: skip


def test_without_root_or_sudo_there_is_no_root_command_and_bootstraps_use_unshare_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(privilege, "root_prefix", lambda: None)
    assert privilege.as_root(["apt-get", "update"]) is None
    assert bases.mode_for_bootstrap() == "unshare"


@pytest.mark.parametrize("prefix", [(), ("sudo", "-n")])
def test_a_root_mode_bootstrap_gets_its_source_date_epoch(
    monkeypatch: pytest.MonkeyPatch, prefix: tuple[str, ...]
) -> None:
    """A bootstrap without SOURCE_DATE_EPOCH stamps today's times and makes another base (and
    another image ID): it must reach mmdebstrap as root and through sudo alike."""
    monkeypatch.setattr(privilege, "root_prefix", lambda: prefix)
    ran: list[list[str]] = []

    def run(command: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        assert "SOURCE_DATE_EPOCH=42" in command or (env or {}).get("SOURCE_DATE_EPOCH") == "42"
        ran.append(command)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(bases, "run_to_its_end", run)
    bases.run_bootstrap_tool(["mmdebstrap", f"--mode={bases.mode_for_bootstrap()}", "bookworm"], 42)
    assert ran and ran[0][: len(prefix)] == list(prefix)


def test_an_interrupted_bootstrap_stops_its_whole_process_group_and_lets_it_clean_up(tmp_path: Path) -> None:
    """Issue 58: SIGTERM (or Ctrl-C) while the bootstrap tool runs. subprocess.run killed only the
    first process, and mmdebstrap's own child ran on and left its half-made root filesystem in
    /tmp; the whole group is now asked to stop, and its clean-up runs."""
    script = 'trap "touch cleaned; exit 143" TERM; sleep 60 & echo $! > child; wait'
    started = time.monotonic()

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            bases.run_to_its_end(["sh", "-c", f"cd {tmp_path} && {script}"])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert (tmp_path / "cleaned").exists(), "the tool's own clean-up did not run"
    child = int((tmp_path / "child").read_text())
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]
    assert time.monotonic() - started < 30
