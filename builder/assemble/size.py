"""What a built image is made of: each layer's size, the step that wrote it, and inside it the
packages (or folders) that take the room. `python -m builder size` prints it; the build checks
it against the matrix's size budget.

Sizes are uncompressed: a layer's size is its tar in `docker save`, a package's the bytes of
its files. One streaming pass over `docker save`, no file is held in memory.
"""

from __future__ import annotations

import re
import tarfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import docker

from builder.config.grammar import size_bytes
from builder.config.schema import BudgetSpec
from builder.engine import archive

SITE_PACKAGES = re.compile(
    r"^(?:opt/venv/)?(?:usr/(?:local/)?)?lib/python3[^/]*/(?:site|dist)-packages/([^/]+)(/[^/]+)?"
)
# Namespace packages several wheels share: reported by their second level (nvidia/cudnn).
NAMESPACES = ("nvidia", "cuda")


@dataclass
class Layer:
    index: int  # 1 is the bottom layer (the base's)
    diff_id: str
    step: str  # the Dockerfile step (or bootstrap) that wrote it
    size: int  # bytes of the layer's tar
    parts: Counter[str] = field(default_factory=Counter)  # package or folder -> bytes of its files

    def largest(self, count: int = 5) -> list[tuple[str, int]]:
        return self.parts.most_common(count)


def part_of(path: str) -> str:
    """What a file belongs to, for the report: a Python package by its folder in site-packages
    (its .dist-info counted with it), else its folder three levels down."""
    name = path.removeprefix("./")
    match = SITE_PACKAGES.match(name)
    if match:
        package = re.sub(r"-[^-]+\.(dist|egg)-info$", "", match.group(1)).removesuffix(".libs")
        if package in NAMESPACES and match.group(2):
            package += match.group(2)
        return f"site-packages/{package}"
    return "/".join(name.split("/")[:3])


def _layer_parts(handle: Any) -> Counter[str]:
    parts: Counter[str] = Counter()
    with tarfile.open(fileobj=handle, mode="r|") as layer:
        for info in layer:
            if info.isreg():
                parts[part_of(info.name)] += info.size
    return parts


def layers(engine: docker.DockerClient, image_id: str) -> list[Layer]:
    """The image's layers, bottom first."""
    config, scanned = archive.scan_saved(engine, image_id, lambda _, size, handle: (size, _layer_parts(handle)))
    steps = [h.get("created_by", "") for h in config.get("history", []) if not h.get("empty_layer")]
    diff_ids: list[str] = config.get("rootfs", {}).get("diff_ids", [])
    result = []
    for index, (size, parts) in enumerate(scanned):
        step = steps[index] if index < len(steps) else ""
        result.append(Layer(index + 1, diff_ids[index] if index < len(diff_ids) else "", _short(step), size, parts))
    return result


def _short(step: str) -> str:
    """A history line as a reader wants it: the instruction, without the shell preamble."""
    step = re.sub(r"^/bin/sh -c (#\(nop\) )?", "", step.strip())
    step = re.sub(r"^\|\d+ [A-Z_]+=\S+ /bin/sh -c ", "RUN ", step)  # a RUN with build arguments
    return re.sub(r"\s+", " ", step)


def human(size: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1000
    return f"{size:.2f} GB"


def layer_sizes(engine: docker.DockerClient, image_id: str) -> list[tuple[str, int]]:
    """(step, uncompressed bytes) of each layer, bottom first, as the engine's history says
    (cheap: no `docker save`). Steps that wrote no layer (ENV, LABEL) are left out."""
    history = engine.api.history(image_id)  # newest first
    return [(_short(entry.get("CreatedBy", "")), int(entry["Size"])) for entry in reversed(history) if entry["Size"]]


def over_budget(
    engine: docker.DockerClient,
    image_id: str,
    flavor: str,
    budget: BudgetSpec,
    sized: list[tuple[str, int]] | None = None,
) -> str:
    """Why the image is over its flavor's budget, in one line naming the layer and its largest
    parts ("" when it is within). Decided from the engine's history (`sized`, when the caller
    has read it already); only an image over budget pays for the pass over `docker save` that
    names the parts."""
    sized = layer_sizes(engine, image_id) if sized is None else sized
    total = sum(size for _, size in sized)
    if budget.total and total > size_bytes(budget.total):
        step = max(sized, key=lambda entry: entry[1])[0]
        head = f"{human(total)} in all, over the {budget.total} budget for {flavor}; its largest layer is "
        return head + _named_layer(engine, image_id, step)
    if budget.layer:
        for step, size in sized:
            if size > size_bytes(budget.layer):
                head = f"a layer over the {budget.layer} per-layer budget for {flavor}: "
                return head + _named_layer(engine, image_id, step)
    return ""


def _named_layer(engine: docker.DockerClient, image_id: str, step: str) -> str:
    """The largest layer written by `step`, as a budget error names it: number, size, step and
    largest parts."""
    layer = max((entry for entry in layers(engine, image_id) if entry.step == step), key=lambda entry: entry.size)
    parts = ", ".join(f"{name} {human(size)}" for name, size in layer.largest(3))
    return f"layer {layer.index} ({human(layer.size)}, {layer.step[:70]}): largest {parts}"
