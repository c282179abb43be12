"""The image ID a cell's build is expected to give: images/<cell>/image-id.

`verify-repro --record` writes it once two builds without cache gave the same ID; from then on a
build on any machine (online, offline from a bundle, `verify-repro --once`) is compared with it,
so another machine's build is evidence too. The file names the build ID it was recorded for (the
hash of every input: context files and base), so that after `lock` or `render` move a cell's
inputs the record reads as stale, never as a failed reproduction. It arrives through pull
requests like the locks: each line by its grammar, or it is refused.

    sha256:<image ID>
    build-id <build ID>
    base sha256:<the base image's ID>

The third line, where present, names the base the image was built on: a base bootstrapped or
loaded from the cache with other content (a rootfs changed in a restored CI cache, say) is
caught by it before any step runs, though the build ID it would give is new (wrong_base).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from builder import confined
from builder.config import grammar
from builder.errors import Location, UserError
from builder.plan.cell import RECORDED_IMAGE_ID_FILE, Cell

IMAGE_ID = RECORDED_IMAGE_ID_FILE
MAX_RECORD_BYTES = 4096  # two lines of about 80 characters
# A normalized build gives the recorded image, with either builder (the canonical image's bytes
# and history do not depend on which one ran the steps); one left as the engine wrote it does not.


@dataclass(frozen=True)
class Record:
    image_id: str  # sha256:<64 hex>
    build_id: str  # 32 hex: the inputs it was built from
    base_id: str | None = None  # sha256:<64 hex>: the base image it was built on, where recorded


def path(cell: Cell) -> Path:
    return cell.file(IMAGE_ID)


def _refuse(cell: Cell, line: int, text: str, want: str) -> UserError:
    return UserError(
        f"{text[:80]!r} is not {want}; record it again with `python -m builder verify-repro --record {cell.name}`",
        Location(path(cell), line),
    )


def read(cell: Cell) -> Record | None:
    """The recorded image and build IDs, or None when none was recorded."""
    where = path(cell)
    if not os.path.lexists(where):
        return None
    lines = confined.read_bytes(where, MAX_RECORD_BYTES).decode(errors="replace").splitlines()
    image_id = lines[0].strip() if lines else ""
    if not image_id.startswith("sha256:") or not grammar.SHA256.matches(image_id.removeprefix("sha256:")):
        raise _refuse(cell, 1, image_id, f"an image ID (sha256:<{grammar.SHA256.hint}>)")
    build_line = lines[1].strip() if len(lines) > 1 else ""
    build_id = build_line.removeprefix("build-id ")
    if not build_line.startswith("build-id ") or not grammar.BUILD_ID.matches(build_id):
        raise _refuse(cell, 2, build_line, f"`build-id <{grammar.BUILD_ID.hint}>`")
    base_line = lines[2].strip() if len(lines) > 2 else ""
    base_id = base_line.removeprefix("base ") or None
    if base_id is not None and (not base_line.startswith("base ") or not _is_image_id(base_id)):
        raise _refuse(cell, 3, base_line, f"`base sha256:<{grammar.SHA256.hint}>`")
    if any(line.strip() for line in lines[3:]):
        raise _refuse(cell, 4, lines[3], "allowed: the file has at most three lines")
    return Record(image_id, build_id, base_id)


def _is_image_id(text: str) -> bool:
    return text.startswith("sha256:") and grammar.SHA256.matches(text.removeprefix("sha256:"))


def write(cell: Cell, image_id: str, build_id: str, base_id: str | None = None) -> Path:
    where = path(cell)
    confined.write_text(where, f"{image_id}\nbuild-id {build_id}\n" + (f"base {base_id}\n" if base_id else ""))
    return where


def wrong_base(cell: Cell, base_id: str, build_id_on: Callable[[str], str]) -> str | None:
    """Why `base_id` is not the base the record says these inputs are built on, or None when it is
    (or when the record names no base, or was made from other inputs). `build_id_on(base)` is
    the cell's build ID on that base: equal to the recorded one, the record is for these inputs."""
    record = read(cell)
    if record is None or record.base_id is None or record.base_id == base_id:
        return None
    if build_id_on(record.base_id) != record.build_id:
        return None  # recorded from other inputs: nothing to compare with
    return (
        f"its base is {base_id[7:19]}, but {path(cell)} was recorded on base {record.base_id[7:19]} "
        "from the same locked packages"
    )


def compare(cell: Cell, image_id: str, build_id: str) -> tuple[bool | None, str]:
    """Whether the image is the recorded one (None when none is recorded for these inputs), and a
    line saying so."""
    record = read(cell)
    if record is None:
        return None, "no image ID recorded"
    if record.build_id != build_id:
        return None, (
            f"the recorded image ID {record.image_id[7:19]} is for other inputs (build ID {record.build_id[:12]}, "
            f"now {build_id[:12]}); record it again with `python -m builder verify-repro --record {cell.name}`"
        )
    if record.image_id == image_id:
        return True, f"the recorded image ID {record.image_id[7:19]}"
    return False, (
        f"image ID {image_id[7:19]} is NOT the recorded image ID {record.image_id[7:19]} ({path(cell)}), from the "
        f"same inputs (build ID {build_id[:12]}); where the recorded image is published, `python -m builder verify "
        "--rebuild` names the first layer that differs"
    )
