"""Text from outside (a registry's answer, a report's device name, an OSV record) on its way to a
terminal: control characters, escape sequences included, are shown as escapes, never sent; and
the console reads no markup, so a `[` in such text is a bracket, not a Rich tag."""

from __future__ import annotations

import html
import re
import sys
from typing import Any

from rich.console import Console

# C0 controls but tab, DEL, and C1 controls (ESC starts a terminal sequence; CR and LF would let
# a name write lines of its own).
# Unicode's own line and paragraph separators, and the bidirectional overrides and isolates that
# reorder what a terminal shows (a name could seem to say another thing), are escaped too.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


# `user:password@` at the start of a reference or URL (a digest's `@` comes after a `/`).
_USERINFO = re.compile(r"^([a-z]+://)?([^/@:\s]*):[^/@\s]*@", re.IGNORECASE)


def without_password(text: str) -> str:
    """`text` with the password of a leading `user:password@` replaced by ***, for error lines."""
    return _USERINFO.sub(lambda found: f"{found.group(1) or ''}{found.group(2)}:***@", text)


def printable(text: str) -> str:
    """`text` with each control character written as its escape (\\x1b, \\n)."""
    return _CONTROL.sub(lambda found: repr(found.group())[1:-1], text)


def quoted(text: object, limit: int = 120) -> str:
    """Text from a report or a registry, for a line of the builder's own: in double quotes, cut at
    `limit` characters, its quotes, backslashes and control characters escaped, so it can neither
    end its line nor seem to be the builder's words."""
    value = str(text)
    cut = value[:limit] + ("..." if len(value) > limit else "")
    return '"' + printable(cut.replace("\\", "\\\\").replace('"', '\\"')) + '"'


class SafeConsole(Console):
    """A Rich console for the builder's lines: no markup, no highlighting, control characters
    escaped in every string it is given (renderables such as tables escape their own cells)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(markup=False, highlight=False, **options)

    def print(self, *objects: Any, **options: Any) -> None:
        options.pop("markup", None)
        super().print(*(printable(o) if isinstance(o, str) else o for o in objects), markup=False, **options)


def table_console() -> SafeConsole:
    """Where a wide table goes: as wide as the terminal it prints to, so its rows fold within
    it; off a terminal (a CI log, a pipe) wide enough that each row stays one line."""
    return SafeConsole() if sys.stdout.isatty() else SafeConsole(width=200)


# ---------------------------------------------------------------- Markdown tables (README, docs/matrix.md)

MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()|~!@#])")
CODE_SAFE = re.compile(r"[A-Za-z0-9._:/@+-]{1,200}")  # a registry, repository, tag or platform, as validated
MAX_CELL_TEXT = 120
AUTOLINK = re.compile(r"//|www\.", re.IGNORECASE)
ZERO_WIDTH_SPACE = "&#8203;"


def markdown_text(value: object) -> str:
    """A value from a record (and so from a report, a registry or a sweep row) as inert Markdown: HTML's
    `<`, `>` and `&` as entities, Markdown's punctuation backslash-escaped, no line break, and at
    most 120 characters. It can open no tag, link, code span or table cell, and cannot be the
    table's end marker."""
    text = " ".join(str(value).split())[:MAX_CELL_TEXT]
    text = "".join(c if c.isprintable() else "?" for c in text)
    escaped = MARKDOWN_SPECIAL.sub(r"\\\1", html.escape(text, quote=False))
    # GitHub links a bare `https://...` or `www....` by itself: a zero-width space breaks both.
    return AUTOLINK.sub(lambda found: found.group()[:-1] + ZERO_WIDTH_SPACE + found.group()[-1], escaped)


def code_text(value: object) -> str:
    """A name (tag, repository, platform) as a code span when it is plain name characters, else
    as escaped text: a code span cannot be closed by a name without backticks."""
    return f"`{value}`" if isinstance(value, str) and CODE_SAFE.fullmatch(value) else markdown_text(value)
