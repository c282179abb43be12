"""A CycloneDX SBOM per image: Python packages from the locks, Debian packages from dpkg.

The Python part is made by cyclonedx-py (CycloneDX's maintained tool) from the lock files;
the Debian packages are read from the image's own dpkg database and added as pkg:deb
components, so the SBOM describes what is in the image rather than what was asked for.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import docker

from builder.errors import UserError
from builder.plan.cell import Cell


def python_components(lock_paths: list[Path]) -> list[dict[str, Any]]:
    tool = shutil.which("cyclonedx-py") or str(Path(sys.executable).parent / "cyclonedx-py")
    components: list[dict[str, Any]] = []
    for path in lock_paths:
        result = subprocess.run(
            [tool, "requirements", str(path), "--of", "JSON", "--output-reproducible", "-o", "-"],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise UserError(f"cyclonedx-py could not read {path}: {result.stderr.strip()[:200]}")
        components += json.loads(result.stdout).get("components", [])
    return components


def debian_components(engine: docker.DockerClient, image_id: str, cell: Cell) -> list[dict[str, Any]]:
    listing: bytes = engine.containers.run(
        image_id,
        ["dpkg-query", "-W", "-f", "${Package}\\t${Version}\\t${Architecture}\\n"],
        remove=True,
        network_mode="none",
    )
    components = []
    for line in sorted(listing.decode().splitlines()):
        name, version, architecture = line.split("\t")
        purl = f"pkg:deb/{cell.base.distro}/{name}@{version}?arch={architecture}&distro={cell.base.suite}"
        components.append({"type": "library", "bom-ref": purl, "name": name, "version": version, "purl": purl})
    return components


def build_sbom(
    engine: docker.DockerClient, image_id: str, cell: Cell, lock_paths: list[Path], tag: str
) -> dict[str, Any]:
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.6",
        "version": 1,
        "metadata": {
            "component": {"type": "container", "name": tag, "version": image_id, "bom-ref": image_id},
            "tools": {
                "components": [
                    {"type": "application", "name": "cyclonedx-py"},
                    {"type": "application", "name": "dpkg-query"},
                ]
            },
        },
        "components": python_components(lock_paths) + debian_components(engine, image_id, cell),
    }
