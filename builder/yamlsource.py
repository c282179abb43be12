"""YAML loading that remembers where every value came from.

PyYAML's safe_load forgets line numbers and silently keeps the last of two duplicate
keys; both make errors hard to act on. Composing the node tree keeps both facts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from builder.errors import Location, UserError

FieldPath = tuple[str | int, ...]
# Builds plain Python values (str, int, float, bool, None) from scalar nodes, as safe_load would.
_SCALARS = yaml.constructor.SafeConstructor()


@dataclass
class SourceMap:
    """Line and raw text of every key and value in a YAML document, by field path."""

    path: Path
    lines: dict[FieldPath, int] = field(default_factory=dict)
    raw: dict[FieldPath, str] = field(default_factory=dict)

    def line(self, where: FieldPath) -> int | None:
        """The line of the field, or of its nearest ancestor that exists."""
        for cut in range(len(where), -1, -1):
            if where[:cut] in self.lines:
                return self.lines[where[:cut]]
        return None

    def location(self, where: FieldPath) -> Location:
        return Location(self.path, self.line(where))


def dotted(where: FieldPath) -> str:
    text = ""
    for part in where:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _walk(node: yaml.Node, where: FieldPath, source: SourceMap) -> Any:
    source.lines.setdefault(where, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            child = (*where, key)
            if key in result:
                raise UserError(
                    f"duplicate key '{key}' (first on line {source.lines[child]}); keep one",
                    Location(source.path, key_node.start_mark.line + 1),
                    dotted(child),
                )
            source.lines[child] = key_node.start_mark.line + 1
            result[key] = _walk(value_node, child, source)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, (*where, index), source) for index, item in enumerate(node.value)]
    assert isinstance(node, yaml.ScalarNode)
    source.raw[where] = node.value
    return _SCALARS.construct_object(node)


def load(path: Path) -> tuple[Any, SourceMap]:
    """Parse a YAML file into plain data plus its SourceMap; malformed YAML is a UserError."""
    source = SourceMap(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise UserError(f"cannot read: {error.strerror}; pass --matrix PATH to a matrix file", path) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = mark.line + 1 if mark else None
        raise UserError(f"malformed YAML: {error.problem or error}", Location(path, line)) from None
    if node is None:
        raise UserError("the file is empty; see the README for a minimal matrix", path)
    return _walk(node, (), source), source
