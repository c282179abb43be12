"""The code's shape is checked, not described: the stages import only the stages to their left
(import-linter's layers contract in pyproject.toml), no two modules import each other, and the
structure walk (tests/support/walk.py) sees a climb back where there is one."""

from __future__ import annotations

import ast
import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

from tests.support import walk

REPO = Path(__file__).resolve().parents[2]


def test_the_stages_import_only_the_stages_to_their_left() -> None:
    program = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    result = subprocess.run([program, "--no-cache"], cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "1 kept, 0 broken" in result.stdout


def test_no_two_modules_import_each_other() -> None:
    graph = grimp.build_graph("builder", include_external_packages=False)
    cycles = sorted(
        {
            tuple(sorted((module, imported)))
            for module in graph.modules
            for imported in graph.find_modules_directly_imported_by(module)
            if graph.chain_exists(importer=imported, imported=module)
        }
    )
    assert cycles == [], cycles


def test_paths_named_in_the_code_and_docs_point_at_files_that_exist() -> None:
    """Issue 39: comments kept naming the old build/ and spec/ folders. A path written in a
    docstring, a comment or a doc (`builder/publish/trust.py`, `wheelhouse/aptrepo.py` inside
    builder/, `docs/ci.md`) must name a file or folder of this checkout."""
    repo = Path(__file__).resolve().parents[2]
    tops = ("builder", "tests", "benchmarks", "image", "templates", "docs", "data", "requirements")
    # a whole token: up to a space, quote, backtick, bracket or comma (a pattern such as `x/*.json`
    # or `images/<cell>/` names no one file and is left out)
    rooted = re.compile(rf"(?<![\w/.-])((?:{'|'.join(tops)})/[^\s`'\"(),;:\]]*)")
    in_builder = re.compile(r"(?<![\w/.-])([a-z_]+/[a-z_]+\.py)\b")
    missing = []
    sources = [
        *repo.glob("builder/**/*.py"),
        *repo.glob("benchmarks/*.py"),
        *repo.glob("tests/**/*.py"),
        *repo.glob("docs/*.md"),
        repo / "README.md",
        repo / "noxfile.py",
    ]
    for path in sources:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for found in rooted.finditer(line):
                name = found.group(1).rstrip(".").split("#")[0]  # a page's anchor names no file
                if any(mark in name for mark in "*<{\\$") or name.startswith("builder/_"):  # _data: inside a wheel
                    continue
                if not (repo / name).exists():
                    missing.append(f"{path.relative_to(repo)}:{number}: {name}")
            if path.suffix == ".py" and path.is_relative_to(repo / "builder"):
                for found in in_builder.finditer(line):
                    name = found.group(1)
                    if name.split("/")[0] not in tops and not (repo / "builder" / name).exists():
                        missing.append(f"{path.relative_to(repo)}:{number}: {name}")
    assert not missing, "\n".join(missing)


def test_the_walk_counts_a_callback_that_climbs_back_into_a_file_on_the_stack(tmp_path: Path) -> None:
    package = tmp_path / "package"
    package.mkdir()
    (package / "top.py").write_text(
        "from package import low\n"
        "def build_cell():\n"
        "    return low.run(lambda: helper())\n"
        "def helper():\n"
        "    return low.leaf()\n"
    )
    (package / "low.py").write_text("def run(callback):\n    return callback()\ndef leaf():\n    return 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        top = importlib.import_module("package.top")
        recorded = walk.Walk(root=str(package) + "/")
        assert walk.traced(top.build_cell, recorded) == 1
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("package", "package.top", "package.low"):
            sys.modules.pop(name, None)
    summary = recorded.summary()
    # low.run calls the lambda back in top, which is still below it on the stack; from there
    # top.helper calls low.leaf while low.run is still below: two climbs back.
    assert summary["climbs"] == ["low.py:run -> top.py:build_cell.<locals>.<lambda>", "top.py:helper -> low.py:leaf"]
    assert summary["stops"] == 5 and summary["files"] == 2


def test_the_benchmarks_and_the_harness_import_nothing_from_the_tests() -> None:
    """Issue 49: what both need (loopback registries, Docker 29, ctr) lives in harness/. Issue 60:
    a renamed folder fails here rather than passing over nothing."""
    checked = sorted((REPO / "benchmarks").glob("*.py")) + sorted((REPO / "harness").glob("*.py"))
    assert len([p for p in checked if p.parent.name == "benchmarks"]) >= 3
    assert len([p for p in checked if p.parent.name == "harness"]) >= 3
    for path in checked:
        tree = ast.parse(path.read_text())
        imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in imported if m == "tests" or m.startswith("tests.")], path


# What a registry offers for attachments (referrers): only the door (builder/publish/attachments.py)
# calls these, so that the trust rules of publishing live in one place.
REFERRER_OPERATIONS = {
    "referrers", "attached", "push_artifact", "put_referrer", "delete_manifest", "drop_from_referrers_tag",
    "artifact_manifest", "artifact_document", "artifact",
}  # fmt: skip


def test_publish_reaches_a_registrys_attachments_only_through_the_one_door() -> None:
    """Issue 49: soci, reports, provenance, prune, staging and verify each listed, read, pushed and
    deleted referrers themselves."""
    callers = []
    for path in sorted((REPO / "builder").rglob("*.py")):
        if (path.name == "attachments.py" and path.parent.name == "publish") or path.parent.name == "oci":
            continue
        tree = ast.parse(path.read_text())
        modules = {alias.asname or alias.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                   for alias in n.names}  # fmt: skip
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
        for call in calls:
            receiver = call.func.value  # type: ignore[attr-defined]
            through_door = _is_door(receiver) or (isinstance(receiver, ast.Name) and receiver.id in modules)
            if call.func.attr in REFERRER_OPERATIONS and not through_door:  # type: ignore[attr-defined]
                callers.append(f"{path.relative_to(REPO)}:{call.lineno} {call.func.attr}")  # type: ignore[attr-defined]
    assert callers == []


def _is_door(node: ast.expr) -> bool:
    """`door.x(...)`, `publisher.door.x(...)`: the door, not the registry."""
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name == "door"


def test_no_function_in_the_builder_takes_more_than_six_parameters() -> None:
    """Issue 49: 12 publish functions took 7 to 9, the engine, registry, grid, report and signer
    travelling as a group; a Publisher carries them now. Issue 60: the same bar for all of
    builder/ (the ustar header's ten fields travel as one record)."""
    crowded = []
    checked = sorted((REPO / "builder").rglob("*.py"))
    assert len(checked) > 100
    for path in checked:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = node.args
                names = [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
                count = len(names) + bool(arguments.vararg) + bool(arguments.kwarg) - (names[:1] in (["self"], ["cls"]))
                if count > 6:
                    crowded.append(f"{path.name}:{node.lineno} {node.name} ({count})")
    assert crowded == []
