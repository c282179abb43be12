#!/usr/bin/env python3
"""torch-selftest: does this image (or this host) run PyTorch correctly and at speed?

Depends on torch and the standard library only, so it runs in every image of the matrix and
on any host: `docker run --rm [--gpus all] IMAGE torch-selftest [--json report.json]`.

Checks: the host (driver against the image's CUDA, /dev/shm), environment (versions against
the image's spec; GPU architecture), the CUDA libraries torch loads against the wheels
installed, conv2d, linear algebra and NumPy, torch.compile (dtypes, max-autotune on GPU),
AMP training, SDPA with every backend the device offers (grouped-query shapes included),
matmul and memory bandwidth against the GPU's datasheet, a two-process all_reduce and a
torch.distributed.rpc round trip over TensorPipe, and the
CUDA runtime (NVSHMEM, device-side asserts). Every check has a correctness gate; speed
thresholds apply on GPUs listed in gpu_peaks.json. Exits 1 if any check fails; a warning
(a host setting that will bite later) does not fail the run.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
DEFAULT_PEAKS = HERE / "gpu_peaks.json"
DEFAULT_SPEC = HERE / "spec.json"
Metrics = Dict[str, Any]


class Failure(Exception):
    """A check's correctness or speed gate did not hold."""


class Skip(Exception):
    """The check does not apply on this device."""


class Warn(Exception):
    """The check held, but something will bite later: a host setting (says how to fix it) or a
    known defect of the stack in the image (names its upstream report). Keeps the check's metrics."""

    def __init__(self, message: str, metrics: Optional[Metrics] = None) -> None:
        super().__init__(message)
        self.metrics: Metrics = metrics or {}


class OverTime(BaseException):
    """A check ran past its time limit (raised by the alarm; a BaseException, so that a check's
    own `except Exception` cannot swallow it)."""


# A check that runs longer than this fails with a line naming it and the limit, and the report
# still comes out. Generous for a native CPU or GPU (the slowest check takes about a minute on a
# 2-core machine); under emulation every check is tens of times slower, hence its own limit.
CHECK_LIMIT_S = 600
EMULATED_CHECK_LIMIT_S = 1800


class Context:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.cuda = torch.cuda.is_available() and not args.cpu
        self.device = torch.device("cuda" if self.cuda else "cpu")
        self.gpu_name = torch.cuda.get_device_name(0) if self.cuda else ""
        self.capability = torch.cuda.get_device_capability(0) if self.cuda else (0, 0)
        self.peaks = self._gpu_entry(args.peaks)
        self.quick = args.quick

    def _gpu_entry(self, path: Path) -> Optional[Dict[str, Any]]:
        if not self.cuda or not path.exists():
            return None
        table = json.loads(path.read_text())
        for entry in table.get("gpus", []):
            if any(alias.lower() in self.gpu_name.lower() for alias in entry["match"]):
                return entry
        return None

    def threshold(self, name: str) -> Optional[float]:
        if self.peaks is None:
            return None
        value = self.peaks.get("thresholds", {}).get(name)
        return float(value) if value is not None else None

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def timed(ctx: Context, fn: Callable[[], Any], iterations: int, warmup: int = 2) -> float:
    """Median seconds per call, after warm-up, with the device synchronised. Under emulation a
    time measures qemu, not the image: one call, no warm-up (speeds are reported, never gated there)."""
    if ctx.args.emulated:
        iterations, warmup = 1, 0
    for _ in range(warmup):
        fn()
    ctx.sync()
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        ctx.sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


# ----------------------------------------------------------------------------- checks


def check_environment(ctx: Context) -> Metrics:
    """Versions inside the image, compared with the spec it was built from."""
    metrics: Metrics = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "cpu",
        "cudnn": _cudnn_version(),
        "nccl": _nccl_version(),
        "python": platform.python_version(),
        "glibc": platform.libc_ver()[1],
    }
    expected = _load_spec(ctx.args.spec)
    mismatches = []
    if expected:
        locked = expected.get("locked", {})
        if locked.get("torch") and not _same_torch(metrics["torch"], locked["torch"]):
            mismatches.append(f"torch {metrics['torch']} != {locked['torch']}")
        if locked.get("cuda") and locked["cuda"] != metrics["cuda"]:
            mismatches.append(f"CUDA {metrics['cuda']} != {locked['cuda']}")
        if locked.get("cudnn") and metrics["cudnn"] is not None and metrics["cudnn"] != _cudnn_number(locked["cudnn"]):
            mismatches.append(f"cuDNN {metrics['cudnn']} != {locked['cudnn']}")
        if expected.get("python") and not metrics["python"].startswith(expected["python"] + "."):
            mismatches.append(f"Python {metrics['python']} != {expected['python']}")
        if expected.get("glibc") and metrics["glibc"] != expected["glibc"]:
            mismatches.append(f"glibc {metrics['glibc']} != {expected['glibc']}")
        metrics["spec"] = expected.get("cell")
    if ctx.cuda:
        metrics.update(_gpu_compatibility(ctx))
    try:
        import numpy

        metrics["numpy"] = numpy.__version__
        torch.ones(2).numpy()
    except ImportError:
        mismatches.append("numpy is missing")
    if mismatches:
        raise Failure("; ".join(mismatches))
    return metrics


def _same_torch(running: str, locked: str) -> bool:
    """PyPI's CUDA wheels report a local tag (2.15.0+cu132) their metadata version lacks (2.15.0)."""
    return running == locked if "+" in locked else running.split("+")[0] == locked


def _cudnn_number(version: str) -> int:
    """cuDNN 9's integer version, as torch.backends.cudnn.version() reports it (9.26.0.51 -> 92600)."""
    major, minor, patch = (int(part) for part in version.split(".")[:3])
    return major * 10000 + minor * 100 + patch


def _cudnn_version() -> Optional[int]:
    try:
        return torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:
        return None


def _nccl_version() -> Optional[str]:
    try:
        version = torch.cuda.nccl.version()
        return ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)
    except Exception:
        return None


def _load_spec(path: Optional[Path]) -> Optional[Dict[str, Any]]:
    if path is None or not path.exists():
        return None
    return json.loads(path.read_text())


