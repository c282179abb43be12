"""Flavors: what each kind of image adds on top of the shared torch stack (data/flavors.yaml)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from builder import paths
from builder.config import grammar, yamlsource
from builder.errors import UserError

FLAVORS_FILE = paths.DATA / "flavors.yaml"


@dataclass(frozen=True)
class Flavor:
    name: str
    description: str
    system: tuple[str, ...]
    python: tuple[str, ...]
    python_cuda_toolkit: tuple[str, ...] = ()
    python_cuda_legacy: tuple[str, ...] = ()
    requires_cuda: bool = False


@dataclass(frozen=True)
class FlavorTable:
    shared_system: tuple[str, ...]
    common_python: tuple[str, ...]
    flavors: dict[str, Flavor]
    system_by_python: dict[str, tuple[str, ...]]

    def common_system(self, python: str) -> tuple[str, ...]:
        """The Debian packages every image of this Python gets."""
        return (*self.shared_system, *self.system_by_python.get(python, ()))


def _checked(path: Path, raw: dict[str, Any]) -> dict[str, Any]:
    """Every Debian package name and Python requirement in the file, against its grammar: they
    reach the Dockerfiles and the resolver."""
    groups = [("common", raw["common"]), *((f"flavors.{name}", spec) for name, spec in raw["flavors"].items())]
    for where, spec in groups:
        if where != "common" and not grammar.NAME.matches(where.removeprefix("flavors.")):
            raise UserError(f"flavor name {where!r} is not {grammar.NAME.hint}", path, where)
        by_python = spec.get("system_by_python", {}) if where == "common" else {}
        for package in [*spec.get("system", []), *(p for group in by_python.values() for p in group)]:
            if not isinstance(package, str) or not grammar.DEBIAN_PACKAGE.matches(package):
                raise UserError(f"{package!r} is not {grammar.DEBIAN_PACKAGE.hint}", path, f"{where}.system")
        for key in ("python", "python_cuda_toolkit", "python_cuda_legacy"):
            for requirement in spec.get(key, []):
                if not isinstance(requirement, str) or not re.fullmatch(r"[A-Za-z0-9_.\[\]{}~=<>!,-]+", requirement):
                    raise UserError(
                        f"{requirement!r} is not a requirement such as numpy or ninja==1.11 (fields in braces)",
                        path,
                        f"{where}.{key}",
                    )
    return raw


@cache
def load(path: Path = FLAVORS_FILE) -> FlavorTable:
    data, _ = yamlsource.load(path, "data/flavors.yaml ships with the builder")
    raw: dict[str, Any] = _checked(path, data)
    flavors = {
        name: Flavor(
            name=name,
            description=spec["description"],
            system=tuple(spec.get("system", [])),
            python=tuple(spec.get("python", [])),
            python_cuda_toolkit=tuple(spec.get("python_cuda_toolkit", [])),
            python_cuda_legacy=tuple(spec.get("python_cuda_legacy", [])),
            requires_cuda=bool(spec.get("requires_cuda", False)),
        )
        for name, spec in raw["flavors"].items()
    }
    by_python = {str(k): tuple(v) for k, v in raw["common"].get("system_by_python", {}).items()}
    return FlavorTable(tuple(raw["common"]["system"]), tuple(raw["common"]["python"]), flavors, by_python)


def names() -> list[str]:
    return list(load().flavors)
