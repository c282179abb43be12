"""Host commands as root (builder/engine/privilege.py): directly, or through passwordless sudo."""

from __future__ import annotations

import subprocess

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

    def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        environment = kwargs.get("env") or {}
        assert "SOURCE_DATE_EPOCH=42" in command or environment.get("SOURCE_DATE_EPOCH") == "42"  # type: ignore[union-attr]
        ran.append(command)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", run)
    bases.run_bootstrap_tool(["mmdebstrap", f"--mode={bases.mode_for_bootstrap()}", "bookworm"], 42)
    assert ran and ran[0][: len(prefix)] == list(prefix)
