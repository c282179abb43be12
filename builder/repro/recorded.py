"""The image ID a cell's build is expected to give: images/<cell>/image-id.

`verify-repro --record` writes it once two builds without cache gave the same ID; from then on a
build on any machine (online, offline from a bundle, `verify-repro --once`) is compared with it,
so another machine's build is evidence too. The file arrives through pull requests like the
locks: it is one image ID by its grammar, or it is refused.
"""

from __future__ import annotations

from pathlib import Path

from builder.errors import Location, UserError
from builder.plan.cell import Cell
from builder.spec import grammar

IMAGE_ID = "image-id"
# The builder's default path gives the recorded image: the classic builder, then normalization.
RECORDED_PATH = ("sdk", True)


def path(cell: Cell) -> Path:
    return cell.directory / IMAGE_ID


def read(cell: Cell) -> str | None:
    """The recorded image ID (sha256:<64 hex>), or None when none was recorded."""
    where = path(cell)
    if not where.exists():
        return None
    text = where.read_text(errors="replace").strip()
    if not text.startswith("sha256:") or not grammar.SHA256.matches(text.removeprefix("sha256:")):
        raise UserError(
            f"{text[:80]!r} is not an image ID; write sha256:<{grammar.SHA256.hint}>, or record it again with "
            f"`python -m builder verify-repro --record {cell.name}`",
            Location(where, 1),
        )
    return text


def write(cell: Cell, image_id: str) -> Path:
    where = path(cell)
    where.write_text(image_id + "\n")
    return where


def compare(cell: Cell, image_id: str) -> tuple[bool | None, str]:
    """Whether the image is the recorded one (None when none is recorded), and a line saying so."""
    recorded = read(cell)
    if recorded is None:
        return None, "no image ID recorded"
    if recorded == image_id:
        return True, f"the recorded image ID {recorded[7:19]}"
    return False, f"NOT the recorded image ID {recorded[7:19]}"
