"""Run the in-image self-test on a built image and keep its report, keyed by image ID.

The report is the publish gate: `publish` pushes an image only if a passing report exists
for that exact image ID. The container runs without a network (the self-test needs none)
and with every GPU when the engine has the NVIDIA runtime.
"""

from __future__ import annotations

import ast
import functools
import json
import re
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
    if "--only" in (extra or []):  # a partial run never takes the place of the full report the gate reads
        path = path.with_name(path.stem + ".partial.json")
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
    """The stored report for exactly this image ID, if it passed (see `why_not_a_pass`)."""
    path = report_path(image_id)
    if not path.exists():
        return None
    with path.open("rb") as handle:
        data = handle.read(MAX_REPORT_BYTES + 1)
    try:
        report = json.loads(data) if len(data) <= MAX_REPORT_BYTES else None
    except (ValueError, UnicodeDecodeError):
        report = None  # a damaged cache entry: the image is tested again
    return report if why_not_a_pass(report, image_id) is None else None


MAX_REPORT_BYTES = 16 << 20  # a report is a few kilobytes (a GPU report with a profile, a few hundred)
STATUSES = frozenset({"pass", "skip", "warn", "fail"})
DEVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._()/+:@-]{0,119}")


@functools.cache
def expected_checks() -> tuple[str, ...]:
    """The checks the images' self-test runs: the names in image/selftest.py's CHECKS table, read
    without importing it (it needs torch)."""
    tree = ast.parse(paths.SELFTEST.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CHECKS" for t in node.targets):
            assert isinstance(node.value, ast.List)
            return tuple(ast.literal_eval(entry.elts[0]) for entry in node.value.elts if isinstance(entry, ast.Tuple))
    raise AssertionError(f"{paths.SELFTEST} has no CHECKS table")


def why_not_a_pass(report: object, image_id: str) -> str | None:
    """None when `report` is a passing self-test of exactly this image, else why not.

    A report arrives from a cache or a registry: it is a pass only when it names this image ID,
    says pass, lists every check the images' self-test runs (each once, none failed: a check
    that does not apply says skip), and names its device in plain text."""
    if not isinstance(report, dict):
        return "the report is not a JSON object"
    if report.get("image_id") != image_id:
        return f"the report is for another image ({str(report.get('image_id'))[7:19] or 'none named'})"
    if report.get("status") != "pass":
        return "the report's status is not pass"
    checks = report.get("checks")
    if not isinstance(checks, list) or not all(
        isinstance(c, dict) and isinstance(c.get("check"), str) and c.get("status") in STATUSES for c in checks
    ):
        return "the report's checks are not a list of {check, status}"
    names = [c["check"] for c in checks]
    missing = [name for name in expected_checks() if name not in names]
    if missing:
        return f"the report lacks checks the self-test runs: {', '.join(missing)}"
    if len(set(names)) != len(names):
        return "the report lists a check twice"
    failed = [c["check"] for c in checks if c["status"] == "fail"]
    if failed or report.get("failed"):
        return f"the report says pass, yet checks failed: {', '.join(failed) or 'see failed'}"
    device = report.get("device")
    if not isinstance(device, str) or not DEVICE.fullmatch(device):
        return "the report's device is not a plain name (letters, digits, spaces and . _ ( ) / + : @ -)"
    return None
