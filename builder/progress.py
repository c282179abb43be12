"""Report: where a long step says how it goes, one line per call (a progress line on the
terminal, a CI log line, or a test's list). Every stage that reports takes one."""

from __future__ import annotations

from collections.abc import Callable

Report = Callable[[str], None]
