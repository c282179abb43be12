"""Runs inside an image (torch and the standard library only): breaks what each self-test
gate looks at, one at a time, and prints what the gate said, as JSON {case: [status, message]}.
A gate that still passes with its subject broken is a check that cannot fail.

Usage: python selftest_sabotage.py [DIRECTORY OF selftest.py]
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else "/opt/torch-images")
import selftest
import torch
import torch._inductor.cpu_vec_isa as vec_isa

ARGS = argparse.Namespace(
    cpu=True,
    peaks=Path("/nonexistent"),
    spec=Path("/nonexistent"),
    quick=True,
    verbose=False,
    emulated=False,
    check_timeout=600,
)


def _off_by(amount: float, dtype: torch.dtype, forward: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def wrong(self: Any, x: torch.Tensor, *rest: Any) -> torch.Tensor:
        out = forward(self, x, *rest)
        return out + amount if x.dtype == dtype else out

    return wrong


def _wrong_svd(svd: Callable[..., Any]) -> Callable[..., Any]:
    def wrong(a: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        u, s, vh = svd(a, *args, **kwargs)
        return u, s * 1.01, vh

    return wrong


def _wrong_compile(fn: Callable[..., torch.Tensor], **_: Any) -> Callable[..., torch.Tensor]:
    return lambda *args: fn(*args) + 1e-2


def _wrong_when_eager(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """fn, off by 1e-3 in float32 when run eagerly; traced by torch.compile, it is right."""

    def wrong(x: torch.Tensor) -> torch.Tensor:
        out = fn(x)
        return out if torch.compiler.is_compiling() or x.dtype != torch.float32 else out + 1e-3

    return wrong


def _dtypes_check(ctx: selftest.Context) -> dict[str, Any]:
    return {"dtypes": selftest._compile_dtypes(ctx)}


NO_NVSHMEM = types.ModuleType("torch._C._distributed_c10d")  # the module as a build without NVSHMEM has it

CASES: list[tuple[str, str, Callable[[selftest.Context], Any], list[Any]]] = [
    (
        "host: /dev/shm of 64 MiB",
        "host",
        selftest.check_host,
        [mock.patch.object(selftest, "_shm_size", lambda: 64 << 20)],
    ),
    (
        "host: a CUDA 12.8 driver under a CUDA 13.2 image",
        "host",
        selftest.check_host,
        [
            mock.patch.object(selftest, "_driver_cuda_version", lambda: "12.8"),
            mock.patch.object(torch.version, "cuda", "13.2"),
        ],
    ),
    (
        "host: a CUDA 13.0 driver under a CUDA 13.2 image (minor version compatibility)",
        "host",
        selftest.check_host,
        [
            mock.patch.object(selftest, "_driver_cuda_version", lambda: "13.0"),
            mock.patch.object(torch.version, "cuda", "13.2"),
            mock.patch.object(selftest, "_shm_size", lambda: 1 << 33),
        ],
    ),
    (
        "cpu: Inductor finds no vector ISA",
        "cpu",
        selftest.check_cpu,
        [
            mock.patch.object(vec_isa, "pick_vec_isa", lambda: vec_isa.InvalidVecISA()),
            mock.patch.object(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2"),
        ],
    ),
    (
        "cpu: torch's oneMKL has the VML first-call race",
        "cpu",
        selftest.check_cpu,
        [mock.patch.object(selftest, "mkl_version", lambda: "2024.2")],
    ),
    (
        "cpu: torch's oneMKL is a release without the race",
        "cpu",
        selftest.check_cpu,
        [mock.patch.object(selftest, "mkl_version", lambda: "2025.2")],
    ),
    (
        "conv2d: fp32 off by 1e-2",
        "conv2d",
        selftest.check_conv2d,
        [
            mock.patch.object(
                torch.nn.Conv2d, "_conv_forward", _off_by(1e-2, torch.float32, torch.nn.Conv2d._conv_forward)
            )
        ],
    ),
    (
        "linalg: singular values off by 1%",
        "linalg",
        selftest.check_linalg,
        [mock.patch.object(torch.linalg, "svd", _wrong_svd(torch.linalg.svd))],
    ),
    (
        "linalg: from_numpy copies",
        "linalg",
        selftest.check_linalg,
        [mock.patch.object(torch, "from_numpy", torch.tensor)],
    ),
    (
        "torch.compile: compiled differs from eager",
        "compile-dtypes",
        _dtypes_check,
        [mock.patch.object(torch, "compile", _wrong_compile)],
    ),
    (
        "torch.compile: eager is off, compiled is right",
        "compile-dtypes",
        _dtypes_check,
        [mock.patch.object(selftest, "_sin_cos", _wrong_when_eager(selftest._sin_cos))],
    ),
    (
        "libraries: the nvidia wheels are not what torch loads",
        "libraries",
        selftest.check_libraries,
        [mock.patch.object(selftest, "_installed", lambda prefix: "0.0.1")],
    ),
    (
        "libraries: cuDNN loaded is of another major than torch was built with",
        "libraries",
        selftest.check_libraries,
        [
            mock.patch.object(
                torch._C, "_cudnn", types.SimpleNamespace(getCompileVersion=lambda: (1, 2, 3)), create=True
            )
        ],
    ),
    (
        "libraries: cuDNN loaded is older than torch was built with",
        "libraries",
        selftest.check_libraries,
        [
            mock.patch.object(
                torch._C, "_cudnn", types.SimpleNamespace(getCompileVersion=lambda: (9, 99, 0)), create=True
            )
        ],
    ),
    (
        "triton: it does not import",
        "triton",
        selftest.check_triton,
        [mock.patch.dict(sys.modules, {"triton": None})],
    ),
    (
        "cuda-runtime: torch built without NVSHMEM",
        "cuda-runtime",
        selftest.check_cuda_runtime,
        [mock.patch.dict(sys.modules, {"torch._C._distributed_c10d": NO_NVSHMEM})],
    ),
]


def main() -> None:
    ctx = selftest.Context(ARGS)
    outcomes = {}
    for case, name, check, patches in CASES:
        for patch in patches:
            patch.start()
        try:
            result = selftest.run_check(ctx, name, check)
        finally:
            for patch in reversed(patches):
                patch.stop()
        outcomes[case] = [result["status"], result["message"]]
    print(json.dumps(outcomes))


if __name__ == "__main__":
    main()
