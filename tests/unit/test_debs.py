"""Debian package pins: what apt's simulation says it would install, recorded exactly."""

from __future__ import annotations

from pathlib import Path

from builder.lock import debian

SIMULATION = """Reading package lists...
Building dependency tree...
The following NEW packages will be installed:
  gcc-12 libpython3.11 python3
Inst libpython3.11-minimal (3.11.2-6+deb12u6 Debian:12.12/stable [amd64])
Inst gcc-12 (12.2.0-14+deb12u1 Debian:12.12/stable [amd64]) []
Inst libc-bin [2.36-9+deb12u9] (2.36-9+deb12u13 Debian:12.12/stable [amd64])
Conf gcc-12 (12.2.0-14+deb12u1 Debian:12.12/stable [amd64])
"""


def test_simulation_output_becomes_exact_pins_sorted() -> None:
    assert debian.parse_simulation(SIMULATION) == [
        "gcc-12=12.2.0-14+deb12u1",
        "libc-bin=2.36-9+deb12u13",  # an upgrade of a base package is pinned at its new version
        "libpython3.11-minimal=3.11.2-6+deb12u6",
    ]


def test_lock_round_trips_with_its_fingerprint(tmp_path: Path) -> None:
    lock = debian.DebianLock(("gcc-12=12.2.0-14+deb12u1",), ("htop=3.2.2-2",))
    path = tmp_path / debian.DEBIAN_LOCK
    path.write_text(lock.text("0123456789abcdef"))
    assert debian.DebianLock.read(path) == debian.DebianLock(lock.common, lock.flavor, "0123456789abcdef")
