"""The front page stays short and true: every command it shows parses, and every link in it and
in docs/ resolves (the file, and the heading an anchor names)."""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from builder import cli
from harness import docs_tables

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def shell_lines(path: Path) -> list[str]:
    """The commands of the page's ```sh blocks, without comments and redirections."""
    commands, inside = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            inside = line.strip() == "```sh"
            continue
        if inside and line.strip() and not line.lstrip().startswith("#"):
            command = line.split(" #", 1)[0].split(" > ", 1)[0].strip()
            commands.append(command)
    return commands


def nox_sessions() -> set[str]:
    tree = ast.parse((REPO / "noxfile.py").read_text())
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and any("session" in ast.unparse(d) for d in node.decorator_list)
    }


def builder_argv(command: str) -> list[str] | None:
    """The `python -m builder` arguments a README command runs (a nox session passes its
    arguments after `--` to the command of the same name), or None for another program."""
    words = shlex.split(command)
    if words[:3] == ["python", "-m", "builder"]:
        return words[3:]
    if words[:2] == ["./nox", "-s"]:
        session, rest = words[2], words[3:]
        assert session in nox_sessions(), f"{command}: no nox session {session!r}"
        posargs = rest[1:] if rest[:1] == ["--"] else rest
        return [session, *posargs] if session in {"build", "publish", "smoke"} else []
    return None


def test_the_front_page_is_short() -> None:
    assert len(README.read_text().splitlines()) <= 150


def test_the_quick_start_is_the_two_commands_and_ci_runs_the_second() -> None:
    assert shell_lines(README)[:2] == ["./nox -s build", "./nox -s tests"]
    assert "./nox -s tests" in (REPO / ".ci" / "run").read_text().splitlines()


@pytest.mark.parametrize("command", [c for c in shell_lines(README) if builder_argv(c)])
def test_each_builder_command_the_front_page_shows_parses(command: str) -> None:
    argv = builder_argv(command)
    assert argv
    cli.build_parser().parse_args(argv)  # exits 2 on anything the parser does not take


def test_each_builder_command_the_front_page_shows_answers_help() -> None:
    names = sorted({argv[0] for c in shell_lines(README) if (argv := builder_argv(c))})
    assert {"build", "plan", "publish", "update", "ci"} <= set(names)
    for name in names:
        result = subprocess.run(
            [sys.executable, "-m", "builder", name, "--help"], capture_output=True, text=True, cwd=REPO, check=False
        )
        assert result.returncode == 0 and "usage:" in result.stdout, (name, result.stderr)


