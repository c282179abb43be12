"""data/layout.yaml: the torch stack's layers by package group, and what is pruned, validated."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder import paths
from builder.assemble import size
from builder.config import layout
from builder.errors import UserError

SCRIPTS = paths.TEMPLATES / "scripts"


def test_the_shipped_layout_splits_the_flagship_stack_with_no_group_above_two_gigabytes() -> None:
    names = ["nvidia-cudnn-cu13", "nvidia-cublas", "nvidia-cufft", "nvidia-nccl-cu13", "cuda-bindings", "triton",
             "torch", "numpy", "setuptools", "filelock"]  # fmt: skip
    assert layout.load().split(names) == [
        ("venv", ["setuptools"]),
        ("cudnn", ["nvidia-cudnn-cu13"]),
        ("cuda-math", ["nvidia-cublas", "nvidia-cufft"]),
        ("cuda-runtime", ["cuda-bindings", "nvidia-nccl-cu13"]),
        ("triton", ["triton"]),
        ("torch", ["torch"]),
        ("numerics", ["numpy"]),
        ("rest", ["filelock"]),
    ]


def test_a_cpu_stack_skips_the_groups_it_has_no_package_for() -> None:
    assert [name for name, _ in layout.load().split(["torch", "numpy", "sympy"])] == ["torch", "numerics"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("layers: []\nprune:\n  - {paths: ['../../etc/passwd'], why: x}\n", "write a path under site-packages"),
        ("layers: []\nprune:\n  - {paths: ['/usr/lib'], why: x}\n", "write a path under site-packages"),
        ("layers: []\nprune:\n  - {paths: [\"a'; curl x | sh; '\"], why: x}\n", "write a path under site-packages"),
        ("layers: []\nprune:\n  - {paths: [triton/x]}\n", "prune[0].why: is required and missing"),
        ("layers:\n  - {name: x, why: y, packages: ['torch && curl']}\nprune: []\n", "write a package name pattern"),
        ("layers:\n  - {name: rest, why: y, packages: [torch]}\nprune: []\n", "name"),
        (
            "layers: []\nprune: []\ndpkg:\n  - {exclude: ['/usr/share/doc/*\\n RUN x'], why: y}\n",
            "write an absolute path glob",
        ),
        ("layers: []\nprune: []\ndpkg:\n  - {exclude: [usr/share/doc], why: y}\n", "write an absolute path glob"),
        ("layers: []\nprune: []\ndpkg:\n  - {exclude: ['/usr/share/doc/*']}\n", "dpkg[0].why: is required and missing"),
        (
            "layers: []\nprune: []\ndpkg:\n  - {exclude: ['/x'], why: y, kept_by: ['devel; rm -rf /']}\n",
            "kept_by[0]: 'devel; rm -rf /' is not valid",
        ),
        ("layers: []\nprune: []\ndpkg:\n  - {exclude: ['/x'], why: y, kept_by: [nightly]}\n", "not a flavor"),
    ],
)
def test_a_layout_entry_that_could_reach_a_dockerfile_unchecked_is_refused(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "layout.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as caught:
        layout.load.__wrapped__(path)
    assert message in caught.value.line() and str(path) in caught.value.line()


def _left_after_pruning(tmp_path: Path, files: list[str], patterns: list[str]) -> list[str]:
    """Files left in a site-packages holding `files` once the images' prune script has run."""
    site = tmp_path / "site-packages"
    for path in files:
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_bytes(b"x" * 10)
    subprocess.run([sys.executable, str(SCRIPTS / "prune-paths.py"), str(site), *patterns], check=True)
    return sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())


def test_prune_paths_removes_what_the_patterns_name_and_nothing_else(tmp_path: Path) -> None:
    files = ["triton/backends/amd/lib.so", "triton/backends/nvidia/lib/cupti/libcupti_static.a",
             "triton/backends/nvidia/lib/cupti/libcupti.so", "numpy/_core/tests/test_x.py",
             "numpy/tests/test_y.py", "numpy/_core/multiarray.py"]  # fmt: skip
    patterns = ["triton/backends/amd", "triton/backends/nvidia/lib/cupti*/*_static.a", "numpy/**/tests"]
    assert _left_after_pruning(tmp_path, files, patterns) == [
        "numpy/_core/multiarray.py",
        "triton/backends/nvidia/lib/cupti/libcupti.so",
    ]


