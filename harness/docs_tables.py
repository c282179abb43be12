"""Docs that come from the code (issue 49), as cibuildwheel writes its options table: the layout
table in docs/development.md (each folder's docstring and each module's first sentence) and the
JSON schema of matrix.yaml (docs/matrix.schema.json, from the typed fields that read it).

`python -m harness.docs_tables` writes them; tests/unit/test_docs.py fails when what is
committed is not what the code gives."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEVELOPMENT = REPO / "docs" / "development.md"
SCHEMA = REPO / "docs" / "matrix.schema.json"
START, END = "<!-- layout: written by python -m harness.docs_tables; do not edit -->", "<!-- layout end -->"
# The folders in the order data flows through them, then the mechanisms and the command line.
FOLDERS = ("config", "facts", "plan", "engine", "lock", "wheelhouse", "render", "repro", "assemble", "publish",
           "oci", "commands")  # fmt: skip
MAX_SENTENCE = 110


def first_sentence(path: Path) -> str:
    """A module's docstring, to its first full stop or colon, on one line."""
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    text = " ".join(docstring.split())
    found = re.match(r"(.+?)(?:[.:](?:\s|$)|$)", text)
    sentence = found.group(1) if found else text
    return sentence if len(sentence) <= MAX_SENTENCE else sentence[: MAX_SENTENCE - 3].rsplit(" ", 1)[0] + "..."


def layout_table() -> str:
    rows = ["| Folder | What is there | Modules |", "|---|---|---|"]
    for folder in FOLDERS:
        package = REPO / "builder" / folder
        modules = sorted(p for p in package.glob("*.py") if p.name != "__init__.py")
        listed = "; ".join(f"`{p.stem}`: {first_sentence(p)}" for p in modules)
        rows.append(f"| `builder/{folder}/` | {first_sentence(package / '__init__.py')} | {listed} |")
    top = sorted(p for p in (REPO / "builder").glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
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


def with_layout(text: str) -> str:
    if START not in text or END not in text:
        raise SystemExit(f"{DEVELOPMENT}: the layout table's markers are missing ({START} ... {END})")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{layout_table()}\n{END}{tail}"


def main() -> None:
    DEVELOPMENT.write_text(with_layout(DEVELOPMENT.read_text()))
    SCHEMA.write_text(matrix_schema())
    print(f"wrote the layout table in {DEVELOPMENT} and {SCHEMA}")


if __name__ == "__main__":
    main()
