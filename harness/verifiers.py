"""The verifiers platform teams run, for the tests: Debian's cosign and oras packages, fetched
from deb.debian.org by their pinned sha256 into the builder's cache and unpacked (not installed),
as the builder fetches the tools it runs itself.

They run offline: every connection they would make elsewhere (cosign asks Sigstore's TUF
repository for its trust root) goes to a proxy on a closed loopback port, so nothing leaves the
machine, and the loopback registry is reached directly.
"""

from __future__ import annotations

import os
from pathlib import Path

from builder.wheelhouse import tools
from builder.wheelhouse.fileref import FileRef

MIRROR = "http://deb.debian.org/debian"
# Debian sid, as of 2026-12-05: (pool path, sha256).
DEBS = {
    "cosign": ("pool/main/c/cosign/cosign_3.1.1-2_amd64.deb",
               "d8622ebffce1d69197288fc030ff06a4c247af5507107f85c5a878870b686b23"),
    "oras": ("pool/main/o/oras/oras_1.3.3-1_amd64.deb",
             "474f8451e880a64d7daed412baa52febd1c7d988ed778eadac00bdcbdad53af4"),
}  # fmt: skip


def tool(name: str, package: str | None = None) -> Path:
    """The unpacked binary `name` of a pinned package (by default the one named alike), fetched
    and checked the first time, the way the builder fetches the tools it runs
    (builder/wheelhouse/tools.py). A package the builder itself pins (data/tools.yaml: soci's)
    is taken from there, the same file the builder runs."""
    package = package or name
    if package in tools.load():
        return Path(tools.pinned(name, package))
    pool_path, sha256 = DEBS[package]
    filename = Path(pool_path).name
    deb = FileRef(package, filename, f"{MIRROR}/{pool_path}", sha256)
    version = filename.split("_")[1]  # package_version_arch.deb
    return Path(tools.from_package(tools.Package(package, version, (name,), {"amd64": deb}), name))


def offline_environment(home: Path) -> dict[str, str]:
    """An environment in which the tools reach loopback only, with a home of their own."""
    home.mkdir(parents=True, exist_ok=True)
    closed = "http://127.0.0.1:9"  # the discard port: nothing listens, every connection is refused
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "HTTPS_PROXY": closed,
        "HTTP_PROXY": closed,
        "NO_PROXY": "127.0.0.1,localhost",
        "COSIGN_PASSWORD": "",
    }