# Files a runtime opens: `import triton` imports every backend its entry points name (AMD's
# too), torch.compile runs ptxas, the profilers load CUPTI, torch's Triton-NVSHMEM path reads
# the device bitcode. The shipped prune list must leave every one of them.
OPENED_AT_RUNTIME = [
    "nvidia/cu13/lib/libcusolver.so.12", "nvidia/nvshmem/lib/libnvshmem_device.bc",
    "numpy/testing/__init__.py", "torch/testing/__init__.py", "triton/backends/amd/__init__.py",
    "triton/backends/amd/compiler.py", "triton/backends/amd/driver.py", "triton/backends/nvidia/bin/ptxas",
    "triton/backends/nvidia/compiler.py", "triton/backends/nvidia/lib/cupti/libcupti.so.12",
    "triton/profiler/__init__.py",
]  # fmt: skip
NEVER_OPENED = [
    "nvidia/cu13/lib/libcusolverMg.so.12", "numpy/_core/tests/test_x.py", "torch/bin/protoc",
    "triton/backends/amd/lib/libtriton_amd_codegen.so", "triton/backends/nvidia/lib/cupti/libcupti_static.a",
]  # fmt: skip


def test_the_shipped_prune_list_keeps_what_a_runtime_opens_and_removes_the_rest(tmp_path: Path) -> None:
    left = _left_after_pruning(tmp_path, OPENED_AT_RUNTIME + NEVER_OPENED, list(layout.load().prune))
    assert left == sorted(OPENED_AT_RUNTIME)


def test_sizes_are_reported_by_package_in_site_packages_and_by_folder_elsewhere() -> None:
    assert size.part_of("opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so") == "site-packages/torch"
    assert size.part_of("opt/venv/lib/python3.11/site-packages/torch-2.15.0.dist-info/RECORD") == "site-packages/torch"
    assert size.part_of("opt/venv/lib/python3.11/site-packages/numpy.libs/x.so") == "site-packages/numpy"
    assert size.part_of("usr/lib/gcc/x86_64-linux-gnu/12/cc1") == "usr/lib/gcc"
    nvidia = "opt/venv/lib/python3.11/site-packages/nvidia/cudnn/lib/libcudnn.so.9"
    assert size.part_of(nvidia) == "site-packages/nvidia/cudnn"
    assert size.human(5_640_000_000) == "5.64 GB" and size.human(999) == "999 B"


def test_the_base_and_a_flavor_that_keeps_a_rule_leave_it_out_of_their_dpkg_lines(tmp_path: Path) -> None:
    path = tmp_path / "layout.yaml"
    path.write_text(
        "layers: []\nprune: []\ndpkg:\n"
        "  - {exclude: ['/usr/share/doc/*'], keep: ['/usr/share/doc/*/copyright'], why: docs}\n"
        "  - {exclude: ['/usr/lib/gcc/*/lto1'], kept_by: [devel], why: lto}\n"
    )
    rules = layout.load.__wrapped__(path)
    docs = ("path-exclude=/usr/share/doc/*", "path-include=/usr/share/doc/*/copyright")
    assert rules.dpkg == (*docs, "path-exclude=/usr/lib/gcc/*/lto1")  # the shared layer leaves both out
    assert rules.dpkg_for("runtime") == rules.dpkg
    assert rules.dpkg_for("devel") == rules.dpkg_for(None) == docs
    assert rules.restored_by("devel") == ("/usr/lib/gcc/*/lto1",) and rules.restored_by("runtime") == ()
    assert layout.leaves_out(rules.rules, "/usr/share/doc/gcc/README.gz")
    assert not layout.leaves_out(rules.rules, "/usr/share/doc/gcc/copyright")
    assert not layout.leaves_out(rules.rules_for("devel"), "/usr/lib/gcc/x86_64-linux-gnu/12/lto1")


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="needs dpkg's database (a Debian or Ubuntu host)")
def test_owners_of_names_the_packages_of_matching_files_and_fails_when_nothing_owns_any_glob() -> None:
    script = str(SCRIPTS / "owners-of.sh")
    found = subprocess.run(["sh", script, "/usr/bin/dpkg-quer*", "/usr/bin/dpkg"], capture_output=True, text=True)
    assert found.returncode == 0 and found.stdout == "dpkg\n", found.stderr
    one_missing = subprocess.run(["sh", script, "/nowhere/*", "/usr/bin/dpkg"], capture_output=True, text=True)
    assert one_missing.returncode == 0 and one_missing.stdout == "dpkg\n", one_missing.stderr
    missing = subprocess.run(["sh", script, "/nowhere/*", "/nor/here"], capture_output=True, text=True)
    assert missing.returncode != 0 and "no package owns any of: /nowhere/* /nor/here" in missing.stderr