def _driver_cuda_version() -> Optional[str]:
    """The newest CUDA the installed driver supports, from libcuda itself."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int()
    if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return None
    return f"{version.value // 1000}.{(version.value % 1000) // 10}"


def driver_advice(driver: Optional[str], needed: Optional[str]) -> Optional[str]:
    """Why a host driver cannot run this image's CUDA, and what to do; None when it can.
    Within one major version a newer CUDA runs on an older driver (minor version
    compatibility); across majors it needs a newer driver or NVIDIA's forward-compatibility
    libraries."""
    if not driver or not needed or int(driver.split(".")[0]) >= int(needed.split(".")[0]):
        return None
    major, minor = needed.split(".")[:2]
    return (
        f"the host's NVIDIA driver supports CUDA {driver}, this image needs CUDA {needed}: upgrade the driver, "
        f"or on a data-center GPU add NVIDIA's forward-compatibility libraries (cuda-compat-{major}-{minor}) "
        "and put them first on LD_LIBRARY_PATH"
    )


SHM_ADVICE_BYTES = 1 << 30


def shm_advice(size: Optional[int]) -> Optional[str]:
    """DataLoader workers and NCCL pass tensors through /dev/shm; Docker's default is 64 MB."""
    if size is None or size >= SHM_ADVICE_BYTES:
        return None
    return (
        f"/dev/shm is {size / 2**20:.0f} MiB: DataLoader workers and NCCL run out of it "
        '("bus error", "No space left on device"); run with --shm-size=8g (or --ipc=host)'
    )


def _shm_size() -> Optional[int]:
    try:
        stats = os.statvfs("/dev/shm")
    except OSError:
        return None
    return stats.f_frsize * stats.f_blocks


def check_host(ctx: Context) -> Metrics:
    """What the host gives the container: a driver new enough for this CUDA, and /dev/shm."""
    needed, driver, shm = torch.version.cuda, _driver_cuda_version(), _shm_size()
    metrics: Metrics = {"image_cuda": needed or "cpu", "driver_cuda": driver, "shm_bytes": shm}
    # A too-old driver makes torch.cuda.is_available() False, so every other check would
    # quietly pass on the CPU: fail here instead.
    advice = driver_advice(driver, needed)
    if advice:
        raise Failure(advice)
    if needed and driver is None:
        metrics["note"] = "no NVIDIA driver visible (CPU host, or run with --gpus all)"
    advice = shm_advice(shm)
    if advice:
        raise Warn(advice)
    return metrics


def _gpu_compatibility(ctx: Context) -> Metrics:
    major, minor = ctx.capability
    arch_list = torch.cuda.get_arch_list()
    native = f"sm_{major}{minor}"
    ptx = [a for a in arch_list if a.startswith("compute_") and int(a[8:].rstrip("a")) <= major * 10 + minor]
    if native not in arch_list and not any(a.startswith(native) for a in arch_list) and not ptx:
        raise Failure(
            f"{ctx.gpu_name} is {native}; this torch is compiled for {', '.join(arch_list)}: "
            "use an image whose torch supports this GPU"
        )
    return {"gpu": ctx.gpu_name, "capability": f"{major}.{minor}", "arch_list": arch_list}


def _cudnn_tuple(number: int) -> Tuple[int, int, int]:
    return number // 10000, (number % 10000) // 100, number % 100