def slug(heading: str) -> str:
    """A heading's anchor, as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    headings, inside = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            inside = not inside
        elif not inside and line.startswith("#"):
            headings.append(line.lstrip("#"))
    return {slug(h) for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_resolves(page: Path) -> None:
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # an outside address: not checked offline
        name, _, anchor = target.partition("#")
        linked = (page.parent / name).resolve() if name else page
        assert linked.exists(), f"{page.name}: {target} does not exist"
        if anchor:
            assert anchor in anchors(linked), f"{page.name}: {target}: no such heading"


def test_the_front_page_links_every_docs_page() -> None:
    linked = set(LINK.findall(README.read_text()))
    for page in PAGES[1:]:
        assert f"docs/{page.name}" in linked, page.name


FIGURE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?) ?(GB|MB|s|min|minutes|%)(?!\w)")


def test_every_figure_the_front_page_states_is_written_from_its_measurement() -> None:
    """Issue 49: figures copied into prose drift. Each size, time or percentage the README states
    is named, in order, by the figures comment that ends its paragraph; `python -m
    harness.docs_tables` writes it from where it was measured (the sweep's record, or the docs page
    the measurement is on), and it holds what that source says now; none is typed by hand.
    Issue 60: no marker sits in the middle of a sentence."""
    text = README.read_text()
    assert docs_tables.with_figures(text) == text, "the README's figures are stale: run python -m harness.docs_tables"
    notes = docs_tables.figure_notes(text)
    named = [name for _, _, pairs in notes for name, _ in pairs]
    assert len(named) >= 10 and sorted(named) == sorted(docs_tables.FIGURES)
    assert "<!--f:" not in text
    for line in text.splitlines():
        assert "<!-- figures:" not in line or line.strip().startswith("<!-- figures:"), line
    # Every figure in the prose is one its paragraph's comment names.
    prose, done = [], 0
    for paragraph, note_at, pairs in notes:
        stated = FIGURE.findall(text[paragraph:note_at])
        assert [f"{number} {unit}".replace(" %", "%") for number, unit in stated] == [v for _, v in pairs], pairs
        prose.append(text[done:paragraph])
        done = text.index("-->", note_at) + 3
    prose.append(text[done:])
    outside = "\n".join(line for line in "".join(prose).splitlines() if not line.startswith(("`", "docker ", "FROM ")))
    assert FIGURE.findall(outside) == [], "a figure typed into the README: name it in a figures comment"
    # Control: a figure whose source moved is rewritten, in the prose and in its comment.
    moved = text.replace("5.4 GB", "4.2 GB")
    assert moved.count("4.2 GB") == 2 and docs_tables.with_figures(moved) == text


def test_the_front_page_keeps_its_lines_under_120_characters() -> None:
    """Issue 49: a front door read in a terminal or a diff; tables and code blocks too."""
    long = [n for n, line in enumerate(README.read_text().splitlines(), 1) if len(line) > 120]
    assert not long, f"README.md lines over 120 characters: {long}"


def test_the_docs_that_come_from_the_code_are_what_the_code_gives() -> None:
    """Issue 49: docs/development.md's layout table, docs/custom-images.md's key table and
    docs/matrix.schema.json are written by `python -m harness.docs_tables` from the modules'
    docstrings and matrix.yaml's typed fields and their docstrings."""
    assert docs_tables.with_layout(docs_tables.DEVELOPMENT.read_text()) == docs_tables.DEVELOPMENT.read_text(), (
        "docs/development.md's layout table is stale: run python -m harness.docs_tables"
    )
    assert docs_tables.with_keys(docs_tables.CUSTOM_IMAGES.read_text()) == docs_tables.CUSTOM_IMAGES.read_text(), (
        "docs/custom-images.md's matrix.yaml key table is stale: run python -m harness.docs_tables"
    )
    assert docs_tables.SCHEMA.read_text() == docs_tables.matrix_schema(), (
        "docs/matrix.schema.json is stale: run python -m harness.docs_tables"
    )
    assert (REPO / "matrix.yaml").read_text().startswith("# yaml-language-server: $schema=docs/matrix.schema.json\n")
    assert docs_tables.CLI.read_text() == docs_tables.cli_reference(), (
        "docs/cli.md is stale: run python -m harness.docs_tables"
    )


@pytest.mark.parametrize(
    ("docstring", "summary"),
    [
        ("Steps: how a long job says how it goes (`log.step` is the model). More.",
         "How a long job says how it goes (`log.step` is the model)"),
        ("`audit`: what the advisories say. More.", "`audit`: what the advisories say"),
        ("A SOCI index (`publish.soci: true`): what lets a node start early.", "A SOCI index (`publish.soci: true`)"),
        ("A client (distribution) on `requests`, with token (a `WWW-Authenticate: Bearer` challenge, as Docker Hub, "
         "GHCR, Quay and ECR use) and basic authentication, and credentials found the way docker finds them.",
         "A client (distribution) on `requests`, with token..."),
    ],
)  # fmt: skip
def test_a_module_summary_says_something_and_ends_outside_parentheses_and_code(
    docstring: str, summary: str, tmp_path: Path
) -> None:
    module = tmp_path / "module.py"
    module.write_text(f'"""{docstring}"""\n')
    assert docs_tables.first_sentence(module) == summary


def test_no_summary_in_the_layout_table_is_cut_inside_parentheses_or_code() -> None:
    modules = sorted((REPO / "builder").rglob("*.py"))
    assert len(modules) > 100
    for module in modules:
        text = docs_tables.first_sentence(module)
        assert text.count("`") % 2 == 0 and text.count("(") == text.count(")"), f"{module}: {text}"


def test_the_schema_accepts_the_matrix_and_refuses_an_unknown_key(tmp_path: Path) -> None:
    """Editors validate matrix.yaml by it: the shipped matrix passes, a misspelt key does not."""
    schema = json.loads(docs_tables.SCHEMA.read_text())
    data = yaml.safe_load((REPO / "matrix.yaml").read_text())
    jsonschema.validate(data, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**data, "registy": "x"}, schema)


def test_every_key_of_the_matrix_has_a_meaning_in_its_table() -> None:
    """Issue 49: the key table comes from the fields' docstrings, so a key added without one
    shows an empty meaning; none may."""
    rows = [line for line in docs_tables.matrix_keys().splitlines()[2:]]
    empty = [row.split("|")[1].strip() for row in rows if not row.rsplit("|", 2)[-2].strip()]
    assert empty == []
    keys = {row.split("|")[1].strip().strip("`") for row in rows}
    assert {"registry", "bases.<name>.bootstrap.keyring.sha256", "publish.require_rebuilds", "ci.rebuild_check"} <= keys
