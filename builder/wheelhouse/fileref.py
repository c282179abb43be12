"""A file the wheelhouse fetches, checks and serves: a wheel a lock names, or a .deb a Debian
lock names. Both are kept alike: by URL, under their sha256."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FileRef:
    """One file a lock names, and where to get it."""

    project: str  # the Python project or Debian package it belongs to
    filename: str
    url: str
    sha256: str
    size: int | None = None  # as the index lists it, where it does