def _cublas_version() -> Optional[str]:
    """The cuBLAS torch loaded ("13.1.0"), asked of the library in this process (cublasGetProperty
    needs no GPU); None when no libcublas is loaded."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = sorted({line.split()[-1] for line in maps.splitlines() if "/libcublas.so" in line})
    if not paths:
        return None
    library = ctypes.CDLL(paths[0])  # already loaded: the same handle torch uses
    parts = []
    for kind in (0, 1, 2):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
        value = ctypes.c_int()
        if library.cublasGetProperty(kind, ctypes.byref(value)) != 0:
            return None
        parts.append(str(value.value))
    return ".".join(parts)


def _installed(prefix: str) -> Optional[str]:
    """The version of the installed distribution whose name starts with prefix (nvidia-cudnn-cu13)."""
    from importlib import metadata

    for dist in metadata.distributions():
        if (dist.metadata["Name"] or "").lower().startswith(prefix):
            return dist.version
    return None


def check_libraries(ctx: Context) -> Metrics:
    """The cuDNN, NCCL and cuBLAS torch loads (what PyTorch's release smoke test compares): cuDNN
    at run time is one torch accepts for the one it was built with (torch's own rule for cuDNN 7
    and later: the same major, a minor at least the compiled one; torch 2.9.1's CUDA 12.8 wheel
    was built with 9.8.0 and pins 9.10.2), and the installed nvidia-cudnn/nvidia-nccl/
    nvidia-cublas wheels are the versions torch reports or loads. Needs no GPU: the libraries
    load without one."""
    if not torch.version.cuda:
        raise Skip("a CPU build of torch loads no cuDNN or NCCL")
    runtime = _cudnn_version()
    if runtime is None:
        raise Failure("torch cannot load cuDNN")
    loaded = _cudnn_tuple(runtime)
    compiled = tuple(torch._C._cudnn.getCompileVersion())
    problems = []
    if loaded[0] != compiled[0] or loaded[1] < compiled[1]:
        problems.append(
            f"cuDNN {'.'.join(map(str, loaded))} loaded, which torch built with {'.'.join(map(str, compiled))} "
            "does not accept (it needs the same major and at least its minor)"
        )
    cudnn_wheel, nccl_wheel, nccl = _installed("nvidia-cudnn"), _installed("nvidia-nccl"), _nccl_version()
    if cudnn_wheel is None or not cudnn_wheel.startswith(".".join(map(str, loaded))):
        problems.append(f"installed nvidia-cudnn is {cudnn_wheel}, torch loads cuDNN {'.'.join(map(str, loaded))}")
    if nccl_wheel is None or nccl is None or not nccl_wheel.startswith(nccl):
        problems.append(f"installed nvidia-nccl is {nccl_wheel}, torch reports NCCL {nccl}")
    cublas_wheel, cublas = _installed("nvidia-cublas"), _cublas_version()
    if cublas_wheel is None or cublas is None or not cublas_wheel.startswith(cublas):
        problems.append(f"installed nvidia-cublas is {cublas_wheel}, torch loads cuBLAS {cublas}")
    if problems:
        raise Failure("; ".join(problems))
    return {
        "cudnn_loaded": ".".join(map(str, loaded)),
        "cudnn_compiled": ".".join(map(str, compiled)),
        "cudnn_wheel": cudnn_wheel,
        "nccl": nccl,
        "nccl_wheel": nccl_wheel,
        "cublas": cublas,
        "cublas_wheel": cublas_wheel,
    }


def _close(name: str, actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> List[str]:
    actual, expected = actual.double().cpu(), expected.double().cpu()
    if torch.allclose(actual, expected, rtol=rtol, atol=atol):
        return []
    return [f"{name} differs from the reference by {(actual - expected).abs().max().item():.3e}"]


def check_conv2d(ctx: Context) -> Metrics:
    """conv2d (strided, padded, dilated) on CPU in fp32 against fp64, and on CUDA in fp32, fp64
    and under autocast (fp16, bf16) against the CPU's fp64 result."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(16, 33, (3, 5), stride=(2, 1), padding=(4, 2), dilation=(3, 1))
    x = torch.randn(8, 16, 50, 100)
    with torch.no_grad():
        reference = conv.double()(x.double())
        problems = _close("cpu fp32", conv.float()(x), reference, 1e-4, 1e-4)
        metrics: Metrics = {"cpu_fp32": "ok" if not problems else "differs"}
        if ctx.cuda:
            for dtype, tolerance in ((torch.float32, 1e-2), (torch.float64, 1e-9)):
                name = str(dtype).replace("torch.", "")
                problems += _close(
                    f"cuda {name}", conv.to(ctx.device, dtype)(x.to(ctx.device, dtype)), reference, tolerance, tolerance
                )
            conv = conv.to(ctx.device, torch.float32)
            for dtype in (torch.float16, torch.bfloat16):
                with torch.autocast("cuda", dtype=dtype):
                    out = conv(x.to(ctx.device))
                name = str(dtype).replace("torch.", "")
                if out.dtype != dtype:
                    problems.append(f"autocast {name} produced {out.dtype}")
                problems += _close(
                    f"cuda autocast {name}", out, reference, 5e-2, 5e-2 if dtype == torch.float16 else 1e-1
                )
                metrics[f"cuda_autocast_{name}"] = "ok"
    if problems:
        raise Failure("; ".join(problems))
    return metrics


def check_linalg(ctx: Context) -> Metrics:
    """linalg.svd reconstructs its input (CPU, and CUDA in fp32 and fp64), and NumPy arrays
    and tensors share memory both ways."""
    import numpy

    problems: List[str] = []
    torch.manual_seed(0)
    devices = [torch.device("cpu")] + ([ctx.device] if ctx.cuda else [])
    for device in devices:
        for dtype in (torch.float32, torch.float64):
            a = torch.randn(7, 50, 30, device=device, dtype=dtype)
            u, s, vh = torch.linalg.svd(a, full_matrices=False)
            tolerance = 1e-4 if dtype == torch.float32 else 1e-10
            problems += _close(f"svd {device.type} {dtype}", u @ torch.diag_embed(s) @ vh, a, tolerance, tolerance)
    array = numpy.arange(6, dtype=numpy.float32)
    tensor = torch.from_numpy(array)
    array[0] = 42.0
    if tensor[0].item() != 42.0:
        problems.append("torch.from_numpy does not share the array's memory")
    back = tensor.numpy()
    tensor[1] = -1.0
    if back[1] != -1.0 or back.dtype != numpy.float32:
        problems.append("Tensor.numpy() does not share the tensor's memory")
    if torch.tensor(numpy.ones((2, 3), dtype=numpy.float64)).dtype != torch.float64:
        problems.append("a float64 array does not become a float64 tensor")
    if problems:
        raise Failure("; ".join(problems))
    return {"svd_devices": [d.type for d in devices], "numpy": numpy.__version__}


def check_cpu(ctx: Context) -> Metrics:
    """The CPU's SIMD level as ATen dispatches to it and as Inductor vectorises for it: where
    ATen finds a vector unit, Inductor must too, or compiled CPU code runs scalar. OpenMP is
    there (PyTorch's release smoke test checks both), and the oneMKL release is reported."""
    capability = torch.backends.cpu.get_cpu_capability()
    try:
        from torch._inductor.cpu_vec_isa import pick_vec_isa
    except ImportError:  # torch < 2.4
        from torch._inductor.codecache import pick_vec_isa  # type: ignore[no-redef]
    isa = pick_vec_isa()
    metrics: Metrics = {
        "machine": platform.machine(),
        "aten_capability": capability,
        "inductor_isa": type(isa).__name__ if isa else None,
        "inductor_bit_width": isa.bit_width() if isa else 0,
    }
    if capability != "DEFAULT" and not isa:
        raise Failure(f"ATen uses {capability} but Inductor found no vector ISA: compiled CPU code would run scalar")
    metrics["openmp"] = torch.backends.openmp.is_available()
    if not metrics["openmp"]:
        raise Failure("torch was built without OpenMP: intra-op parallelism runs on one thread")
    metrics["mkl"] = mkl_version()
    if metrics["mkl"] and metrics["mkl"].startswith(VML_RACE_MKL):
        raise Warn(
            f"torch's oneMKL {metrics['mkl']} has the VML first-call race (pytorch#188792): a process's first "
            "call of a float unary op (sin, exp, sqrt, ...) on more than one intra-op thread can return a "
            "low-accuracy result on one thread's share of the elements (seen here: sin off by 8.8e-5 on half of "
            "4096 floats, in 5 of 120 fresh processes). The self-test makes one one-element call of each such "
            "op before its checks; a program can do the same",
            metrics,
        )
    return metrics


# oneMKL releases whose VML picks a function's kernel lazily and racily on its first call
# (pytorch#188792: reproduced on 2024.2.0 to 2024.2.2, not on 2025.0 and later).
VML_RACE_MKL = ("2024.2",)

# The float unary ops ATen hands to oneMKL's VML for contiguous tensors (aten/src/ATen/cpu/vml.h;
# abs, expm1 and log1p in older torch). Calling one that does not go through VML costs nothing.
VML_OPS = (
    "abs", "acos", "asin", "atan", "cos", "erf", "erfc", "erfinv", "exp", "expm1",
    "log", "log10", "log1p", "log2", "sin", "sqrt", "tan", "tanh", "trunc",
)  # fmt: skip


def mkl_version() -> Optional[str]:
    """The oneMKL release torch was built with ("2024.2"), from torch's build configuration; None
    without MKL (aarch64 wheels, for one)."""
    if not torch.backends.mkl.is_available():
        return None
    found = re.search(r"Math Kernel Library Version (\d+(?:\.\d+)*)", torch.__config__.show())
    return found.group(1) if found else None


def settle_vml() -> None:
    """One one-element call of each VML op in float32 and float64, on one thread, before any
    check: with the kernel chosen once, a later first call spread over intra-op threads cannot race
    on the choice (pytorch#188792). Without this, the compile check's eager reference was wrong
    now and then (docs/selftest-and-publish.md)."""
    for dtype in (torch.float32, torch.float64):
        x = torch.full((1,), 0.5, dtype=dtype)
        for name in VML_OPS:
            getattr(torch, name)(x)


_DEVICE_ASSERT = (
    "import torch\n"
    "try:\n"
    "    torch._assert_async(torch.tensor(0, device='cuda'))\n"
    "    torch.cuda.synchronize()\n"
    "except RuntimeError as error:\n"
    "    print('raised:', str(error).splitlines()[0])\n"
    "else:\n"
    "    print('not raised')\n"
)


def check_cuda_runtime(ctx: Context) -> Metrics:
    """NVSHMEM is compiled into CUDA builds of torch 2.9 and later (and available on a GPU);
    a device-side assert raises a Python RuntimeError instead of crashing or hanging (run in
    a child process: it leaves the CUDA context unusable)."""
    if not torch.version.cuda:
        raise Skip("a CPU build of torch")
    metrics: Metrics = {}
    try:
        from torch._C._distributed_c10d import _is_nvshmem_available
    except ImportError:
        if _torch_at_least(2, 9):
            raise Failure("this CUDA build of torch 2.9+ is not compiled with NVSHMEM") from None
        metrics["nvshmem"] = "not in this torch (before 2.9)"
    else:
        metrics["nvshmem"] = "compiled in"
        if ctx.cuda:
            metrics["nvshmem_available"] = bool(_is_nvshmem_available())
    if not ctx.cuda:
        metrics["device_assert"] = "needs a GPU; not run"
        return metrics
    child = subprocess.run([sys.executable, "-c", _DEVICE_ASSERT], capture_output=True, text=True, timeout=120)
    last = (child.stdout.strip().splitlines() or [f"exit {child.returncode}: {child.stderr.strip()[-200:]}"])[-1]
    if not last.startswith("raised:") or "CUDA" not in last:
        raise Failure(f"a device-side assert did not raise a CUDA RuntimeError: {last}")
    metrics["device_assert"] = last
    return metrics


def _torch_at_least(major: int, minor: int) -> bool:
    parts = torch.__version__.split("+")[0].split(".")
    return (int(parts[0]), int(parts[1])) >= (major, minor)


class _Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


def _model(ctx: Context, width: int, depth: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[_Block(width) for _ in range(depth)]).to(ctx.device)


def check_triton(ctx: Context) -> Metrics:
    """torch.compile on a GPU generates Triton kernels: in a CUDA build of torch, triton imports
    with its NVIDIA backend and its ptxas runs. Without a GPU this is the only check of triton
    (Inductor's CPU code never imports it), and `import triton` fails when any backend its
    entry points name is missing."""
    if not torch.version.cuda:
        raise Skip("a CPU build of torch")
    try:
        import triton
        from triton.backends import backends
    except Exception as error:  # any failure here is torch.compile failing on a GPU
        raise Failure(f"import triton failed: {type(error).__name__}: {error}") from None
    if "nvidia" not in backends:
        raise Failure(f"triton has no NVIDIA backend (it found {sorted(backends)})")
    ptxas = os.environ.get("TRITON_PTXAS_PATH") or str(Path(triton.__file__).parent / "backends/nvidia/bin/ptxas")
    try:
        run = subprocess.run([ptxas, "--version"], capture_output=True, text=True, timeout=60)
    except OSError as error:
        raise Failure(f"triton's ptxas does not run: {error}") from None
    if run.returncode != 0:
        raise Failure(f"{ptxas} --version exited {run.returncode}: {run.stderr.strip()[-200:]}")
    metrics: Metrics = {"triton": triton.__version__, "backends": sorted(backends)}
    metrics["ptxas"] = (run.stdout.strip().splitlines() or ["?"])[-1]
    if ctx.cuda:
        from torch.utils._triton import has_triton

        metrics["usable_on_this_gpu"] = has_triton()
    return metrics


def check_compile(ctx: Context) -> Metrics:
    """A small model compiled with Inductor matches eager and is not slower."""
    width, batch = (256, 64) if not ctx.cuda else (1024, 4096)
    model = _model(ctx, width, 2).eval()
    x = torch.randn(batch, width, device=ctx.device)
    compiled = torch.compile(model, backend="inductor")
    with torch.no_grad():
        start = time.perf_counter()
        out_compiled = compiled(x)
        ctx.sync()
        compile_seconds = time.perf_counter() - start
        out_eager = model(x)
        error = (out_compiled - out_eager).abs().max().item()
        problem = mismatch(out_compiled, out_eager, x, 1e-3, 1e-3)
        if problem:
            raise Failure(f"the compiled model's output differs from eager: {problem}")
        iterations = 10 if ctx.quick else 30
        eager_s = timed(ctx, lambda: model(x), iterations)
        compiled_s = timed(ctx, lambda: compiled(x), iterations)
    speedup = eager_s / compiled_s
    dtypes = _compile_dtypes(ctx)
    metrics = {
        "compile_s": round(compile_seconds, 2),
        "max_abs_error": error,
        "speedup_vs_eager": round(speedup, 2),
        "dtypes": dtypes,
    }
    if ctx.cuda:
        metrics["max_autotune"] = _compile_max_autotune(ctx)
    floor = ctx.threshold("compile_speedup_min")
    if floor is not None and speedup < floor:
        raise Failure(f"compiled model runs at {speedup:.2f}x eager, needs >= {floor}")
    return metrics


def _sin_cos(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) + torch.cos(x)


# What torch.testing.assert_close accepts for each dtype (PyTorch's own tests use these defaults).
_TOLERANCES = {torch.float16: (1e-3, 1e-5), torch.float32: (1.3e-6, 1e-5), torch.float64: (1e-7, 1e-7)}


def _inductor_isa() -> str:
    try:
        from torch._inductor.cpu_vec_isa import pick_vec_isa
    except ImportError:  # torch < 2.4
        from torch._inductor.codecache import pick_vec_isa  # type: ignore[no-redef]
    isa = pick_vec_isa()
    return type(isa).__name__ if isa else "none"


def mismatch(
    actual: torch.Tensor, expected: torch.Tensor, inputs: torch.Tensor, rtol: float, atol: float
) -> Optional[str]:
    """None when the two agree within the tolerance; else what an engineer needs to act on it: the
    share of elements off, and the worst one with its input and both values."""
    off = ~torch.isclose(actual, expected, rtol=rtol, atol=atol)
    if not bool(off.any()):
        return None
    error = (actual.double() - expected.double()).abs()
    worst = int(error.flatten().argmax())
    return (
        f"{int(off.sum())} of {off.numel()} elements ({100.0 * float(off.float().mean()):.1f}%) outside rtol={rtol:g} "
        f"atol={atol:g}; worst at input {float(inputs.flatten()[worst]):.7g}: {float(actual.flatten()[worst]):.9g} "
        f"against {float(expected.flatten()[worst]):.9g} (off by {float(error.flatten()[worst]):.3g})"
    )


def _compile_dtypes(ctx: Context) -> List[str]:
    """The same function compiled and eager agree in fp16, fp32 and fp64, on seeded inputs.
    Where they do not, float64 on the same inputs says which side is off, and the failure line
    says it: a wrong eager result is a defect of the image as much as a wrong compiled one (the
    one seen, pytorch#188792, is settled before the checks run: settle_vml). Returns the dtypes."""
    checked = []
    for index, dtype in enumerate((torch.float16, torch.float32, torch.float64)):
        generator = torch.Generator().manual_seed(index)
        x = torch.rand(64, 64, generator=generator).to(device=ctx.device, dtype=dtype)
        compiled = torch.compile(_sin_cos, backend="inductor")(x)
        eager = _sin_cos(x)
        name = str(dtype).replace("torch.", "")
        rtol, atol = _TOLERANCES[dtype]
        problem = mismatch(compiled, eager, x, rtol, atol)
        if problem:
            where = (
                ctx.gpu_name or f"CPU, Inductor ISA {_inductor_isa()}, ATen {torch.backends.cpu.get_cpu_capability()}"
            )
            exact = _sin_cos(x.double())
            # Against float64, each side may be off by its own rounding to the dtype: twice the tolerance.
            compiled_off = mismatch(compiled.double(), exact, x, 2 * rtol, 2 * atol)
            eager_off = mismatch(eager.double(), exact, x, 2 * rtol, 2 * atol)
            culprit = (
                f"the compiled result is off against float64: {compiled_off}"
                if compiled_off
                else f"the eager result is off against float64, the compiled one is right: {eager_off}"
                if eager_off
                else "both are within float64's tolerance"
            )
            raise Failure(f"sin(x)+cos(x) compiled in {name} differs from eager ({where}): {problem}; {culprit}")
        checked.append(name)
    return checked


def _compile_max_autotune(ctx: Context) -> Metrics:
    """mode="max-autotune" benchmarks Triton templates for the convolutions and matmuls: on a
    GPU it exercises Triton's compiler and autotuner, which the default mode does not."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3),
        torch.nn.Flatten(),
        torch.nn.Linear(64 * 24 * 24, 10),
    ).to(ctx.device)
    x = torch.rand(64, 1, 28, 28, device=ctx.device)
    with torch.no_grad():
        eager = model(x)
        start = time.perf_counter()
        compiled = torch.compile(model, mode="max-autotune")(x)
        ctx.sync()
    error = (compiled - eager).abs().max().item()
    if not torch.allclose(compiled, eager, rtol=1e-2, atol=1e-2):
        raise Failure(f"max-autotune output differs from eager by {error:.2e}")
    return {"compile_s": round(time.perf_counter() - start, 1), "max_abs_error": error}


def _train(ctx: Context, dtype: Optional[torch.dtype], steps: int) -> Metrics:
    torch.manual_seed(0)
    width = 128 if not ctx.cuda else 2048
    model = _model(ctx, width, 2)
    head = torch.nn.Linear(width, 1).to(ctx.device)
    params = list(model.parameters()) + list(head.parameters())
    # Adam moves every weight by about lr a step, so the output by about lr * width: 1e-3
    # trains the CPU's width 128 and diverges at the GPU's 2048 (seen on an H200).
    optimizer = torch.optim.AdamW(params, lr=0.1 / width)
    scaler = torch.amp.GradScaler("cuda") if (dtype == torch.float16 and ctx.cuda) else None
    x = torch.randn(128 if not ctx.cuda else 8192, width, device=ctx.device)
    target = x.sum(dim=1, keepdim=True) / width**0.5
    losses = []
    ctx.sync()
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(ctx.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = F.mse_loss(head(model(x)).float(), target)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        losses.append(loss.item())
    seconds = time.perf_counter() - start
    finite = all(v == v and abs(v) != float("inf") for v in losses)
    if not finite:
        raise Failure(f"{dtype} training produced a non-finite loss: {losses}")
    if not losses[-1] < losses[0]:
        raise Failure(f"{dtype} training loss did not decrease: {losses[0]:.4f} -> {losses[-1]:.4f}")
    return {"first_loss": round(losses[0], 4), "last_loss": round(losses[-1], 4), "seconds": seconds}


def check_amp(ctx: Context) -> Metrics:
    """Autocast training steps: loss stays finite and decreases; speedup against fp32."""
    steps = 8 if ctx.quick else 20
    fp32 = _train(ctx, None, steps)
    dtypes = [torch.bfloat16] + ([torch.float16] if ctx.cuda else [])
    metrics: Metrics = {"fp32_loss": [fp32["first_loss"], fp32["last_loss"]]}
    for dtype in dtypes:
        result = _train(ctx, dtype, steps)
        name = str(dtype).replace("torch.", "")
        metrics[f"{name}_loss"] = [result["first_loss"], result["last_loss"]]
        metrics[f"{name}_speedup_vs_fp32"] = round(fp32["seconds"] / result["seconds"], 2)
    return metrics


def _sdpa_backends(ctx: Context) -> List[str]:
    from torch.nn.attention import SDPBackend

    names = ["MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"]
    if ctx.cuda and hasattr(SDPBackend, "CUDNN_ATTENTION"):
        names.append("CUDNN_ATTENTION")
    if not ctx.cuda:
        names = ["MATH", "FLASH_ATTENTION"]  # the CPU kernels torch ships
    return names


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: Any, gqa: bool) -> torch.Tensor:
    """Causal SDPA with `backend` alone allowed; with backend None, whichever SDPA's own dispatch
    picks (what a user's code gets)."""
    from torch.nn.attention import sdpa_kernel

    if backend is None:
        if gqa:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with sdpa_kernel(backend):
        return _attention(q, k, v, None, gqa)


def _default_sdpa_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gqa: bool) -> str:
    """The backend SDPA's dispatch picks for these inputs on this device ("cudnn_attention")."""
    from torch.nn.attention import SDPBackend

    try:
        choice = torch._fused_sdp_choice(q, k, v, is_causal=True, enable_gqa=gqa)
        return SDPBackend(choice).name.lower()
    except (AttributeError, TypeError, ValueError, RuntimeError):  # a torch without the helper
        return "unknown"


def check_sdpa(ctx: Context) -> Metrics:
    """Every SDPA backend, selected explicitly, and SDPA's default dispatch, against the math
    backend in float32, on shapes that include grouped-query attention with few KV heads (where
    cuDNN's kernel was silently wrong on sm_100: pytorch#193893). A divergence fails the check.
    The backend the default dispatch picks for each shape is recorded (`default_...`)."""
    from torch.nn.attention import SDPBackend

    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    # Under qemu one math call of the 32-head shape at 256 takes 88 s (aarch64 on an x86 host):
    # the same shapes and backends are compared at 64, which is what correctness needs.
    seq = 1024 if ctx.cuda else 64 if ctx.args.emulated else 256
    shapes = [(8, 8, 64), (8, 8, 128), (32, 4, 128), (16, 2, 64)]  # (query heads, KV heads, head dim)
    metrics: Metrics = {}
    problems = []
    for backend_name in [*_sdpa_backends(ctx), "DEFAULT"]:
        backend = None if backend_name == "DEFAULT" else getattr(SDPBackend, backend_name)
        for heads, kv_heads, head_dim in shapes:
            gqa = kv_heads != heads
            torch.manual_seed(0)
            q = torch.randn(2, heads, seq, head_dim, device=ctx.device, dtype=dtype)
            k = torch.randn(2, kv_heads, seq, head_dim, device=ctx.device, dtype=dtype)
            v = torch.randn(2, kv_heads, seq, head_dim, device=ctx.device, dtype=dtype)
            key = f"{backend_name.lower()}_h{heads}kv{kv_heads}d{head_dim}"
            if backend is None:
                key = f"{key}_{_default_sdpa_backend(q, k, v, gqa)}"
            try:
                out = _attention(q, k, v, backend, gqa)
            except RuntimeError as error:
                if "No available kernel" in str(error):
                    metrics[key] = "unsupported"
                    if backend_name == "CUDNN_ATTENTION" and ctx.capability >= (9, 0) and not gqa:
                        problems.append(
                            f"cuDNN SDPA has no kernel for {key} on sm{ctx.capability[0]}{ctx.capability[1]}"
                        )
                    continue
                raise
            reference = _attention(q.float(), k.float(), v.float(), SDPBackend.MATH, gqa)
            error_max = (out.float() - reference).abs().max().item()
            tolerance = 2e-2 if dtype != torch.float32 else 1e-4
            if error_max > tolerance:
                problems.append(f"{key} differs from math by {error_max:.3e}")
            metrics[key] = {
                "max_abs_error": error_max,
                "ms": round(
                    1e3 * timed(ctx, functools.partial(_attention, q, k, v, backend, gqa), 5 if ctx.quick else 10), 3
                ),
            }
    if ctx.cuda:
        metrics.update(_sdpa_speed_gate(ctx, problems))
    if problems:
        raise Failure("; ".join(problems))
    return metrics


def _sdpa_speed_gate(ctx: Context, problems: List[str]) -> Metrics:
    """Fused attention against math at sequence length 4096 in bf16."""
    from torch.nn.attention import SDPBackend

    q, k, v = (torch.randn(4, 16, 4096, 128, device=ctx.device, dtype=torch.bfloat16) for _ in range(3))
    math_ms = 1e3 * timed(ctx, lambda: _attention(q, k, v, SDPBackend.MATH, False), 5)
    speedups = {}
    for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION"):
        if not hasattr(SDPBackend, name):
            continue
        try:
            fused_ms = 1e3 * timed(ctx, functools.partial(_attention, q, k, v, getattr(SDPBackend, name), False), 10)
        except RuntimeError:
            continue
        speedups[f"{name.lower()}_speedup_vs_math_4096"] = round(math_ms / fused_ms, 2)
    floor = ctx.threshold("sdpa_fused_speedup_min")
    if floor is not None and speedups and max(speedups.values()) < floor:
        problems.append(f"fused SDPA is {max(speedups.values())}x math at 4096, needs >= {floor}")
    return speedups


def check_throughput(ctx: Context) -> Metrics:
    """Matmul TFLOP/s (bf16, fp16) and memory bandwidth, as fractions of the datasheet peaks."""
    n = 8192 if ctx.cuda else 512
    metrics: Metrics = {}
    # CPUs without bf16 units emulate it very slowly; on CPU fp32 alone says what matters.
    dtypes = [torch.bfloat16, torch.float16] if ctx.cuda else [torch.float32]
    for dtype in dtypes:
        a = torch.randn(n, n, device=ctx.device, dtype=dtype)
        b = torch.randn(n, n, device=ctx.device, dtype=dtype)
        seconds = timed(ctx, functools.partial(torch.matmul, a, b), 5 if ctx.quick else 20)
        name = str(dtype).replace("torch.", "")
        metrics[f"matmul_{name}_tflops"] = round(2 * n**3 / seconds / 1e12, 3)
    size = (1 << 30) if ctx.cuda else (1 << 25)
    source = torch.empty(size, dtype=torch.uint8, device=ctx.device)
    target = torch.empty_like(source)
    seconds = timed(ctx, lambda: target.copy_(source), 5 if ctx.quick else 20)
    metrics["copy_bandwidth_tbs"] = round(2 * size / seconds / 1e12, 4)  # read + write
    if ctx.peaks:
        peak_tflops, peak_bandwidth = ctx.peaks["bf16_tflops"], ctx.peaks["bandwidth_tbs"]
        metrics["matmul_bf16_fraction_of_peak"] = round(metrics["matmul_bfloat16_tflops"] / peak_tflops, 3)
        metrics["bandwidth_fraction_of_peak"] = round(metrics["copy_bandwidth_tbs"] / peak_bandwidth, 3)
        floor = ctx.threshold("matmul_bf16_fraction_min")
        if floor is not None and metrics["matmul_bf16_fraction_of_peak"] < floor:
            raise Failure(
                f"bf16 matmul reaches {metrics['matmul_bf16_fraction_of_peak']:.0%} "
                f"of {peak_tflops} TFLOP/s, needs {floor:.0%}"
            )
        floor = ctx.threshold("bandwidth_fraction_min")
        if floor is not None and metrics["bandwidth_fraction_of_peak"] < floor:
            raise Failure(
                f"copy bandwidth reaches {metrics['bandwidth_fraction_of_peak']:.0%} of peak, needs {floor:.0%}"
            )
    elif ctx.cuda:
        metrics["note"] = f"no datasheet entry for {ctx.gpu_name} in gpu_peaks.json; speeds not gated"
    return metrics


def _all_reduce_worker(rank: int, world: int, backend: str, init_file: str) -> None:
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    tensor = torch.full((1024,), float(rank + 1), device=device)
    dist.all_reduce(tensor)
    expected = world * (world + 1) / 2
    if not torch.all(tensor == expected):
        raise SystemExit(f"all_reduce gave {tensor[0].item()}, expected {expected}")
    dist.destroy_process_group()


def _rpc_double(tensor: "torch.Tensor") -> "torch.Tensor":
    return tensor * 2


def _rpc_worker(rank: int, world: int, init_file: str) -> None:
    from torch.distributed import rpc

    # Loopback only: the self-test runs without a network (--network none).
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"file://{init_file}", _transports=["uv"])
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world, rpc_backend_options=options)
    if rank == 0:
        sent = torch.arange(1024, dtype=torch.float32)
        answer = rpc.rpc_sync("worker1", _rpc_double, args=(sent,))
        if not torch.equal(answer, sent * 2):
            raise SystemExit("TensorPipe RPC round trip returned a different tensor")
    rpc.shutdown()


