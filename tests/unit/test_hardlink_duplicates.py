"""templates/scripts/hardlink-duplicates.py links the byte-identical files of the packages its pip
step installed (named by the step's lock, listed by their RECORDs) and never touches or reads a
file of the layers below, whatever its modification time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from builder import paths

SCRIPT = paths.TEMPLATES / "scripts" / "hardlink-duplicates.py"
LIBRARY = os.urandom(1 << 17)  # above the script's minimum


def _install(site: Path, project: str, files: dict[str, bytes]) -> None:
    """A package as pip leaves it: its files, and a dist-info whose RECORD lists them."""
    info = site / f"{project}-1.0.dist-info"
    info.mkdir(parents=True)
    rows = []
    for name, data in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_bytes(data)
        rows.append(f"{name},sha256=unchecked,{len(data)}")
    (info / "RECORD").write_text("\n".join([*rows, f"{info.name}/RECORD,,"]) + "\n")


def _run(venv: Path, lock: Path) -> str:
    done = subprocess.run([sys.executable, str(SCRIPT), str(venv), str(lock)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_only_the_steps_own_identical_files_are_linked_and_the_layers_below_are_not_read(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    _install(site, "lower_pkg", {"lower/libcuda.so": LIBRARY})  # an earlier step's package
    _install(site, "step_pkg", {"step/libcuda.so": LIBRARY, "step/libcuda.so.13": LIBRARY, "step/small": b"x"})
    os.utime(site / "lower" / "libcuda.so", (2_000_000_000, 2_000_000_000))  # newer than anything: no matter
    lock = tmp_path / "requirements.step.lock"
    lock.write_text("step-pkg==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    output = _run(venv, lock)
    step_files = [site / "step" / "libcuda.so", site / "step" / "libcuda.so.13"]
    assert step_files[0].stat().st_ino == step_files[1].stat().st_ino
    assert (site / "lower" / "libcuda.so").stat().st_nlink == 1  # never linked, so never copied up
    assert f"{2 * len(LIBRARY) / 1e6:.1f} MB read" in output  # the step's two candidates, not the lower file


def test_a_file_pruned_after_pip_wrote_it_is_passed_over(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    _install(site, "step_pkg", {"a.so": LIBRARY, "b.so": LIBRARY, "extra/c.so": LIBRARY})
    (site / "extra" / "c.so").unlink()
    lock = tmp_path / "requirements.step.lock"
    lock.write_text("step-pkg==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    _run(venv, lock)
    assert (site / "a.so").stat().st_ino == (site / "b.so").stat().st_ino
    assert not (site / "extra" / "c.so").exists()
