"""Made-up self-test reports for tests on a machine without a GPU."""

from __future__ import annotations

import json
from typing import Any


def dressed_as_gpu_pass(report: dict[str, Any]) -> dict[str, Any]:
    """A real CPU report of an image dressed as a pass on a GPU nobody ran it on (every GPU check
    pass, the speed gates said to have held): what an attacker with push rights could attach, and
    the shape a GPU stage's report has, for tests that handle one without a GPU."""
    forged: dict[str, Any] = json.loads(json.dumps(report))
    forged["device"] = "NVIDIA H200"
    forged["accelerator"] = {"kind": "cuda", "name": "NVIDIA H200", "count": 1, "capability": "9.0",
                             "driver": "570.124.06", "driver_cuda": "12.8", "peaks": "H200", "gated": True}  # fmt: skip
    for check in forged["checks"]:
        check["status"] = "skip" if check["check"] == "tensorrt-llm" else "pass"
        if check["check"] == "throughput":
            check["metrics"] = {"matmul_bfloat16_tflops": 700.0, "matmul_bf16_fraction_of_peak": 0.71}
    return forged
