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

from builder import jsonread, paths
from builder.engine import emulation, ids
from builder.errors import UserError
from builder.verdict import MAX_REPORT_BYTES, why_not_a_pass

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
        warned = [c["check"] for c in checks if c["status"] == "warn"]
        passed = sum(1 for c in checks if c["status"] == "pass")
        # A warning does not fail the gate, but says something the image's users should know.
        warnings = f", warnings from {', '.join(warned)} (in the report)" if warned else ""
        return f"{passed}/{len(checks)} checks passed{warnings}" + (f"; {'; '.join(failed)}" if failed else "")


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
    emulated = architecture in emulation.ARCHITECTURES and architecture != emulation.host_architecture()
    environment: dict[str, str] = {}
    if emulated:  # an arm64 image on an x86 host runs under qemu: the self-test is told so
        emulation.ensure(architecture)
        extra = ["--emulated", *(extra or [])]
        environment = emulation.selftest_environment(architecture)
    use_gpus = has_nvidia_runtime(engine) if gpus is None else gpus
    started = time.monotonic()
    exit_code, stdout, stderr = run_selftest(engine, image.id, extra or [], use_gpus, environment)
    report = parse_report(stdout, stderr, exit_code)
    image_id = ids.config_digest(engine, reference)
    report["image_id"], report["reference"], report["table"] = image_id, reference, stderr
    path = report_path(image_id)
    if "--only" in (extra or []):  # a partial run never takes the place of the full report the gate reads
        path = path.with_name(path.stem + ".partial.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    status = "pass" if exit_code == 0 and report.get("status") == "pass" else "fail"
    return SmokeResult(image_id, status, report, path, time.monotonic() - started)


def run_selftest(
    engine: docker.DockerClient, image_id: str, extra: list[str], gpus: bool, environment: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """The self-test in a fresh container of the image, as every caller runs it: no network,
    1 GiB of /dev/shm, every GPU where asked. Returns its exit status, stdout and stderr.

    The engine's init (tini) is PID 1, the self-test its child: under qemu a crashing process
    dies by sending itself the signal, which the kernel drops for a namespace's PID 1, so a
    self-test that crashed there as PID 1 waited forever instead of exiting (measured: an arm64
    CUDA image's segfault hung its sweep)."""
    container = engine.containers.run(
        image_id,
        [*SELFTEST_COMMAND, *extra],
        detach=True,
        init=True,
        network_mode="none",
        shm_size="1g",
        environment=environment or {},
        device_requests=[DeviceRequest(count=-1, capabilities=[["gpu"]])] if gpus else None,
    )
    try:
        exit_code = container.wait()["StatusCode"]
        stdout = container.logs(stdout=True, stderr=False).decode(errors="replace")
        stderr = container.logs(stdout=False, stderr=True).decode(errors="replace")
    finally:
        container.remove(force=True)
    return int(exit_code), stdout, stderr


def parse_report(stdout: str, stderr: str, exit_code: int) -> dict[str, Any]:
    """The report the self-test printed, or a failing stand-in naming its exit."""
    start = stdout.find("{")
    try:
        parsed: dict[str, Any] = jsonread.loads(stdout[start:], "the self-test's report") if start >= 0 else {}
        return parsed
    except UserError:
        tail = (stderr or stdout).strip().splitlines()[-1:] or ["no output"]
        return {
            "status": "fail",
            "failed": ["selftest"],
            "checks": [],
            "error": f"exit {exit_code}: {tail[0]}",
        }


def passing_report(image_id: str) -> dict[str, Any] | None:
    """The stored report for exactly this image ID, if it passed (see `why_not_a_pass`)."""
    path = report_path(image_id)
    if not path.exists():
        return None
    with path.open("rb") as handle:
        data = handle.read(MAX_REPORT_BYTES + 1)
    try:
        report = jsonread.loads(data, str(path)) if len(data) <= MAX_REPORT_BYTES else None
    except UserError:
        report = None  # a damaged cache entry: the image is tested again
    return report if why_not_a_pass(report, image_id) is None else None
