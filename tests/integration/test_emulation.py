"""arm64 under emulation on an x86 host: a base bootstrapped for arm64 runs arm64 programs and
says so in its config. Opt-in (`-m emulation`): the bootstrap runs dpkg under qemu (minutes)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import docker
import pytest

from builder.engine import bases, emulation
from builder.plan.matrix import load_matrix

# arm64 under qemu: a base bootstrap, a 20-minute build, a self-test of about 8 minutes.
# As on a machine that never had Debian's qemu-user-static (the builder needs none of it).
pytestmark = [
    pytest.mark.integration,
    pytest.mark.emulation,
    pytest.mark.timeout(3600),
    pytest.mark.usefixtures("without_host_qemu"),
]

REPO = Path(__file__).resolve().parents[2]


def test_an_arm64_base_bootstraps_under_emulation_and_its_config_says_arm64(client: docker.DockerClient) -> None:
    if emulation.host_architecture() == "arm64":
        pytest.skip("this host is arm64: nothing is emulated")
    grid = load_matrix(REPO / "matrix.yaml")
    bookworm = next(c.base for c in grid.cells if c.base.name == "bookworm")
    arm64 = dataclasses.replace(bookworm, name="bookworm-test", arch="arm64")
    said: list[str] = []
    image_id = bases.bootstrap(client, arm64, grid.spec.source_date_epoch, said.append)
    assert emulation.registered("arm64", emulation.qemu_root())  # the qemu data/tools.yaml pins
    image = client.images.get(image_id)
    assert (image.attrs["Architecture"], image.attrs.get("Variant"), image.attrs["Os"]) == ("arm64", "v8", "linux")
    assert arm64.local_tag == "torch-images/base:bookworm-test-arm64" and arm64.local_tag in image.tags
    script = "uname -m; dpkg --print-architecture; od -An -tx1 -j18 -N2 /bin/sh"  # ELF e_machine of sh
    output = client.containers.run(image_id, ["sh", "-c", script], remove=True, network_mode="none").decode().split()
    assert output == ["aarch64", "arm64", "b7", "00"]  # EM_AARCH64 (183): an arm64 program ran


def test_the_engine_command_registers_emulation_for_ci_machines_and_says_so() -> None:
    if emulation.host_architecture() == "arm64":
        pytest.skip("this host is arm64: nothing is emulated")
    if emulation.entry("arm64").exists():  # unregistered first: the command must register it
        emulation.entry("arm64").write_text("-1")
    result = subprocess.run(
        [sys.executable, "-m", "builder", "engine", "--emulate", "arm64"], capture_output=True, text=True, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stderr.split())  # the console wraps long lines
    assert "registered arm64 emulation: torch-images-qemu-aarch64 runs the qemu of qemu-user-" in said
    assert "arm64 programs run here (emulated)" in said
    assert emulation.registered("arm64", emulation.qemu_root())