def _spawn_two(fn: Callable[..., None], args: Tuple[Any, ...]) -> float:
    """Run fn in two processes and wait for both; returns the seconds. Stopped early (the check's
    time limit), the processes are killed rather than left behind."""
    import torch.multiprocessing as mp

    start = time.perf_counter()
    context = mp.spawn(fn, args=args, nprocs=2, join=False)
    try:
        while not context.join():
            pass
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    return time.perf_counter() - start


def check_distributed(ctx: Context) -> Metrics:
    """A two-process all_reduce (NCCL across two GPUs, gloo otherwise), then a torch.distributed.rpc
    round trip over TensorPipe between two processes."""
    backend = "nccl" if ctx.cuda and torch.cuda.device_count() >= 2 else "gloo"
    with tempfile.TemporaryDirectory() as scratch:
        all_reduce_s = _spawn_two(_all_reduce_worker, (2, backend, os.path.join(scratch, "rendezvous")))
        environment = {"TP_SOCKET_IFNAME": os.environ.get("TP_SOCKET_IFNAME", "lo")}
        os.environ.update(environment)  # inherited by the spawned workers
        rpc_s = _spawn_two(_rpc_worker, (2, os.path.join(scratch, "rpc-rendezvous")))
    return {
        "backend": backend,
        "world_size": 2,
        "seconds": round(all_reduce_s, 2),
        "rpc": "tensorpipe",
        "rpc_seconds": round(rpc_s, 2),
    }


