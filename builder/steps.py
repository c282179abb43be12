"""Steps: how a long job says how it goes (cibuildwheel's `log.step` is the model).

A job's `Steps` is a Report: called with a line, it prints it with the seconds since the job
began. `steps.step(title)` opens a phase: its line when it starts, its seconds recorded when it
ends (in `steps.seconds`, and in a result's own table where the caller names one), and, in a CI
log, a fold around whatever the phase prints: a group in GitHub Actions, a collapsed section in
GitLab. Steps nest; only the outermost folds, since GitHub's groups do not nest."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Literal

from builder.terminal import printable

Report = Callable[[str], None]
FoldStyle = Literal["github", "gitlab", ""]


def fold_style(environ: Mapping[str, str] = os.environ) -> FoldStyle:
    """Which CI log folds: GitHub Actions and GitLab set these on every job; elsewhere nothing folds."""
    if environ.get("GITHUB_ACTIONS") == "true":
        return "github"
    if environ.get("GITLAB_CI") == "true":
        return "gitlab"
    return ""


class Steps:
    """One job's lines and timed phases. `write` prints a line (the console escapes it); `raw`,
    where folding, writes a fold marker as it is: the markers carry only the builder's own line,
    made printable here, so text from outside can open no fold and end none."""

    def __init__(
        self,
        write: Report,
        raw: Report | None = None,
        style: FoldStyle = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.write, self.raw, self.clock = write, raw, clock
        self.style: FoldStyle = style if raw is not None else ""
        self.started = clock()
        self.seconds: dict[str, float] = {}
        self._depth = 0
        self._sections = 0

    @classmethod
    def of(cls, report: Report) -> Steps:
        """`report` itself where it is a Steps; else one that hands each line to it as it is (a
        test's list, a caller's own sink), timing its steps but folding nothing."""
        return report if isinstance(report, Steps) else _Plain(report)

    def line(self, text: str) -> str:
        return f"[{self.clock() - self.started:7.1f} s] {text}"

    def __call__(self, text: str) -> None:
        self.write(self.line(text))

    @contextlib.contextmanager
    def step(self, title: str, key: str = "", into: dict[str, float] | None = None) -> Iterator[None]:
        """A phase: its line now, its seconds under `key` (in `into` too) when it ends however it
        ends; its output folded where this is the outermost step of a CI job."""
        folds = self._depth == 0 and self.style != ""
        section = self._open(title) if folds else ""
        if not folds:
            self(title)
        self._depth += 1
        began = self.clock()
        try:
            yield
        finally:
            self._depth -= 1
            if key:
                self.seconds[key] = self.clock() - began
                if into is not None:
                    into[key] = self.seconds[key]
            if folds:
                self._close(section)

    def _open(self, title: str) -> str:
        assert self.raw is not None
        header = printable(self.line(title))
        if self.style == "github":
            self.raw(f"::group::{header}")
            return ""
        self._sections += 1
        section = f"torch_images_step_{self._sections}"
        self.raw(f"\x1b[0Ksection_start:{int(time.time())}:{section}[collapsed=true]\r\x1b[0K{header}")
        return section

    def _close(self, section: str) -> None:
        assert self.raw is not None
        if self.style == "github":
            self.raw("::endgroup::")
        else:
            self.raw(f"\x1b[0Ksection_end:{int(time.time())}:{section}\r\x1b[0K")


class _Plain(Steps):
    """Steps over a caller's own sink: lines go to it unprefixed, as the caller wrote them."""

    def line(self, text: str) -> str:
        return text
