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


def spdx_of(cyclonedx: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The same inventory as an SPDX 2.3 document, for the scanners and policies that read SPDX:
    one package per CycloneDX component (name, version, purl), all described by the document.
    Nothing is read again: it is the CycloneDX SBOM, written the other way."""
    found_metadata = cyclonedx.get("metadata")
    metadata: dict[str, Any] = found_metadata if isinstance(found_metadata, dict) else {}
    found_image = metadata.get("component")
    image: dict[str, Any] = found_image if isinstance(found_image, dict) else {}
    packages = []
    for number, component in enumerate(c for c in cyclonedx.get("components", []) if isinstance(c, dict)):
        package: dict[str, Any] = {
            "SPDXID": f"SPDXRef-Package-{number}",
            "name": str(component.get("name", "")),
            "versionInfo": str(component.get("version", "")),
            "downloadLocation": "NOASSERTION",
            "filesAnalyzed": False,
        }
        if component.get("purl"):
            package["externalRefs"] = [
                {
                    "referenceCategory": "PACKAGE-MANAGER",
                    "referenceType": "purl",
                    "referenceLocator": str(component["purl"]),
                }
            ]
        packages.append(package)
    return {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": str(image.get("name", "image")),
        "documentNamespace": namespace,
        # A fixed date: the document is a function of the SBOM, so one image always gets the same bytes.
        "creationInfo": {
            "created": "1970-01-01T00:00:00Z",
            "creators": ["Tool: torch-images (from its CycloneDX SBOM)"],
        },
        "packages": packages,
        "relationships": [
            {"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES", "relatedSpdxElement": p["SPDXID"]}
            for p in packages
        ],
    }
