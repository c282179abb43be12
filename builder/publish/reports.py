"""Self-test reports as the registry holds them: several side by side on one digest (the build
machine's, and GPU reports from as many devices as ran it), none replacing another, and the
gate that reads them.

A report's artifact carries its kind ("cpu" or "gpu") and device as annotations, for listing;
the gate never trusts those: it reads each report's own body against the image ID.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from builder import verdict
from builder.publish import tags

SELFTEST_TYPE = "application/vnd.torch-images.selftest.v1+json"
KIND_ANNOTATION = "io.torch-images.selftest.kind"
DEVICE_ANNOTATION = "io.torch-images.selftest.device"
# Reports a digest may carry before the gate stops reading: one per machine that ran it.
MAX_REPORTS = 32


@dataclass(frozen=True)
class Gated:
    """The reports that let an image's tags move: a passing self-test, and for a CUDA cell whose
    gate is required, a passing GPU self-test (the same report when the build ran on a GPU)."""

    report: dict[str, Any]
    gpu_report: dict[str, Any] | None


class GpuMissing(str):
    """gate's refusal when the one thing missing is a GPU pass: a machine without a GPU refuses
    every CUDA cell for this reason, and publish says it once for all of them."""


def gate(reports: list[Any], image_id: str, gpu_gate: str) -> Gated | str:
    """The reports that pass for exactly `image_id`, or why the image may not be tagged."""
    passing = [r for r in reports if verdict.why_not_a_pass(r, image_id) is None]
    if not passing:
        reasons = sorted({verdict.why_not_a_pass(r, image_id) or "" for r in reports}) or ["none attached"]
        return f"no passing self-test report for image {image_id[7:19]} ({'; '.join(reasons)})"
    failed_on_gpu = [
        r for r in reports
        if isinstance(r, dict) and r.get("image_id") == image_id and verdict.report_kind(r) == "gpu"
        and verdict.why_not_a_gpu_pass(r, image_id) is not None
    ]  # fmt: skip
    # A pass on another device never outvotes a failure; and an optional gate lets an untested
    # image go, never a failed one.
    if failed_on_gpu and gpu_gate != "none":
        devices = sorted({str(r.get("device"))[:60] for r in failed_on_gpu})
        reasons = sorted({verdict.why_not_a_gpu_pass(r, image_id) or "" for r in failed_on_gpu})
        return (
            f"its GPU self-test failed on {', '.join(devices)} ({'; '.join(reasons)}); a pass elsewhere does not "
            "outvote it: fix the image, or, if that device was at fault, delete that report from the registry"
        )
    on_gpu = [r for r in passing if verdict.why_not_a_gpu_pass(r, image_id) is None]
    build_report = next((r for r in passing if verdict.report_kind(r) == "cpu"), passing[0])
    if gpu_gate == "required" and not on_gpu:
        reasons = sorted({verdict.why_not_a_gpu_pass(r, image_id) or "" for r in reports})
        return GpuMissing(
            f"no passing GPU self-test for image {image_id[7:19]}, which its CUDA tags require "
            f"({'; '.join(reasons)}); run the workflow's GPU stage (`publish gpu-test`) on a GPU runner, "
            "or list the cell under ci.gpu_optional in the matrix"
        )
    return Gated(build_report, on_gpu[0] if on_gpu and gpu_gate != "none" else None)


def artifact_annotations(report: dict[str, Any], build_id: str, tag: str) -> dict[str, str]:
    kind = verdict.report_kind(report)
    device = report.get("device")
    return {
        "org.opencontainers.image.ref.name": tag,
        "io.torch-images.build-id": build_id,
        KIND_ANNOTATION: kind,
        DEVICE_ANNOTATION: device if isinstance(device, str) and verdict.DEVICE.fullmatch(device) else "unknown",
    }


def artifact_tag(target: str, report: dict[str, Any]) -> str:
    """`<tag>.selftest` for the build machine's report, `<tag>.selftest-gpu-<model>` for a GPU's,
    so that reports from several devices keep tags of their own."""
    if verdict.report_kind(report) == "cpu":
        return tags.fitted(f"{target}.selftest")
    model = re.sub(r"[^a-z0-9]+", "-", str(report.get("device", "")).lower()).strip("-") or "unknown"
    return tags.fitted(f"{target}.selftest-gpu-{model}")


def document_bytes(report: dict[str, Any]) -> bytes:
    """The bytes a report is attached as (the table printed on the terminal left out): what a
    signed test result names by sha256."""
    return json.dumps({k: v for k, v in report.items() if k != "table"}, sort_keys=True).encode()


def record_entry(gpu_gate: str, gpu_report: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a publish record says of the GPU gate: the device and figures it passed on, `not
    tested` for an optional gate without a report, nothing for a CPU image."""
    if gpu_gate == "none":
        return None
    if gpu_report is None:
        return {"status": "not tested", "gate": gpu_gate}
    return {"status": "pass", "gate": gpu_gate, **verdict.gpu_figures(gpu_report)}