# Provided by the host's NVIDIA driver through the container runtime, never by an image.
DRIVER_LIBRARIES = {"libcuda.so.1", "libnvidia-ml.so.1"}


def unresolved_libraries(directories: List[str], allowed: Optional[set] = None) -> Dict[str, List[str]]:
    """Shared libraries under the directories whose dependencies ldd cannot resolve (by library)."""
    allowed = DRIVER_LIBRARIES if allowed is None else allowed
    problems: Dict[str, List[str]] = {}
    for directory in directories:
        for path in sorted(Path(directory).rglob("*.so*")):
            if not path.is_file() or path.is_symlink():
                continue
            output = subprocess.run(["ldd", str(path)], capture_output=True, text=True).stdout
            missing = [
                line.split("=>")[0].strip()
                for line in output.splitlines()
                if "not found" in line and line.split("=>")[0].strip() not in allowed
            ]
            if missing:
                problems[str(path)] = missing
    return problems


def check_trtllm(ctx: Context) -> Metrics:
    """TensorRT-LLM imports and every library it ships resolves (all but the driver's on CPU)."""
    import importlib.util

    spec = importlib.util.find_spec("tensorrt_llm")
    if spec is None or spec.origin is None:
        raise Skip("TensorRT-LLM is not in this image")
    package = Path(spec.origin).parent
    directories = [str(package)]
    tensorrt_libs = importlib.util.find_spec("tensorrt_libs")
    if tensorrt_libs is not None and tensorrt_libs.origin:
        directories.append(str(Path(tensorrt_libs.origin).parent))
    problems = unresolved_libraries(directories, DRIVER_LIBRARIES if not ctx.cuda else set())
    if problems:
        first = next(iter(problems.items()))
        raise Failure(f"{len(problems)} libraries do not resolve, e.g. {first[0]}: {', '.join(first[1])}")
    start = time.perf_counter()
    import tensorrt_llm

    return {"version": tensorrt_llm.__version__, "import_s": round(time.perf_counter() - start, 2)}


