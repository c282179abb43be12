"""The checks the integration tests run on images catch what they are for, on trees made here."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import image_checks


def _listing(root: Path) -> str:
    return subprocess.run(
        ["sh", "-c", image_checks.library_listing(str(root))], capture_output=True, text=True, check=True
    ).stdout


def _library(path: Path, seed: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(seed * (100_000 // len(seed)))
    return path


def test_a_tree_without_duplicates_passes(tmp_path: Path) -> None:
    first = _library(tmp_path / "venv/torch/lib/libtorch_cpu.so", b"torch")
    os.link(first, tmp_path / "venv/torch/lib/libtorch_cpu.so.2")  # one file, two names: fine
    _library(tmp_path / "venv/nvidia/cuda_runtime/lib/libcudart.so.12", b"cudart-12.8")
    listing = _listing(tmp_path)
    assert len(listing.splitlines()) == 3
    assert image_checks.duplicated_libraries(listing) == []


def test_identical_bytes_in_two_files_are_reported(tmp_path: Path) -> None:
    first = _library(tmp_path / "venv/nvidia/cublas/lib/libcublas.so.12", b"cublas")
    (tmp_path / "venv/nvidia/cuda/lib").mkdir(parents=True)
    shutil.copy(first, tmp_path / "venv/nvidia/cuda/lib/libcublas.so.12")
    [problem] = image_checks.duplicated_libraries(_listing(tmp_path))
    assert problem.startswith("identical bytes stored 2 times: ")
    assert "cublas/lib/libcublas.so.12" in problem and "cuda/lib/libcublas.so.12" in problem


def test_a_cuda_library_from_two_sources_is_reported(tmp_path: Path) -> None:
    # A CUDA base image's runtime plus the wheel's: different bytes, the same library twice.
    _library(tmp_path / "usr/local/cuda/lib64/libcudart.so.12.4.127", b"cudart-from-base")
    _library(tmp_path / "venv/nvidia/cuda_runtime/lib/libcudart.so.12", b"cudart-from-wheel")
    [problem] = image_checks.duplicated_libraries(_listing(tmp_path))
    assert problem.startswith("libcudart.so in 2 different builds: ")


def _certificate(tmp_path: Path, name: str) -> bytes:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is missing; `nox -s tests` installs it (engine --install --test-tools)")
    key, cert = tmp_path / f"{name}.key", tmp_path / f"{name}.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", f"/CN={name}"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert.read_bytes()


def test_certificates_only_the_host_trusts_are_found_and_betrayed_by_their_needles(tmp_path: Path) -> None:
    public, proxy = _certificate(tmp_path, "public-root"), _certificate(tmp_path, "site-proxy")
    dropped = _certificate(tmp_path, "public-root-a-newer-distro-dropped")
    extra = image_checks.host_only_certificates(public + dropped + proxy, public, host_public=public + dropped)
    assert extra == image_checks.certificates(proxy) and len(extra) == 1
    needles = image_checks.needles(extra)
    der = next(iter(extra))
    assert any(n in proxy for n in needles)  # as a PEM file
    assert any(n in der for n in needles)  # as DER bytes
    assert not any(n in public for n in needles)  # and not in another certificate
