"""Whether a self-test report is a pass of an image, on a CPU or on a GPU: the judging that the
build's gate, publish's gates and `verify` share, apart from the code that runs containers
(assemble/smoke.py). It reads the report and the self-test's own tables (image/selftest.py's
CHECKS and GPU_CHECKS, image/gpu_peaks.json), never an engine or a registry."""

from __future__ import annotations

import ast
import functools
import math
import re
from typing import Any

from builder import jsonread, paths

MAX_REPORT_BYTES = 16 << 20  # a report is a few kilobytes (a GPU report with a profile, a few hundred)
STATUSES = frozenset({"pass", "skip", "warn", "fail"})
DEVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._()/+:@-]{0,119}")


def _selftest_table(name: str) -> ast.List:
    tree = ast.parse(paths.SELFTEST.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            assert isinstance(node.value, ast.List)
            return node.value
    raise AssertionError(f"{paths.SELFTEST} has no {name} table")


@functools.cache
def expected_checks() -> tuple[str, ...]:
    """The checks the images' self-test runs: the names in image/selftest.py's CHECKS table, read
    without importing it (it needs torch)."""
    table = _selftest_table("CHECKS")
    return tuple(ast.literal_eval(entry.elts[0]) for entry in table.elts if isinstance(entry, ast.Tuple))


@functools.cache
def _gpu_peaks() -> tuple[dict[str, Any], ...]:
    """image/gpu_peaks.json's entries (the data the self-test gates speeds by)."""
    document = jsonread.loads((paths.IMAGE / "gpu_peaks.json").read_bytes(), "image/gpu_peaks.json")
    return tuple(entry for entry in document.get("gpus", []) if isinstance(entry, dict))


def known_gpu(name: str) -> dict[str, Any] | None:
    """The datasheet entry the self-test picks for a device name (a `match` substring), if any."""
    return next(
        (e for e in _gpu_peaks() if any(str(alias).lower() in name.lower() for alias in e.get("match", []))), None
    )


# A figure past these is not a measurement: a fraction of the datasheet peak far above it, a
# speed-up of thousands, a compile of days.
FIGURE_LIMITS = {
    "matmul_bf16_fraction_of_peak": 1.5,
    "sdpa_flash_vs_math": 1000.0,
    "sdpa_cudnn_vs_math": 1000.0,
    "compile_s": 86400.0,
}


def _figure_problem(figures: dict[str, Any]) -> str | None:
    for key, limit in FIGURE_LIMITS.items():
        value = figures.get(key)
        if value is not None and not (math.isfinite(value) and 0 < value <= limit):
            return f"its figure {key} = {value!r} is not a measurement (a finite number in (0, {limit:g}])"
    return None


@functools.cache
def gpu_checks() -> tuple[str, ...]:
    """The checks a GPU report must pass on the device (image/selftest.py's GPU_CHECKS)."""
    return tuple(ast.literal_eval(_selftest_table("GPU_CHECKS")))


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


CAPABILITY = re.compile(r"[0-9]{1,2}\.[0-9]{1,2}")
DRIVER = re.compile(r"[0-9]{2,4}(\.[0-9]{1,4}){1,3}")


def report_kind(report: dict[str, Any]) -> str:
    """ "gpu" for a report that ran on a CUDA device, else "cpu" (what the report says of itself;
    why_not_a_gpu_pass checks that it holds)."""
    accelerator = report.get("accelerator")
    return "gpu" if isinstance(accelerator, dict) and accelerator.get("kind") == "cuda" else "cpu"


def why_not_a_gpu_pass(report: object, image_id: str) -> str | None:
    """None when `report` is a passing self-test of exactly this image on a CUDA device, else why
    not: a pass (why_not_a_pass), on a device it names with its compute capability and driver
    version, with every GPU check passed on it (a skip is not a pass), and its speed figures where
    gpu_peaks.json knows the device."""
    why = why_not_a_pass(report, image_id)
    if why is not None:
        return why
    assert isinstance(report, dict)
    accelerator = report.get("accelerator")
    if not isinstance(accelerator, dict) or accelerator.get("kind") != "cuda":
        return f"the report ran on {report.get('device')}, not on a CUDA device"
    name, capability, driver = accelerator.get("name"), accelerator.get("capability"), accelerator.get("driver")
    if not isinstance(name, str) or not DEVICE.fullmatch(name) or name != report.get("device"):
        return "the report names no GPU model (accelerator.name, as its device)"
    if not isinstance(capability, str) or not CAPABILITY.fullmatch(capability):
        return "the report names no compute capability (accelerator.capability, such as 9.0)"
    if not isinstance(driver, str) or not DRIVER.fullmatch(driver):
        return "the report names no driver version (accelerator.driver, such as 550.54.15)"
    statuses = {c["check"]: c["status"] for c in report["checks"]}
    not_passed = [f"{name} {statuses[name]}" for name in gpu_checks() if statuses.get(name) != "pass"]
    if not_passed:
        return f"GPU checks did not pass on the device: {', '.join(not_passed)}"
    if accelerator.get("gated") is not True and accelerator.get("gated") is not False:
        return "the report does not say whether its speed gates applied (accelerator.gated)"
    figures = gpu_figures(report)
    problem = _figure_problem(figures)
    if problem is not None:
        return problem
    entry = known_gpu(name)
    if entry is not None and accelerator["gated"] is not True:
        return f"the report says its speed gates did not apply, but gpu_peaks.json knows {name} ({entry.get('model')})"
    if accelerator["gated"]:
        fraction = figures.get("matmul_bf16_fraction_of_peak")
        if fraction is None:
            return "the report says its speed gates applied but carries no fraction of peak"
        floor = ((entry or {}).get("thresholds") or {}).get("matmul_bf16_fraction_min")
        if isinstance(floor, int | float) and fraction < floor:
            return f"its bf16 matmul ran at {fraction:.2f} of peak, under the gate's {floor}"
    return None


def gpu_figures(report: dict[str, Any]) -> dict[str, Any]:
    """What the published-tags table shows of a GPU report: the device, and its gated figures
    (bf16 matmul as a fraction of peak, SDPA flash and cuDNN against math, compile time)."""
    found_accelerator = report.get("accelerator")
    accelerator: dict[str, Any] = found_accelerator if isinstance(found_accelerator, dict) else {}
    metrics = {c.get("check"): c.get("metrics") for c in report.get("checks", []) if isinstance(c, dict)}

    def figure(check: str, key: str) -> float | None:
        found = metrics.get(check)
        value = found.get(key) if isinstance(found, dict) else None
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    return {
        "device": report.get("device"),
        "capability": accelerator.get("capability"),
        "driver": accelerator.get("driver"),
        "gated": accelerator.get("gated") is True,
        "matmul_bf16_fraction_of_peak": figure("throughput", "matmul_bf16_fraction_of_peak"),
        "sdpa_flash_vs_math": figure("sdpa", "flash_attention_speedup_vs_math_4096"),
        "sdpa_cudnn_vs_math": figure("sdpa", "cudnn_attention_speedup_vs_math_4096"),
        "compile_s": figure("torch.compile", "compile_s"),
    }
