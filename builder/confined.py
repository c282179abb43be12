"""Files inside a folder the builder owns: images/, a bundle, the wheelhouse cache.

Everything under those folders arrives from somewhere the builder does not control (a pull
request, a disk, another process), and the builder runs as root. So a path below such a folder
is never followed through a symbolic link, and a name that would leave the folder (absolute,
`..`, `.`, an empty part as in `a//b`, a backslash, a control character) is refused with one
line. The top folder itself may be a link (a cache that CI restores, an images/ folder kept
elsewhere); everything below it may not.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from builder.errors import Location, UserError

SAFE_NAME_HINT = "a relative path of plain names separated by single '/' (no leading '/', no '..', '.' or '//')"


def name_parts(name: str, where: Location | Path | str | None = None) -> tuple[str, ...]:
    """The parts of a relative POSIX name, refused with one line when it could leave its folder."""
    parts = tuple(name.split("/"))
    if (
        not name
        or name.startswith("/")
        or any(part in ("", ".", "..") for part in parts)
        or "\\" in name
        or not name.isprintable()
    ):
        raise UserError(f"{name[:80]!r} is not {SAFE_NAME_HINT}", where)
    return parts


def check_no_links(root: Path, path: Path) -> None:
    """Refuse when any part of `path` below `root` is a symbolic link (the parts that exist)."""
    relative = path.relative_to(root)
    current = root
    for part in relative.parts:
        current = current / part
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(info.st_mode):
            raise UserError(
                f"is a symbolic link (to {os.readlink(current)[:80]!r}); the builder follows no link below {root}: "
                "replace it with the file or folder itself",
                current,
            )


def inside(root: Path, name: str, where: Location | Path | str | None = None) -> Path:
    """`root / name`, after checking the name and that nothing below `root` on the way is a link."""
    path = root.joinpath(*name_parts(name, where))
    check_no_links(root, path)
    return path


def read_bytes(path: Path, limit: int | None = None) -> bytes:
    """A regular file's bytes, never through a symbolic link; at most `limit` bytes, else refused."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as error:
        if os.path.islink(path):
            raise UserError(
                "is a symbolic link; the builder reads no file through a link: put the file itself here", path
            ) from None
        raise UserError(f"cannot read: {error.strerror}", path) from None
    if not stat.S_ISREG(os.fstat(handle).st_mode):  # before fdopen, which refuses a folder with a traceback
        os.close(handle)
        raise UserError("is not a regular file", path)
    with os.fdopen(handle, "rb") as file:
        data = file.read() if limit is None else file.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise UserError(f"is larger than {limit} bytes, the most such a file may hold", path)
    return data


def write_text(path: Path, text: str) -> None:
    """Write a file whole or not at all, never through a symbolic link: a link in its place, a
    dangling one included, is refused, not followed. The text goes to a new file beside it first,
    which then replaces it (a rename replaces a name, never what a link names), so an interrupted
    write leaves the old file as it was."""
    if os.path.islink(path):
        raise UserError("is a symbolic link; the builder writes no file through a link: remove it", path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except OSError as error:
        raise UserError(f"cannot write: {error.strerror}", path) from None
    try:
        with os.fdopen(handle, "w") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
