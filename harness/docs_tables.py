"""Docs that come from the code (issue 49), as cibuildwheel writes its options table: the layout
table in docs/development.md (each folder's docstring and each module's first sentence), the
key table of matrix.yaml in docs/custom-images.md and its JSON schema (docs/matrix.schema.json),
both from the typed fields that read it and their docstrings (builder/config/schema.py); and the
README's figures, each from the record or page its measurement was written to (FIGURES).

`python -m harness.docs_tables` writes them; tests/unit/test_docs.py fails when what is
committed is not what the code gives."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import math
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

from builder import cli, confined
from builder.assemble import sweep
from builder.errors import UserError

REPO = Path(__file__).resolve().parents[1]
DEVELOPMENT = REPO / "docs" / "development.md"
SCHEMA = REPO / "docs" / "matrix.schema.json"
CUSTOM_IMAGES = REPO / "docs" / "custom-images.md"
START, END = "<!-- layout: written by python -m harness.docs_tables; do not edit -->", "<!-- layout end -->"
KEYS_START = "<!-- matrix keys: written by python -m harness.docs_tables from builder/config/schema.py; do not edit -->"
KEYS_END = "<!-- matrix keys end -->"
FIELDS_START = "<!-- tag fields: written by python -m harness.docs_tables from builder/plan/cell.py; do not edit -->"
FIELDS_END = "<!-- tag fields end -->"
CPU_CELL = "2.13.0-cpu-bookworm-runtime"
# The folders in the order data flows through them, then the mechanisms and the command line.
FOLDERS = ("config", "facts", "plan", "engine", "lock", "wheelhouse", "render", "repro", "assemble", "publish",
           "oci", "commands")  # fmt: skip
MAX_SENTENCE = 110
README = REPO / "README.md"
SWEEP_RECORD = REPO / "images" / "sweep.json"
FLAGSHIP = "2.15.0-cu13.2-bookworm-runtime"
# The README's figures are plain text; a comment at the end of each paragraph (or list item) that
# states some names them in order, <!-- figures: NAME=VALUE; NAME=VALUE -->, so the prose reads
# without markers and the writer still knows which text each figure is.
FIGURES_NOTE = re.compile(r"<!-- figures: ([^>]*?) -->")


def first_sentence(path: Path) -> str:
    """A module's docstring, to its first full stop, question mark or colon outside parentheses and code spans, on
    one line, a short head before a colon with its clause; a one-word lead such as `Steps:` (the
    module's name again) is passed over. One too
    long is cut at a space outside them too, so no summary ends inside a `(` or a backtick."""
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    text = " ".join(docstring.split())
    lead = re.match(r"[A-Za-z-]+: ", text)
    if lead:
        text = text[lead.end() :][:1].upper() + text[lead.end() + 1 :]
    stops = [i for i, c in _outside_spans(text) if c in ".:?" and text[i + 1 : i + 2] in (" ", "")]
    # A short head before a colon (`audit`:, A cell:) says little alone: its clause goes with it.
    while len(stops) > 1 and text[stops[0]] == ":" and len(text[: stops[0]].split()) <= 4:
        stops = [i for i in stops[1:] if text[i] in ".?"] or stops[1:]
    sentence = text[: stops[0]] if stops else text
    if len(sentence) <= MAX_SENTENCE:
        return sentence
    spaces = [i for i, c in _outside_spans(sentence) if c == " " and i <= MAX_SENTENCE - 3]
    return sentence[: spaces[-1] if spaces else MAX_SENTENCE - 3].rstrip(",;") + "..."


def _outside_spans(text: str) -> list[tuple[int, str]]:
    """Each character of `text` with its index, where it is inside no parentheses and no code span."""
    depth, code, found = 0, False, []
    for index, char in enumerate(text):
        if char == "`":
            code = not code
        elif not code and char == "(":
            depth += 1
        elif not code and char == ")":
            depth = max(depth - 1, 0)
        elif not code and depth == 0:
            found.append((index, char))
    return found


def layout_table() -> str:
    rows = ["| Folder | What is there | Modules |", "|---|---|---|"]
    for folder in FOLDERS:
        package = REPO / "builder" / folder
        modules = sorted(p for p in package.glob("*.py") if p.name != "__init__.py")
        listed = "; ".join(f"`{p.stem}`: {first_sentence(p)}" for p in modules)
        rows.append(f"| `builder/{folder}/` | {first_sentence(package / '__init__.py')} | {listed} |")
    top = sorted(p for p in (REPO / "builder").glob("*.py") if p.name != "__init__.py")
    rows.append(
        "| `builder/` | shared by every stage | " + "; ".join(f"`{p.stem}`: {first_sentence(p)}" for p in top) + " |"
    )
    return "\n".join(rows)


def matrix_schema() -> str:
    sys.path.insert(0, str(REPO))
    from builder.config import schema

    document = schema.MatrixSpec.model_json_schema()
    document["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    document["title"] = "torch-images matrix.yaml"
    return json.dumps(document, indent=1, sort_keys=True) + "\n"


def _models_in(annotation: Any) -> tuple[str, Any] | None:
    """The model a field's annotation holds, and how its keys are written below the field's:
    `.` for the model itself (or an optional one), `.<name>.` for a dict of them, `[].` for a list."""
    from builder.config import validated

    def is_model(kind: Any) -> bool:
        return isinstance(kind, type) and issubclass(kind, validated.Strict)

    if is_model(annotation):
        return ".", annotation
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        found = [_models_in(argument) for argument in arguments if argument is not type(None)]
        return found[0] if len(found) == 1 else None
    if origin is dict and is_model(arguments[1]):
        return ".<name>.", arguments[1]
    if origin is list and is_model(arguments[0]):
        return "[].", arguments[0]
    return None


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    from pydantic import BaseModel

    value = field.default
    if value is None or isinstance(value, BaseModel) or value in ([], {}):
        return ""
    return f"`{json.dumps(value)}`" if not isinstance(value, bool) else f"`{str(value).lower()}`"


def _key_rows(model: Any, prefix: str) -> list[str]:
    from builder.config import schema

    rows = []
    for name, field in model.model_fields.items():
        key = prefix + name
        meaning = " ".join((field.description or "").split())
        nested = _models_in(field.annotation)
        if nested is not None and nested[1] is schema.Selector:
            meaning += " A selector: any of torch, cuda, cudnn, python, base, flavor, index, trtllm, platform."
            nested = None
        rows.append(f"| `{key}` | {_default(field)} | {meaning} |")
        if nested is not None:
            rows += _key_rows(nested[1], key + nested[0])
    return rows


def matrix_keys() -> str:
    """Every key of matrix.yaml, its default and what it means, from the typed fields' docstrings."""
    sys.path.insert(0, str(REPO))
    from builder.config import schema

    return "\n".join(["| key | default | meaning |", "|---|---|---|", *_key_rows(schema.MatrixSpec, "")])


def tag_fields() -> str:
    """Each field a tag template may use, what it is, and its value on the flagship and the CPU cell."""
    sys.path.insert(0, str(REPO))
    from builder.plan import cell, matrix

    grid = matrix.load_matrix(REPO / "matrix.yaml")
    flagship, cpu = (grid.select([name])[0].fields() for name in (FLAGSHIP, CPU_CELL))
    rows = [f"| field | what it is | `{FLAGSHIP}` | `{CPU_CELL}` |", "|---|---|---|---|"]
    for name, meaning in cell.TAG_FIELDS.items():
        rows.append(f"| `{{{name}}}` | {meaning} | `{flagship[name]}` | `{cpu[name]}` |".replace("``", "(empty)"))
    return "\n".join(rows)


def _between(text: str, start: str, end: str, body: str, where: Path) -> str:
    if start not in text or end not in text:
        raise SystemExit(f"{where}: the generated table's markers are missing ({start} ... {end})")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


def with_layout(text: str) -> str:
    return _between(text, START, END, layout_table(), DEVELOPMENT)


def with_keys(text: str) -> str:
    with_table = _between(text, KEYS_START, KEYS_END, matrix_keys(), CUSTOM_IMAGES)
    return _between(with_table, FIELDS_START, FIELDS_END, tag_fields(), CUSTOM_IMAGES)


def _found(page: str, pattern: str) -> str:
    """The first value the pattern's group finds on a page of docs/ (where a measurement is written)."""
    text = (REPO / "docs" / page).read_text()
    match = re.search(pattern, text)
    if match is None:
        raise SystemExit(f"docs/{page}: no measurement matches {pattern!r}; the README's figure has no source")
    return match.group(1)


def _flagship_row() -> dict[str, Any]:
    """The flagship's row of the sweep's record (images/sweep.json, written by `sweep`), read as
    `sweep` reads it (each field of its kind: no `nan GB`); a size or a build time of nothing is
    not a figure. A record that is not one stops here in one line."""
    try:
        rows = sweep.read_record(SWEEP_RECORD)
    except UserError as error:
        raise SystemExit(error.line()) from None
    if FLAGSHIP not in rows:
        raise SystemExit(f"{SWEEP_RECORD}: no row for the flagship {FLAGSHIP}; sweep it (./nox -s sweep -- {FLAGSHIP})")
    row = dataclasses.asdict(rows[FLAGSHIP])
    if row["size_bytes"] <= 0 or row["build_seconds"] <= 0:
        raise SystemExit(f"{SWEEP_RECORD}: the flagship's row has no size or build time; sweep it again")
    return row


def _percent_less(ratio: str) -> str:
    return f"{round((1 - float(ratio)) * 100)}%"


FLAGSHIP_ROW = re.escape(FLAGSHIP)  # the flagship's name, as a table row on a docs page names it
LAZY_ROW = rf"first start on an empty node, {FLAGSHIP_ROW}: lazy [^|]*\|"
# Each README figure, and where it comes from: the sweep's record, or the page its measurement is on.
FIGURES: dict[str, Any] = {
    "wheel_download": lambda: _found("testing.md", r"\((\d+ GB) from PyPI"),
    "flagship_size": lambda: f"{_flagship_row()['size_bytes'] / 1e9:.1f} GB",
    "flagship_build": lambda: f"{math.ceil(_flagship_row()['build_seconds'] / 60)} minutes",
    "tests_time": lambda: _found("testing.md", r"`\./nox -s tests` in (\d+ min)"),
    "build_disk": lambda: _found("testing.md", r"the build held at most (\d+ GB)"),
    "flagship_compressed": lambda: _found("size.md", r"flagship `[^`]+` \((\d+\.\d+ GB) compressed\)"),
    "jinja2_fix_pulled": lambda: _found("size.md", r"jinja2 [^|]*\| (\d+(?:\.\d+)? MB) pulled"),
    "openssl_fix_pulled": lambda: _found("size.md", r"openssl [^|]*\| (\d+(?:\.\d+)? MB) pulled"),
    "zstd_smaller": lambda: _percent_less(
        _found("benchmarks.md", rf"compressed size, {FLAGSHIP_ROW}: zstd level \d+ \|[^|]*\|[^|]*\| (\d\.\d+) \|")
    ),
    "zstd_pull_faster": lambda: _percent_less(
        _found("benchmarks.md", rf"pull through containerd [^|]*zstd, {FLAGSHIP_ROW} \|[^|]*\|[^|]*\| (\d\.\d+) \|")
    ),
    "lazy_start": lambda: _found("benchmarks.md", rf"{LAZY_ROW} (\d+ s) "),
    "gzip_start": lambda: _found("benchmarks.md", rf"{LAZY_ROW}[^|]*\| gzip (\d+ s) "),
}


def figure_notes(text: str) -> list[tuple[int, int, list[tuple[str, str]]]]:
    """Each figures comment: where its paragraph starts, where the comment starts, and its
    (name, value) pairs in order. A paragraph starts after a blank line or at a list item."""
    found = []
    for note in FIGURES_NOTE.finditer(text):
        line_start = text.rfind("\n", 0, note.start()) + 1
        paragraph = line_start
        while paragraph > 0:
            previous = text.rfind("\n", 0, paragraph - 1) + 1
            line = text[previous : paragraph - 1]
            if not line.strip() or text[paragraph:].startswith("- ") or "<!-- figures:" in line:
                break
            paragraph = previous
        pairs = [tuple(item.split("=", 1)) for item in note.group(1).split("; ")]
        if any(len(pair) != 2 for pair in pairs):
            raise SystemExit(f"README.md: {note.group()!r} is not NAME=VALUE; NAME=VALUE")
        found.append((paragraph, note.start(), [(name, value) for name, value in pairs]))
    return found


def with_figures(text: str) -> str:
    """The README with each figure, in its paragraph and in the comment that names it, holding
    its value from its source."""
    out, done = [], 0
    for paragraph, note_at, pairs in figure_notes(text):
        prose, at, fresh = text[paragraph:note_at], 0, []
        for name, old in pairs:
            if name not in FIGURES:
                raise SystemExit(f"README.md: no figure named {name!r}; the names are {', '.join(FIGURES)}")
            place = re.compile(rf"(?<![\w.]){re.escape(old)}(?![\w])").search(prose, at)
            if place is None:
                raise SystemExit(f"README.md: the figure {name} ({old}) is not in the paragraph its comment ends")
            value = FIGURES[name]()
            prose = prose[: place.start()] + value + prose[place.end() :]
            at = place.start() + len(value)
            fresh.append(f"{name}={value}")
        note = FIGURES_NOTE.match(text, note_at)
        assert note is not None
        out += [text[done:paragraph], prose, f"<!-- figures: {'; '.join(fresh)} -->"]
        done = note.end()
    return "".join(out) + text[done:]


CLI = REPO / "docs" / "cli.md"


def cli_reference() -> str:
    """docs/cli.md: every command, verb and option of `python -m builder`, from its parsers (their
    help is the text a user gets from `--help`; this page is that text in one place)."""
    lines = ["# `python -m builder`: every command and option", "",
             "Written by `python -m harness.docs_tables` from the builder's own parsers; do not edit. Each",
             "command also prints this with `--help`.", ""]  # fmt: skip
    top = cli.build_parser()
    lines += [_one_line(top.description or ""), ""]
    for name, command in _subcommands(top):
        lines += _command_section(f"python -m builder {name}", command, "##")
        for verb, parser in _subcommands(command):
            lines += _command_section(f"python -m builder {name} {verb}", parser, "###")
    return "\n".join(lines).rstrip() + "\n"


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return [(name, sub) for action in found for name, sub in action.choices.items()]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _command_section(title: str, parser: argparse.ArgumentParser, level: str) -> list[str]:
    lines = [f"{level} `{title}`", "", _one_line(parser.description or ""), ""]
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        name = ", ".join(action.option_strings) or action.dest
        if action.metavar and action.option_strings:
            name += f" {action.metavar}"
        elif action.choices and action.option_strings:
            name += " {" + ",".join(str(c) for c in action.choices) + "}"
        rows.append(f"| `{name}` | {_one_line(str(action.help or '')).replace('|', '/')} |")
    if rows:
        lines += ["| option | what it does |", "|---|---|", *rows, ""]
    return lines


def main() -> None:
    confined.write_text(CLI, cli_reference())
    confined.write_text(DEVELOPMENT, with_layout(DEVELOPMENT.read_text()))
    confined.write_text(CUSTOM_IMAGES, with_keys(CUSTOM_IMAGES.read_text()))
    confined.write_text(SCHEMA, matrix_schema())
    confined.write_text(README, with_figures(README.read_text()))
    print(
        f"wrote {CLI}, the layout table in {DEVELOPMENT}, the key and tag field tables in {CUSTOM_IMAGES}, {SCHEMA}, "
        f"and {README}'s figures"
    )


if __name__ == "__main__":
    main()