CHECKS = [
    ("host", check_host),
    ("environment", check_environment),
    ("libraries", check_libraries),
    ("cpu", check_cpu),
    ("conv2d", check_conv2d),
    ("linalg", check_linalg),
    ("triton", check_triton),
    ("torch.compile", check_compile),
    ("amp", check_amp),
    ("sdpa", check_sdpa),
    ("throughput", check_throughput),
    ("distributed", check_distributed),
    ("cuda-runtime", check_cuda_runtime),
    ("tensorrt-llm", check_trtllm),
]


# The checks a GPU report must pass on the GPU itself (a skip is not a pass): the publish gate
# of a CUDA image reads this list, as it reads CHECKS.
GPU_CHECKS = ["libraries", "triton", "torch.compile", "amp", "sdpa", "throughput", "distributed", "cuda-runtime"]


# ----------------------------------------------------------------------------- running


def _driver_version() -> Optional[str]:
    """The NVIDIA kernel driver's version (550.54.15): nvidia-smi where the container runtime
    mounts it, else the kernel module's own line."""
    smi = nvidia_smi()
    if smi and smi.get("driver_version"):
        return smi["driver_version"]
    try:
        line = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    words = [w for w in line.split() if w[:1].isdigit() and "." in w]
    return words[0] if words else None


