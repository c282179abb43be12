"""vex.yaml: the findings a team reviewed and decided do not affect its images, each with its
reason. Beside matrix.yaml, optional, and reviewed like code (it arrives through pull requests,
so it is read with the same bounded loader and grammars as the matrix).

Each statement becomes an OpenVEX statement (`not_affected`, with OpenVEX's justification and the
team's impact statement) that `publish push --sign-key` signs and attaches to every image it names,
so that scanners reading VEX show the finding as not affecting the image, with the reason; and
`audit` lists the finding as not affected instead of counting it against `--fail-on`.

    statements:
      - vulnerability: GHSA-cpwx-vrp4-4pq7
        package: jinja2
        cells: ["2.13.0-*"]            # cell names or fnmatch patterns; default: every cell
        justification: vulnerable_code_not_in_execute_path
        impact: the images never render templates from untrusted input
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from builder.config import grammar, validated, yamlsource

VEX_FILE = "vex.yaml"
# OpenVEX's justifications for `not_affected` (https://github.com/openvex/spec).
Justification = Literal[
    "component_not_present",
    "vulnerable_code_not_present",
    "vulnerable_code_not_in_execute_path",
    "vulnerable_code_cannot_be_controlled_by_adversary",
    "inline_mitigations_already_exist",
]


ECOSYSTEM = "pypi"  # what a decision may cover: the Python packages' advisories (OSV's PyPI records)


class Statement(validated.Strict):
    vulnerability: Annotated[str, validated.field(grammar.VEX_VULNERABILITY)]
    package: Annotated[str, validated.field(grammar.NAME)]
    cells: list[Annotated[str, validated.field(grammar.CELL_PATTERN)]] = ["*"]
    justification: Justification
    impact: Annotated[str, validated.field(grammar.IMPACT)]


class VexFile(validated.Strict):
    statements: list[Statement]


@dataclass(frozen=True)
class Decision:
    """One reviewed `not_affected`: an advisory, for a package, in the cells it names."""

    vulnerability: str
    package: str
    cells: tuple[str, ...]
    justification: str
    impact: str

    def covers(self, cell: str, package: str, advisory: str, ecosystem: str = "pypi") -> bool:
        """Whether the decision is about this finding. Only a Python package's advisory: a
        Debian finding names the security suite its fix is in, not an advisory, and a decision
        naming the suite would silence every later fix of the package."""
        return (
            ecosystem == ECOSYSTEM
            and package.lower() == self.package
            and advisory == self.vulnerability
            and any(fnmatch.fnmatchcase(cell, pattern) for pattern in self.cells)
        )

    def applies_to(self, cell: str) -> bool:
        return any(fnmatch.fnmatchcase(cell, pattern) for pattern in self.cells)


def load(matrix_path: Path) -> tuple[Decision, ...]:
    """The decisions in vex.yaml beside the matrix; none when there is no such file."""
    path = matrix_path.resolve().parent / VEX_FILE
    if not path.exists():
        return ()
    data, source = yamlsource.load(path, f"{VEX_FILE} lists reviewed not-affected findings")
    parsed = validated.validate(VexFile, data, source, "statements")
    return tuple(
        Decision(s.vulnerability, s.package, tuple(s.cells), s.justification, s.impact) for s in parsed.statements
    )
