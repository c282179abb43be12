"""JSON from outside (a registry's answer, a report, a signed payload, an advisory, a record):
parsed with a nesting limit, so that a document built to be deep is one line, not a
RecursionError in the parser or in whatever walks the result."""

from __future__ import annotations

import json
from typing import Any

from builder.errors import UserError

# Far deeper than any document the builder reads (an SBOM, a report, an OCI index: under 10).
MAX_DEPTH = 64


def depth(value: Any) -> int:
    """How deeply lists and objects nest in a parsed document (walked without recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        current, level = stack.pop()
        if isinstance(current, dict | list):
            deepest = max(deepest, level)
            if level > MAX_DEPTH:
                return level
            stack.extend((child, level + 1) for child in (current.values() if isinstance(current, dict) else current))
    return deepest


def loads(data: bytes | str, what: str) -> Any:
    """The parsed document, or UserError naming `what` when it is not JSON or nests too deep."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise UserError(f"{what}: JSON nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError):
        raise UserError(f"{what} is not JSON") from None
    if depth(value) > MAX_DEPTH:
        raise UserError(f"{what}: JSON nested deeper than {MAX_DEPTH} levels")
    return value