def accelerator(ctx: Context) -> Dict[str, Any]:
    """What the report ran on: the device the gate names (model, compute capability, driver) and
    whether gpu_peaks.json knew it, so that its speed gates applied."""
    if not ctx.cuda:
        return {"kind": "cpu"}
    major, minor = ctx.capability
    return {
        "kind": "cuda",
        "name": ctx.gpu_name,
        "count": torch.cuda.device_count(),
        "capability": f"{major}.{minor}",
        "driver": _driver_version(),
        "driver_cuda": _driver_cuda_version(),
        "peaks": ctx.peaks["model"] if ctx.peaks else None,
        "gated": ctx.peaks is not None,
    }


def _peak_memory(ctx: Context) -> Optional[int]:
    if ctx.cuda:
        return int(torch.cuda.max_memory_allocated())
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    except ImportError:
        return None


def _over_time(signum: int, frame: Any) -> None:
    raise OverTime()


def run_check(ctx: Context, name: str, fn: Callable[[Context], Metrics]) -> Dict[str, Any]:
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    status, message, metrics = "pass", "", {}
    limit = ctx.args.check_timeout
    previous = signal.signal(signal.SIGALRM, _over_time) if limit else None
    if limit:
        signal.alarm(limit)
    try:
        metrics = fn(ctx)
    except OverTime:
        status, message = "fail", f"{name} ran past its time limit of {limit} s (--check-timeout) and was stopped"
    except Skip as reason:
        status, message = "skip", str(reason)
    except Warn as reason:
        status, message, metrics = "warn", str(reason), reason.metrics
    except Failure as reason:
        status, message = "fail", str(reason)
    except Exception as error:  # a crash in a check is a failure of the image, reported, not raised
        status, message = "fail", f"{type(error).__name__}: {error}"
        if ctx.args.verbose:
            traceback.print_exc()
    finally:
        if limit:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
    return {
        "check": name,
        "status": status,
        "seconds": round(time.perf_counter() - start, 2),
        "peak_memory_bytes": _peak_memory(ctx),
        "message": message,
        "metrics": metrics,
    }


