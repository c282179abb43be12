"""How the builder runs a self-test container: under the engine's init, and, for another
architecture's image, told it is emulated and with qemu playing the CPU the images are for."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from builder.assemble import smoke
from builder.engine import emulation

REPORT = {"status": "pass", "checks": [], "failed": []}


class Container:
    def wait(self) -> dict[str, int]:
        return {"StatusCode": 0}

    def logs(self, stdout: bool, stderr: bool) -> bytes:
        return json.dumps(REPORT).encode() if stdout else b"table"

    def remove(self, force: bool) -> None:
        pass


class Engine:
    def __init__(self, architecture: str) -> None:
        self.runs: list[dict[str, Any]] = []
        image = SimpleNamespace(id="sha256:" + "1" * 64, attrs={"Architecture": architecture})
        self.images = SimpleNamespace(get=lambda reference: image)
        self.containers = SimpleNamespace(run=self._run)

    def _run(self, image: str, command: list[str], **options: Any) -> Container:
        self.runs.append({"command": command, **options})
        return Container()

    def info(self) -> dict[str, object]:
        return {"Runtimes": {"runc": {}}}


@pytest.fixture
def on_x86(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_IMAGES_CACHE", str(tmp_path))
    monkeypatch.setattr(emulation, "host_architecture", lambda: "amd64")
    monkeypatch.setattr(emulation, "ensure", lambda arch, report=print: None)
    monkeypatch.setattr(smoke.ids, "config_digest", lambda engine, reference: "sha256:" + "2" * 64)


@pytest.mark.usefixtures("on_x86")
def test_an_arm64_image_on_x86_is_self_tested_emulated_as_the_cpu_its_images_are_for() -> None:
    engine = Engine("arm64")
    result = smoke.run(engine, "torch:arm64")  # type: ignore[arg-type]
    [run] = engine.runs
    assert result.status == "pass" and "--emulated" in run["command"]
    assert run["environment"] == {"QEMU_CPU": "neoverse-n2"} and run["init"] is True


@pytest.mark.usefixtures("on_x86")
def test_the_hosts_own_architecture_runs_natively_under_init() -> None:
    engine = Engine("amd64")
    smoke.run(engine, "torch:amd64")  # type: ignore[arg-type]
    [run] = engine.runs
    assert "--emulated" not in run["command"] and run["environment"] == {} and run["init"] is True
