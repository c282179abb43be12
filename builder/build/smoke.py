"""Run the in-image self-test on a built image and keep its report, keyed by image ID.

The report is the publish gate: `publish` pushes an image only if a passing report exists
for that exact image ID. The container runs without a network (the self-test needs none)
and with every GPU when the engine has the NVIDIA runtime.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.types import DeviceRequest

from builder import paths
from builder.engine import emulation
from builder.errors import UserError

SELFTEST_COMMAND = ["torch-selftest", "--json", "-"]


@dataclass
class SmokeResult:
    image_id: str
    status: str  # pass | fail
    report: dict[str, Any]
    path: Path
    seconds: float

    @property
    def summary(self) -> str:
        checks = self.report.get("checks", [])
        failed = [f"{c['check']}: {c['message']}" for c in checks if c["status"] == "fail"]
        passed = sum(1 for c in checks if c["status"] == "pass")
        return f"{passed}/{len(checks)} checks passed" + (f"; {'; '.join(failed)}" if failed else "")


def report_path(image_id: str) -> Path:
    """Reports live in the builder's cache, keyed by image ID (the publish gate reads them there)."""
    return paths.cache_dir("reports") / f"{image_id.replace(':', '-')}.json"


def has_nvidia_runtime(engine: docker.DockerClient) -> bool:
    return "nvidia" in (engine.info().get("Runtimes") or {})


def run(
    engine: docker.DockerClient, reference: str, gpus: bool | None = None, extra: list[str] | None = None
) -> SmokeResult:
    """Run the self-test in a fresh container of the image and store its report."""
    try:
        image = engine.images.get(reference)
    except docker.errors.ImageNotFound:
        raise UserError(
            f"no image {reference} in the engine; build it first (`python -m builder build CELL`)"
        ) from None
    architecture = image.attrs.get("Architecture", "")
    if architecture in emulation.ARCHITECTURES:  # an arm64 image on an x86 host runs under qemu
        emulation.ensure(architecture)
    use_gpus = has_nvidia_runtime(engine) if gpus is None else gpus
    started = time.monotonic()
    container = engine.containers.run(
        image.id,
        [*SELFTEST_COMMAND, *(extra or [])],
        detach=True,
        network_mode="none",
        shm_size="1g",
        device_requests=[DeviceRequest(count=-1, capabilities=[["gpu"]])] if use_gpus else None,
    )
    try:
        exit_code = container.wait()["StatusCode"]
        stdout = container.logs(stdout=True, stderr=False).decode(errors="replace")
        stderr = container.logs(stdout=False, stderr=True).decode(errors="replace")
    finally:
        container.remove(force=True)
    report = _parse(stdout, stderr, exit_code)
    report["image_id"], report["reference"], report["table"] = image.id, reference, stderr
    path = report_path(image.id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    status = "pass" if exit_code == 0 and report.get("status") == "pass" else "fail"
    return SmokeResult(image.id, status, report, path, time.monotonic() - started)


def _parse(stdout: str, stderr: str, exit_code: int) -> dict[str, Any]:
    start = stdout.find("{")
    try:
        parsed: dict[str, Any] = json.loads(stdout[start:]) if start >= 0 else {}
        return parsed
    except json.JSONDecodeError:
        tail = (stderr or stdout).strip().splitlines()[-1:] or ["no output"]
        return {
            "status": "fail",
            "failed": ["selftest"],
            "checks": [],
            "error": f"exit {exit_code}: {tail[0]}",
        }


def passing_report(image_id: str) -> dict[str, Any] | None:
    """The stored report for exactly this image ID, if it passed."""
    path = report_path(image_id)
    if not path.exists():
        return None
    report: dict[str, Any] = json.loads(path.read_text())
    if report.get("image_id") == image_id and report.get("status") == "pass":
        return report
    return None
