"""Issue 57: nothing the builder or the docs generator writes inside the checkout follows a link
(images/, docs/, README.md, published/ come from pull requests, and the builder runs as root), and
a write is whole or not at all. One writer (builder/confined.py) does every such write."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from builder import confined
from builder.assemble import sweep
from builder.errors import UserError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("dangling", [True, False])
def test_a_link_in_the_place_of_a_file_is_refused_and_what_it_names_is_untouched(
    tmp_path: Path, dangling: bool
) -> None:
    outside = tmp_path / "outside.txt"
    if not dangling:
        outside.write_text("theirs\n")
    inside = tmp_path / "checkout" / "sweep.json"
    inside.parent.mkdir()
    inside.symlink_to(outside)
    with pytest.raises(UserError, match="is a symbolic link; the builder writes no file through a link"):
        sweep.write_record(inside, {})
    assert outside.exists() != dangling and (dangling or outside.read_text() == "theirs\n")
    assert inside.is_symlink() and sorted(p.name for p in inside.parent.iterdir()) == ["sweep.json"]


def test_an_interrupted_write_leaves_the_old_file_and_no_scrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "matrix.md"
    target.write_text("before\n")

    def interrupted(source: object, destination: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(confined.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        confined.write_text(target, "after\n")
    assert target.read_text() == "before\n" and [p.name for p in tmp_path.iterdir()] == ["matrix.md"]


def test_the_writes_into_the_checkout_go_through_the_one_writer() -> None:
    """A plain Path.write_text / write_bytes in the modules that write images/, docs/, README.md
    and published/ would follow a link: none is left there."""
    modules = ["builder/assemble/sweep.py", "builder/publish/publish.py", "builder/facts/compat.py",
               "harness/docs_tables.py", "builder/repro/recorded.py"]  # fmt: skip
    plain = []
    for name in modules:
        for node in ast.walk(ast.parse((REPO / name).read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("write_text", "write_bytes"):
                owner = node.value
                if not (isinstance(owner, ast.Name) and owner.id == "confined"):
                    plain.append(f"{name}:{node.lineno}")
    assert plain == []
