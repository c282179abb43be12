"""`python -m builder audit`: security fixes the cells' locks do not have yet."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.table import Table
from rich.text import Text

from builder.commands.common import Register, console, grid_of
from builder.config import vex
from builder.lock import audit
from builder.terminal import SafeConsole, markdown_text, printable


def add(register: Register) -> None:
    audit_cmd = register(
        "audit",
        "list the cells' locked packages that a security fix has since replaced (Debian) or that an advisory names",
        "Debian packages against each base's security archive, read from its signed index (a stale index, past its "
        "Valid-Until, is refused); Python packages against OSV records given with --osv DIR. Exits 1 when a "
        "finding is at or above --fail-on, unless vex.yaml beside the matrix records it as reviewed and not "
        "affecting the cell (listed, with the reason). Needs the distro mirrors; no engine.",
    )
    audit_cmd.add_argument("cells", nargs="*", help="cells to audit (default: every buildable cell)")
    audit_cmd.add_argument("--osv", type=Path, metavar="DIR", help="a folder of OSV records (osv.dev's PyPI export)")
    output = audit_cmd.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the findings as JSON instead of a table")
    output.add_argument(
        "--markdown",
        action="store_true",
        help="print the findings as a Markdown table, every advisory's text escaped (the security job's pull request "
        "body: an advisory can open no link, mention, image or HTML there)",
    )
    audit_cmd.add_argument(
        "--fail-on",
        choices=audit.SEVERITIES,
        default="high",
        help="exit 1 when a finding is at least this severe (default: high; a Debian security update counts as high)",
    )
    audit_cmd.set_defaults(func=run, all=False)


def run(args: argparse.Namespace) -> int:
    grid = grid_of(args)
    cells = grid.select(args.cells) if args.cells else grid.cells
    advisories = audit.read_osv(args.osv, _warn) if args.osv else []
    findings = audit.findings_of(cells, advisories, vex.load(grid.path))
    if args.markdown:
        print(_markdown(findings, len(cells), bool(args.osv)))
    else:
        _print(findings, args.json, len(cells), bool(args.osv))
    # A finding vex.yaml's reviewed decision covers is listed, with its reason, and does not fail.
    failing = [f for f in findings if not f.not_affected and audit.rank(f.severity) >= audit.rank(args.fail_on)]
    return 1 if failing else 0


def _needs(finding: audit.Finding) -> str:
    if finding.not_affected:
        return f"nothing: not affected ({finding.not_affected}, vex.yaml)"
    return finding.needs or "-"


def _print(findings: list[audit.Finding], as_json: bool, cells: int, python: bool) -> None:
    if as_json:
        json.dump([f.row() for f in findings], sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    table = Table("cell", "package", "locked", "fixed in", "advisory", "severity", "needs")
    for f in findings:  # OSV's and the archive's text: escaped, and never read as markup
        table.add_row(*(Text(printable(value)) for value in _row(f)))
    if findings:
        SafeConsole(file=sys.stdout, width=200).print(table)
    console.print(f"{len(findings)} findings in {cells} cells ({_scope(python)})")


def _row(finding: audit.Finding) -> tuple[str, ...]:
    """A finding's cells, as the table and the Markdown table show them."""
    f = finding
    return (f.cell, f"{f.package} ({f.ecosystem})", f.locked, f.fixed or "-", f.advisory, f.severity, _needs(f))


def _scope(python: bool) -> str:
    return "Debian packages" + (" and Python packages (OSV)" if python else "; no --osv: Python packages not checked")


def _markdown(findings: list[audit.Finding], cells: int, python: bool) -> str:
    lines = [f"{len(findings)} findings in {cells} cells ({_scope(python)})", ""]
    if findings:
        lines += [
            "| cell | package | locked | fixed in | advisory | severity | needs |",
            "|---|---|---|---|---|---|---|",
        ]
        for f in findings:
            lines.append("| " + " | ".join(markdown_text(value) for value in _row(f)) + " |")
    return "\n".join(lines)


def _warn(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr)
