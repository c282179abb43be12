"""A cell's build inputs as its lock files hold them, read and checked once.

`lock --check`, `render`, the build's preflight and the wheelhouse all take a CellLocks: each
lock file is read (and validated line by line) once per run, and its fingerprint and content
digest computed once, instead of each stage reading the files again.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TypeVar

from builder.config import layout
from builder.errors import UserError
from builder.lock import debian
from builder.lock.requirements import (
    FLAVOR_LOCK,
    STACK_LOCK,
    Lockfile,
    flavor_fingerprint,
    flavor_requirements,
    layer_lock,
    stack_fingerprint,
    verify_flavor,
    verify_stack,
)
from builder.plan.cell import Cell
from builder.plan.matrix import Matrix

Read = TypeVar("Read")


@dataclass(frozen=True)
class CellLocks:
    cell: Cell
    stack: Lockfile | None  # requirements.lock, None when missing
    flavor: Lockfile | None  # flavor.lock, None when missing (or the flavor adds no Python package)
    debian: debian.DebianLock | None  # debian.lock, None when missing
    problems: tuple[str, ...]  # why the locks do not match the matrix: `lock` fixes each

    @property
    def python_locks(self) -> list[Lockfile]:
        """Every lock a build serves: the stack lock, the part of it each layer installs, the flavor's."""
        layers = [part for _, part in self.stack_layers]
        return [lock for lock in (self.stack, *layers, self.flavor) if lock is not None]

    @cached_property
    def flavor_step_pins(self) -> tuple[str, ...]:
        """The .debs the flavor's apt step may install: the flavor's own, and the shared layer's too
        where the flavor keeps files that layer left out (it reinstalls their packages, at the same
        locked versions). Empty without a debian.lock (which preflight refuses)."""
        if self.debian is None:
            return ()
        restores = bool(layout.load().restored_by(self.cell.flavor))
        return (*self.debian.flavor, *self.debian.common) if restores else self.debian.flavor

    @cached_property
    def stack_layers(self) -> list[tuple[str, Lockfile]]:
        """The torch stack's layers in install order (data/layout.yaml), each with its part of the lock."""
        if self.stack is None:
            return []
        groups = layout.load().split(list(self.stack.packages))
        return [(name, layer_lock(self.stack, members, name)) for name, members in groups]


def _if_present(path: Path, read: Callable[[Path], Read]) -> Read | None:
    """None when there is nothing at `path`; a link there is read (and refused) by `read`."""
    return read(path) if os.path.lexists(path) else None


def read(cell: Cell, grid: Matrix) -> CellLocks:
    """Read the cell's locks and say how they differ from the matrix.

    A missing or out-of-date lock is a problem in the list (drift: `lock` fixes it). A lock whose
    content is not what `lock` wrote (a line that is not a hashed pin, an edited body, another
    torch or CUDA library than the cell's) raises a UserError naming the file and line: such a
    lock never reaches a Dockerfile or a build, and `lock --check` exits 2 on it.
    """
    stack = _if_present(cell.file(STACK_LOCK), Lockfile.read)
    extras = _if_present(cell.file(FLAVOR_LOCK), Lockfile.read)
    pins = _if_present(cell.file(debian.DEBIAN_LOCK), debian.DebianLock.read)
    return CellLocks(cell, stack, extras, pins, tuple(_problems(cell, grid, stack, extras, pins)))


def _problems(
    cell: Cell, grid: Matrix, stack: Lockfile | None, extras: Lockfile | None, pins: debian.DebianLock | None
) -> list[str]:
    directory = cell.directory
    rerun = f"run `python -m builder lock {cell.name}`"

    def unedited(path: Path, content_matches: bool) -> None:
        if not content_matches:
            raise UserError(f"edited after `lock` wrote it (its content digest differs); {rerun}", path)

    problems = []
    debian_path = debian.lock_path(directory)
    if pins is None:
        problems.append(f"{debian_path} is missing; {rerun}")
    elif pins.fingerprint != debian.fingerprint(cell):
        problems.append(f"{debian_path} is out of date with data/flavors.yaml or the base; {rerun}")
    else:
        unedited(debian_path, pins.content_matches)
    stack_path, flavor_path = directory / STACK_LOCK, directory / FLAVOR_LOCK
    if stack is None:
        return [*problems, f"{stack_path} is missing; {rerun}"]
    if stack.fingerprint != stack_fingerprint(cell, grid):
        return [*problems, f"{stack_path} is out of date with {grid.path.name}; {rerun}"]
    unedited(stack_path, stack.content_matches)
    verify_stack(cell, stack)
    if flavor_requirements(cell):
        if extras is None:
            return [*problems, f"{flavor_path} is missing; {rerun}"]
        if extras.fingerprint != flavor_fingerprint(cell, grid, stack.text):
            return [*problems, f"{flavor_path} is out of date; {rerun}"]
        unedited(flavor_path, extras.content_matches)
        verify_flavor(cell, stack, extras)
    elif extras is not None:
        problems.append(f"{flavor_path} belongs to no flavor requirement; {rerun}")
    return problems