def nvidia_smi() -> Optional[Dict[str, str]]:
    if shutil.which("nvidia-smi") is None:
        return None
    fields = "name,driver_version,utilization.gpu,memory.used,memory.total,clocks.sm,clocks.mem"
    try:
        output = (
            subprocess.run(
                ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            .stdout.strip()
            .splitlines()
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return dict(zip(fields.split(","), (v.strip() for v in output[0].split(",")))) if output else None


def _summary(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={_summary(v)}" for k, v in list(value.items())[:6])
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def print_table(report: Dict[str, Any], stream: Any) -> None:
    print(f"torch-selftest on {report['device']} ({report['host']})", file=stream)
    print(f"{'check':<15}{'status':<8}{'time':>8}  details", file=stream)
    for result in report["checks"]:
        detail = result["message"] or _summary(result["metrics"])
        print(
            f"{result['check']:<15}{result['status']:<8}{result['seconds']:>7.1f}s  {detail[:160]}",
            file=stream,
        )
    for warning in report.get("warnings", []):
        print(f"warning: {warning}", file=stream)
    print(f"result: {report['status']}", file=stream)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="torch-selftest", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="PATH", help="write the JSON report there ('-' for stdout)")
    parser.add_argument("--spec", type=Path, default=DEFAULT_SPEC, help="expected versions (the image's spec.json)")
    parser.add_argument("--peaks", type=Path, default=DEFAULT_PEAKS, help="GPU datasheet peaks and thresholds")
    parser.add_argument("--only", action="append", help="run only these checks (repeatable)")
    parser.add_argument("--cpu", action="store_true", help="ignore any GPU")
    parser.add_argument("--quick", action="store_true", help="fewer timing iterations")
    parser.add_argument("--profile", metavar="DIR", help="write a torch.profiler trace of the checks there")
    parser.add_argument(
        "--emulated",
        action="store_true",
        help="this runs under CPU emulation (qemu user mode; the builder says so for another architecture's "
        "image): longer time limits, and the report says so",
    )
    parser.add_argument(
        "--check-timeout",
        type=int,
        metavar="SECONDS",
        help=f"fail a check that runs longer (default {CHECK_LIMIT_S}, emulated {EMULATED_CHECK_LIMIT_S}; 0: none)",
    )
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.check_timeout is None:
        args.check_timeout = EMULATED_CHECK_LIMIT_S if args.emulated else CHECK_LIMIT_S
    ctx = Context(args)
    settle_vml()
    selected = [(n, f) for n, f in CHECKS if not args.only or n in args.only]
    results = []
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.cuda else [])
        with profile(activities=activities) as profiler:
            results = [run_check(ctx, n, f) for n, f in selected]
        os.makedirs(args.profile, exist_ok=True)
        profiler.export_chrome_trace(os.path.join(args.profile, "torch-selftest-trace.json"))
    else:
        results = [run_check(ctx, n, f) for n, f in selected]
    failed = [r["check"] for r in results if r["status"] == "fail"]
    report = {
        "status": "fail" if failed else "pass",
        "failed": failed,
        "warnings": [r["message"] for r in results if r["status"] == "warn"],
        "device": ctx.gpu_name or "cpu",
        "emulated": bool(args.emulated),
        "check_timeout_s": args.check_timeout,
        "accelerator": accelerator(ctx),
        "host": platform.node(),
        "torch": torch.__version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "nvidia_smi": nvidia_smi() if ctx.cuda else None,
        "checks": results,
    }
    print_table(report, sys.stderr if args.json == "-" else sys.stdout)
    if args.json:
        text = json.dumps(report, indent=1, default=str)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
