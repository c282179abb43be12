"""The GitHub actions the emitted workflows use, pinned by commit (data/github-actions.yaml).

A workflow that names `actions/checkout@v7` runs whatever that tag points at on the day; the
action's owners (or whoever takes their account) can move it. A commit cannot be moved, so every
`uses:` the builder writes names one, with the release beside it as a comment for the update
bots. The file ships with the builder and is read like every other data file: bounded YAML, each
field against its grammar, one line naming the file and line when something is off."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated

from builder import paths
from builder.config import grammar, validated, yamlsource
from builder.errors import UserError

ACTIONS_FILE = paths.DATA / "github-actions.yaml"


@dataclass(frozen=True)
class Pin:
    name: str  # owner/repository
    version: str  # the release tag the commit was looked up from
    commit: str  # 40 hex digits

    @property
    def uses(self) -> str:
        """What a workflow's `uses:` says: the commit, and the release as a comment."""
        return f"{self.name}@{self.commit} # {self.version}"


class PinSpec(validated.Strict):
    version: Annotated[str, validated.field(grammar.ACTION_VERSION)]
    commit: Annotated[str, validated.field(grammar.COMMIT)]


class ActionsFile(validated.Strict):
    actions: dict[Annotated[str, validated.field(grammar.ACTION)], PinSpec]


@cache
def load(path: Path = ACTIONS_FILE) -> dict[str, Pin]:
    data, source = yamlsource.load(path, "data/github-actions.yaml ships with the builder")
    spec = validated.validate(ActionsFile, data, source, "actions")
    return {name: Pin(name, pin.version, pin.commit) for name, pin in spec.actions.items()}


def uses(name: str, pins: dict[str, Pin] | None = None) -> str:
    """The pinned `uses:` text of one action; a template naming an action the file lacks is the
    builder's own mistake, said in one line."""
    pins = load() if pins is None else pins
    if name not in pins:
        raise UserError(f"data/github-actions.yaml pins no {name!r}; add its release and commit there")
    return pins[name].uses
