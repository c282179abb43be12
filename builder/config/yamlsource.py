"""YAML loading that remembers where every value came from, and refuses hostile documents.

PyYAML's safe_load forgets line numbers and silently keeps the last of two duplicate
keys; both make errors hard to act on. Composing the node tree keeps both facts.

matrix.yaml arrives through pull requests, so the loader is bounded before it builds
anything: the file's size, its nesting depth, the number of aliases, and the number of
values the aliases expand to are capped ("billion laughs" documents are a few hundred
bytes), the text must be UTF-8, and only YAML's standard tags are accepted. Every one of
these is a UserError naming the file and line, never a traceback.
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

MAX_BYTES = 1 << 20  # a matrix is a few kilobytes; a megabyte is already suspicious
MAX_DEPTH = 16  # matrix.yaml nests four levels deep
MAX_ALIASES = 64  # `*name` references; anchors are handy for shared bases, not for thousands
MAX_VALUES = 100_000  # values after aliases are expanded: bounds time and memory
STANDARD_TAGS = frozenset(
    f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null", "map", "seq", "timestamp")
)


@dataclass
class SourceMap:
    """Line and raw text of every key and value in a YAML document, by field path."""

    path: Path
    lines: dict[FieldPath, int] = field(default_factory=dict)
    raw: dict[FieldPath, str] = field(default_factory=dict)
    values: int = 0

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


def _line(node: yaml.Node | yaml.Event) -> int | None:
    return node.start_mark.line + 1 if node.start_mark else None


def _at(source: SourceMap, node: yaml.Node | yaml.Event) -> Location:
    return Location(source.path, _line(node))


def _walk(node: yaml.Node, where: FieldPath, source: SourceMap) -> Any:
    source.values += 1
    if source.values > MAX_VALUES:
        raise UserError(
            f"the document expands to more than {MAX_VALUES} values (aliases referring to aliases?); "
            "write the values out instead of nesting aliases",
            _at(source, node),
        )
    if node.tag not in STANDARD_TAGS:
        raise UserError(
            f"unsupported YAML tag {node.tag}; remove it (matrix files hold plain strings, numbers, lists and maps)",
            _at(source, node),
            dotted(where) or None,
        )
    source.lines.setdefault(where, _line(node) or 0)
    if isinstance(node, yaml.MappingNode):
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise UserError("a key must be plain text, not a list or a map", _at(source, key_node), dotted(where))
            key = str(key_node.value)
            child = (*where, key)
            if key in result:
                raise UserError(
                    f"duplicate key '{key}' (first on line {source.lines[child]}); keep one",
                    _at(source, key_node),
                    dotted(child),
                )
            source.lines[child] = _line(key_node) or 0
            result[key] = _walk(value_node, child, source)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, (*where, index), source) for index, item in enumerate(node.value)]
    assert isinstance(node, yaml.ScalarNode)
    source.raw[where] = node.value
    try:
        return _SCALARS.construct_object(node)
    except yaml.YAMLError as error:  # a malformed timestamp, say
        raise UserError(f"cannot read this value: {getattr(error, 'problem', error)}", _at(source, node)) from None


def _check_shape(text: str, path: Path) -> None:
    """Depth and alias count from the event stream, before any node tree is built."""
    depth, aliases = 0, 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise UserError(
                    f"nested more than {MAX_DEPTH} levels deep; a matrix needs a handful",
                    Location(path, _line(event)),
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise UserError(
                    f"more than {MAX_ALIASES} aliases (*name); write the values out",
                    Location(path, _line(event)),
                )


def _read_text(path: Path, hint: str) -> str:
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as error:
        raise UserError(f"cannot read: {error.strerror}; {hint}", path) from None
    if len(data) > MAX_BYTES:
        raise UserError(f"larger than {MAX_BYTES // 1024} KiB; a matrix is a few kilobytes", path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise UserError(
            f"not UTF-8 text (byte 0x{data[error.start]:02x}); save the file as UTF-8", Location(path, line)
        ) from None


def load(path: Path, hint: str = "pass --matrix PATH to a matrix file") -> tuple[Any, SourceMap]:
    """Parse a YAML file into plain data plus its SourceMap; malformed or hostile YAML is a UserError."""
    source = SourceMap(path)
    text = _read_text(path, hint)
    try:
        _check_shape(text, path)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = mark.line + 1 if mark else None
        raise UserError(f"malformed YAML: {error.problem or error}", Location(path, line)) from None
    except yaml.YAMLError as error:  # reader errors (control characters) carry no mark
        raise UserError(f"malformed YAML: {' '.join(str(error).split())}", path) from None
    if node is None:
        raise UserError("the file is empty; docs/custom-images.md says what a matrix holds", path)
    return _walk(node, (), source), source
