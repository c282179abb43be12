"""data/tools.yaml, validated: the tools the builder runs where the machine lacks them, each a
Debian package pinned by its path in the archive and its sha256. The wheelhouse fetches the ones
publish runs (builder/wheelhouse/tools.py); emulation fetches qemu (builder/engine/emulation.py)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Annotated

from builder import paths
from builder.config import grammar, validated, yamlsource

TOOLS_FILE = paths.DATA / "tools.yaml"


class DebSpec(validated.Strict):
    path: Annotated[str, validated.field(grammar.DEBIAN_POOL_PATH)]
    sha256: Annotated[str, validated.field(grammar.SHA256)]


class ToolSpec(validated.Strict):
    version: Annotated[str, validated.field(grammar.DEBIAN_VERSION)]
    binaries: list[Annotated[str, validated.field(grammar.PROGRAM_NAME)]]
    debs: dict[Annotated[str, validated.field(grammar.DEBIAN_ARCHITECTURE)], DebSpec]


class ToolsFile(validated.Strict):
    mirror: Annotated[str, validated.field(grammar.URL)]
    tools: dict[Annotated[str, validated.field(grammar.DEBIAN_PACKAGE)], ToolSpec]


@cache
def spec(path: Path = TOOLS_FILE) -> ToolsFile:
    data, source = yamlsource.load(path, "data/tools.yaml ships with the builder")
    return validated.validate(ToolsFile, data, source, "tools")
