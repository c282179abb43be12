"""Flavors: what each kind of image adds on top of the shared torch stack (data/flavors.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from builder import paths
from builder.config import validated, yamlsource

FLAVORS_FILE = paths.DATA / "flavors.yaml"


@dataclass(frozen=True)
class Flavor:
    name: str
    description: str
    system: tuple[str, ...]
    python: tuple[str, ...]
    python_cuda_toolkit: tuple[str, ...] = ()
    python_cuda_compiler: dict[str, tuple[str, ...]] = field(default_factory=dict)
    needs_cuda_compiler: bool = False
    requires_cuda: bool = False

    def cuda_requirements(self, cuda_toolkit: str | None, cuda_major: str | None) -> tuple[str, ...] | None:
        """What this flavor adds on a CUDA build: the toolkit's extras where torch pins cuda-toolkit,
        else the compiler wheel of its CUDA major; None where it needs a compiler no wheel gives."""
        if cuda_toolkit:
            return self.python_cuda_toolkit
        compiler = self.python_cuda_compiler.get(cuda_major or "")
        if compiler is None:
            return None if self.needs_cuda_compiler else ()
        return compiler


@dataclass(frozen=True)
class FlavorTable:
    shared_system: tuple[str, ...]
    common_python: tuple[str, ...]
    flavors: dict[str, Flavor]
    system_by_python: dict[str, tuple[str, ...]]

    def common_system(self, python: str) -> tuple[str, ...]:
        """The Debian packages every image of this Python gets."""
        return (*self.shared_system, *self.system_by_python.get(python, ()))


class CommonSpec(validated.Strict):
    system: list[validated.DebianPackage]
    system_by_python: dict[validated.Version, list[validated.DebianPackage]] = {}
    python: list[validated.Requirement]


class FlavorSpec(validated.Strict):
    description: str
    system: list[validated.DebianPackage] = []
    python: list[validated.Requirement] = []
    python_cuda_toolkit: list[validated.Requirement] = []
    python_cuda_compiler: dict[validated.Name, list[validated.Requirement]] = {}
    needs_cuda_compiler: bool = False
    requires_cuda: bool = False


class FlavorsFile(validated.Strict):
    common: CommonSpec
    flavors: dict[validated.Name, FlavorSpec]


@cache
def load(path: Path = FLAVORS_FILE) -> FlavorTable:
    data, source = yamlsource.load(path, "data/flavors.yaml ships with the builder")
    spec = validated.validate(FlavorsFile, data, source, "common, flavors")
    flavors = {
        name: Flavor(
            name=name,
            description=entry.description,
            system=tuple(entry.system),
            python=tuple(entry.python),
            python_cuda_toolkit=tuple(entry.python_cuda_toolkit),
            python_cuda_compiler={major: tuple(r) for major, r in entry.python_cuda_compiler.items()},
            needs_cuda_compiler=entry.needs_cuda_compiler,
            requires_cuda=entry.requires_cuda,
        )
        for name, entry in spec.flavors.items()
    }
    by_python = {version: tuple(packages) for version, packages in spec.common.system_by_python.items()}
    return FlavorTable(tuple(spec.common.system), tuple(spec.common.python), flavors, by_python)


def names() -> list[str]:
    return list(load().flavors)
