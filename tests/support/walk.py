"""The structure walk of one cell's build: which of the builder's functions and files a real
`build` passes through, and how often control climbs back into a file it already came through.

Traced with sys.setprofile (every thread) inside `python -m builder build ...`, from the moment
`build_cell` is entered until it returns. Definitions, each on distinct call edges between the
builder's own functions (a loop that calls one function a thousand times is one edge):

- stop: a builder function called under build_cell;
- re-entry: in the order functions are first reached, a step into a file the walk had left;
- climb back: a call edge into a file that is still on the call stack below the caller, so
  control goes down out of that file and comes back up into it (A -> B -> A). Calls into the
  caller's own file are not climbs; calls through the standard library or the Docker SDK count
  from the nearest builder frame, so a callback passed down and called from below is one.

Run: python -m tests.support.walk OUT.json [--matrix M] CELL [build options]
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any, TypeVar

BUILDER = str(Path(__file__).resolve().parents[2] / "builder") + "/"
ENTRY = "build_cell"
T = TypeVar("T")


def _function(code: CodeType, root: str) -> str:
    return f"{code.co_filename.removeprefix(root)}:{code.co_qualname}"


def _file(function: str) -> str:
    return function.split(":", 1)[0]


def _room(function: str) -> str:
    """A stage folder (assemble, engine, wheelhouse ...), or a module at the package's top."""
    return _file(function).split("/", 1)[0]


@dataclass
class Walk:
    root: str = BUILDER  # the package whose files are the walk's places
    orders: dict[int, list[str]] = field(default_factory=dict)  # per thread: functions in the order first reached
    edges: set[tuple[str, str]] = field(default_factory=set)
    climbs: set[tuple[str, str]] = field(default_factory=set)  # (caller, callee) edges back into a file on the stack
    room_climbs: set[tuple[str, str]] = field(default_factory=set)  # the same for rooms
    _seen: set[str] = field(default_factory=set)
    _active: int = 0

    def _builder_stack(self, frame: FrameType | None) -> list[str]:
        stack = []
        while frame is not None:
            if frame.f_code.co_filename.startswith(self.root):
                stack.append(_function(frame.f_code, self.root))
            frame = frame.f_back
        return stack

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if not frame.f_code.co_filename.startswith(self.root):
            return
        if frame.f_code.co_name == ENTRY:  # the walk spans build_cell, threads it starts included
            self._active += {"call": 1, "return": -1}.get(event, 0)
        if event != "call" or not self._active:
            return
        stack = self._builder_stack(frame)  # callee first
        callee = stack[0]
        if callee not in self._seen:
            self._seen.add(callee)
            self.orders.setdefault(threading.get_ident(), []).append(callee)
        if len(stack) < 2 or callee.endswith(":" + ENTRY):
            return
        caller = stack[1]
        edge = (caller, callee)
        if edge in self.edges:
            return
        self.edges.add(edge)
        for level, climbs in ((_file, self.climbs), (_room, self.room_climbs)):
            below = {level(name) for name in stack[2:]}
            if level(callee) != level(caller) and level(callee) in below:
                climbs.add(edge)

    def summary(self) -> dict[str, Any]:
        order = [name for names in self.orders.values() for name in names]
        return {
            "stops": len(order),
            "files": len({_file(name) for name in order}),
            "rooms": len({_room(name) for name in order}),
            "file re-entries": sum(_reentries([_file(name) for name in names]) for names in self.orders.values()),
            "room re-entries": sum(_reentries([_room(name) for name in names]) for names in self.orders.values()),
            "climbs back": len(self.climbs),
            "room climbs back": len(self.room_climbs),
            "climbs": sorted(f"{caller} -> {callee}" for caller, callee in self.climbs),
            "room climbs": sorted(f"{caller} -> {callee}" for caller, callee in self.room_climbs),
            "walk": order,
        }


def _reentries(places: list[str]) -> int:
    """Steps into a place the walk had already left."""
    return sum(
        1 for index in range(1, len(places)) if places[index] != places[index - 1] and places[index] in places[:index]
    )


def traced(call: Callable[[], T], walk: Walk) -> T:
    """`call()`, with every builder call made under build_cell (in any thread) added to `walk`."""
    threading.setprofile(walk.profile)
    sys.setprofile(walk.profile)
    try:
        return call()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def trace(argv: list[str]) -> tuple[int, dict[str, Any]]:
    """`python -m builder build *argv`, traced: its exit status and the walk's summary."""
    from builder import cli

    walk = Walk()
    code = traced(lambda: cli.main(["build", *argv]), walk)
    return code, walk.summary()


def main() -> int:
    code, summary = trace(sys.argv[2:])
    Path(sys.argv[1]).write_text(json.dumps({"exit": code, **summary}, indent=1) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
