"""Flavors: what each kind of image adds on top of the shared torch stack (data/flavors.yaml)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from builder.cell import Cell
from builder.compat import DATA_DIR

FLAVORS_FILE = DATA_DIR / "flavors.yaml"


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
    common_system: tuple[str, ...]
    common_python: tuple[str, ...]
    flavors: dict[str, Flavor]


@cache
def load(path: Path = FLAVORS_FILE) -> FlavorTable:
    raw: dict[str, Any] = yaml.safe_load(path.read_text())
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
    return FlavorTable(tuple(raw["common"]["system"]), tuple(raw["common"]["python"]), flavors)


def names() -> list[str]:
    return list(load().flavors)


def stack_requirements(cell: Cell) -> list[str]:
    """The torch stack every flavor of this torch build shares: torch at its exact build, plus common."""
    return [f"torch=={cell.torch.version}", *load().common_python]


def stack_overrides(cell: Cell) -> list[str]:
    """Pins that replace torch's own: a cuDNN raised above torch's exact pin (never lowered)."""
    if not cell.cudnn_overridden:
        return []
    package = next(name for name in cell.torch.pins if name.startswith("nvidia-cudnn"))
    return [f"{package}=={cell.cudnn}"]


def flavor_requirements(cell: Cell) -> list[str]:
    """What the cell's flavor adds to the stack, with the torch wheel's own pins filled in."""
    flavor = load().flavors[cell.flavor]
    values = {
        "cuda": cell.cuda,
        "cuda_major": cell.torch.cuda_major or "",
        "cuda_toolkit": cell.torch.cuda_toolkit or "",
        "trtllm": cell.trtllm or "",
    }
    templates = list(flavor.python)
    if cell.is_cuda:
        templates += flavor.python_cuda_toolkit if cell.torch.cuda_toolkit else flavor.python_cuda_legacy
    return [template.format(**values) for template in templates]
