"""Steps (builder/steps.py): each phase says one line, times itself, and folds in a CI log."""

from __future__ import annotations

import io
import re

import pytest

from builder.commands import common
from builder.steps import Steps, fold_style
from builder.terminal import SafeConsole


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _steps(style: str = "") -> tuple[Steps, list[str], list[str], Clock]:
    lines: list[str] = []
    markers: list[str] = []
    clock = Clock()
    steps = Steps(lines.append, markers.append, style, clock)  # type: ignore[arg-type]
    return steps, lines, markers, clock


def test_a_step_says_one_line_with_the_seconds_since_the_job_began_and_records_its_own_seconds() -> None:
    steps, lines, markers, clock = _steps()
    phases: dict[str, float] = {}
    clock.now += 2.0
    with steps.step("cpu: fetching wheels", "inputs", phases):
        clock.now += 7.5
    assert lines == ["[    2.0 s] cpu: fetching wheels"]
    assert phases == {"inputs": 7.5} and steps.seconds == {"inputs": 7.5}
    assert markers == []  # off CI nothing folds


def test_a_step_that_raises_is_still_timed_and_its_fold_closed() -> None:
    steps, _, markers, clock = _steps("github")
    phases: dict[str, float] = {}
    with pytest.raises(KeyboardInterrupt), steps.step("cpu: the engine's steps", "engine", phases):
        clock.now += 3.0
        raise KeyboardInterrupt
    assert phases == {"engine": 3.0}
    assert markers == ["::group::[    0.0 s] cpu: the engine's steps", "::endgroup::"]


def test_in_github_actions_only_the_outermost_step_folds_since_groups_do_not_nest() -> None:
    steps, lines, markers, _ = _steps("github")
    with steps.step("outer"):
        steps("a line inside")
        with steps.step("inner"):
            pass
    assert markers == ["::group::[    0.0 s] outer", "::endgroup::"]
    assert lines == ["[    0.0 s] a line inside", "[    0.0 s] inner"]


def test_in_gitlab_each_outermost_step_is_a_collapsed_section_opened_and_closed_by_one_name() -> None:
    steps, _, markers, _ = _steps("gitlab")
    with steps.step("first"):
        pass
    with steps.step("second"):
        pass
    opened = [re.fullmatch(r"\x1b\[0Ksection_start:\d+:(\w+)\[collapsed=true\]\r\x1b\[0K(.*)", m) for m in markers[::2]]
    closed = [re.fullmatch(r"\x1b\[0Ksection_end:\d+:(\w+)\r\x1b\[0K", m) for m in markers[1::2]]
    assert all(opened) and all(closed)
    assert [m.group(1) for m in opened if m] == [m.group(1) for m in closed if m]
    assert len({m.group(1) for m in opened if m}) == 2
    assert [m.group(2) for m in opened if m] == ["[    0.0 s] first", "[    0.0 s] second"]


def test_a_title_cannot_end_a_fold_or_write_a_workflow_command_of_its_own() -> None:
    steps, _, markers, _ = _steps("github")
    with steps.step("cell\n::endgroup::\n::add-mask::x\x1b[2J"):
        pass
    assert len(markers) == 2 and "\n" not in markers[0] and "\x1b" not in markers[0]
    assert markers[0].startswith("::group::[") and markers[1] == "::endgroup::"


@pytest.mark.parametrize(
    ("environ", "style"),
    [({"GITHUB_ACTIONS": "true"}, "github"), ({"GITLAB_CI": "true"}, "gitlab"), ({"CI": "true"}, ""), ({}, "")],
)
def test_the_fold_style_is_the_ci_the_environment_names(environ: dict[str, str], style: str) -> None:
    assert fold_style(environ) == style


def test_a_callers_own_sink_gets_each_line_as_written_and_its_steps_are_timed() -> None:
    said: list[str] = []
    steps = Steps.of(said.append)
    phases: dict[str, float] = {}
    with steps.step("cpu: the base image", "base", phases):
        steps("cpu: bootstrapping")
    assert said == ["cpu: the base image", "cpu: bootstrapping"]
    assert set(phases) == {"base"} and phases["base"] >= 0
    assert Steps.of(steps) is steps


@pytest.mark.parametrize(("environ", "folded"), [({"GITHUB_ACTIONS": "true"}, True), ({}, False)])
def test_a_ci_job_on_a_terminal_gets_folds_and_no_spinner(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], folded: bool
) -> None:
    """act runs a job's steps on a pseudo-terminal: the log still folds, and no spinner's escapes
    fill it; a person's terminal gets the spinner and no fold markers."""
    written = io.StringIO()
    monkeypatch.setattr(common, "console", SafeConsole(file=written, force_terminal=True, width=120))
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    monkeypatch.delenv("GITLAB_CI", raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with common.progress("cpu: starting") as steps, steps.step("cpu: the base image"):
        steps("cpu: a line")
    text = written.getvalue()
    assert ("::group::" in text and "::endgroup::" in text) == folded
    assert ("\x1b[?25l" in text) != folded  # the spinner hides the cursor
