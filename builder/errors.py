"""User-facing errors: one line, exit status 2, nothing built.

Anything the user can fix by editing input (matrix.yaml, a lock, a flag) raises UserError;
the CLI prints its single line and exits 2. Bugs keep their tracebacks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

EXIT_USER_ERROR = 2


@dataclass
class Location:
    """Where in an input file a problem sits."""

    path: Path
    line: int | None = None

    def __str__(self) -> str:
        return f"{self.path}:{self.line}" if self.line else str(self.path)


class UserError(Exception):
    """A problem with the user's input, reported as one line."""

    def __init__(self, message: str, where: Location | Path | str | None = None, field: str | None = None) -> None:
        self.message, self.where, self.field = message, where, field
        super().__init__(self.line())

    def line(self) -> str:
        parts = [str(self.where)] if self.where else []
        if self.field:
            parts.append(self.field)
        parts.append(self.message)
        return ": ".join(parts)
