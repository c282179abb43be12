"""The matrix sweep: every buildable cell built and self-tested in turn on one machine, each
cell's images removed before the next (24 CUDA images do not fit one disk at once), and a record
kept (images/sweep.json) from which docs/matrix.md is written. A rerun skips a cell whose build
ID already passed, so an interrupted sweep goes on where it stopped. A cell that passes with no
recorded image ID for its inputs gets one (images/<cell>/image-id, with its base); one whose
image is not its record fails."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import docker

from builder import confined, digests, jsonread, times
from builder.assemble import build, size, smoke
from builder.engine import daemon, ids
from builder.errors import UserError
from builder.plan.cell import Cell
from builder.plan.matrix import Matrix
from builder.repro import recorded
from builder.steps import Report
from builder.terminal import code_text, markdown_text
from builder.wheelhouse import wheelhouse

RECORD_NAME = "sweep.json"
MAX_RECORD_BYTES = 1 << 20


@dataclass(frozen=True)
class SweepRow:
    """One cell's last sweep: what was built, how big, how long, and what its self-test said."""

    cell: str
    platform: str
    build_id: str
    image_id: str
    size_bytes: int
    largest_layer_bytes: int
    build_seconds: float
    checks_passed: int
    checks_total: int
    status: str  # pass | fail | build failed
    detail: str
    engine: str
    date: str  # YYYY-MM-DD, UTC
    # The sha256 of the cell's Dockerfile when it was swept: its whole build context, which names
    # every lock, script and the self-test by sha256. The table compares it with the checkout's
    # (offline: the build ID also needs the base's image ID). Empty in rows from before it was kept.
    dockerfile: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "pass"


def _shortened(text: str, most: int = 300) -> str:
    """Text for the record: its start and its end, where a failed step's own last lines are
    (the engine's error first quotes the whole command, which alone would fill the space)."""
    if len(text) <= most:
        return text
    return f"{text[: most // 3]} … {text[-(most - most // 3 - 3) :]}"


def record_path(grid: Matrix) -> Path:
    return grid.images_dir / RECORD_NAME


def table_path(grid: Matrix) -> Path:
    """docs/matrix.md beside the matrix's images/ folder."""
    return grid.images_dir.parent / "docs" / "matrix.md"


def read_record(path: Path) -> dict[str, SweepRow]:
    """The record a sweep keeps, by cell; a record that is not one (edited by hand, cut short) is
    one line naming the file."""
    if not path.exists():
        return {}
    data = jsonread.loads(confined.read_bytes(path, MAX_RECORD_BYTES), str(path))
    fields = set(SweepRow.__dataclass_fields__)
    shapes = (fields, fields - {"dockerfile"})  # rows from before the Dockerfile's sha256 was kept
    if not isinstance(data, dict) or not all(isinstance(v, dict) and set(v) in shapes for v in data.values()):
        raise UserError(f"is not a sweep record (an object of cells, each with {', '.join(sorted(fields))}); "
                        "remove it and sweep again", path)  # fmt: skip
    for name, row in data.items():
        wrong = _wrong_field(row)
        if wrong is not None:
            raise UserError(f"is not a sweep record: {markdown_text(name)[:80]}'s {wrong}; remove it and sweep again",
                            path)  # fmt: skip
    return {name: SweepRow(**row) for name, row in data.items()}


def _wrong_field(row: dict[str, Any]) -> str | None:
    """The first field of a row that is not of its kind (a string, or a finite number not below
    zero), said as `field is not ...`; None for a row of the right kinds."""
    for name, kind in (("size_bytes", int), ("largest_layer_bytes", int), ("checks_passed", int),
                       ("checks_total", int), ("build_seconds", float)):  # fmt: skip
        value = row.get(name)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not isinstance(value, (int, float)) or not number or (kind is int and not isinstance(value, int)):
            return f"{name} is not a {'whole ' if kind is int else ''}number of zero or more"
        if not math.isfinite(value) or value < 0:
            return f"{name} is not a {'whole ' if kind is int else ''}number of zero or more"
    for name in ("cell", "platform", "build_id", "image_id", "status", "detail", "engine", "date", "dockerfile"):
        if not isinstance(row.get(name, ""), str):
            return f"{name} is not a string"
    return None


def write_record(path: Path, rows: dict[str, SweepRow]) -> None:
    text = json.dumps({name: asdict(rows[name]) for name in sorted(rows)}, indent=1, sort_keys=True) + "\n"
    confined.write_text(path, text)


def sweep_cell(
    engine: docker.DockerClient,
    grid: Matrix,
    cell: Cell,
    house: wheelhouse.Wheelhouse,
    report: Report,
    engine_name: str,
) -> SweepRow:
    """Build and self-test one cell, then remove its images; the row says how it went."""
    started = time.monotonic()
    result = build.BuildResult(cell.name, build.local_reference(grid, cell))
    try:
        locks = build.preflight(cell, grid)
        result = build.build_cell(engine, grid, locks, house, report, build.BuildOptions(no_cache=True))
        agrees, said = recorded.compare(cell, result.image_id, result.build_id) if result.has_image else (None, "")
        if agrees is False:
            build.contradicts_record(engine, result, said)
        verdict = smoke.run(engine, result.reference) if result.has_image else None
        if verdict is not None and verdict.status == "pass" and agrees is None:
            # A build without cache whose image passed its self-test: later builds, here or on
            # another machine, are held to it (docs/reproducible-builds.md).
            recorded.write(cell, result.image_id, result.build_id, result.base_id)
    except UserError as error:
        verdict, result.detail = None, error.line()
    finally:
        build.discard_intermediates(engine, [result])
    largest = max((bytes_ for _, bytes_ in result.layers), default=0)
    checks = verdict.report.get("checks", []) if verdict else []
    row = SweepRow(
        cell=cell.name,
        platform=cell.platform,
        build_id=result.build_id,
        image_id=result.image_id,
        size_bytes=result.size_bytes,
        largest_layer_bytes=largest,
        build_seconds=round(result.seconds or time.monotonic() - started, 1),
        checks_passed=sum(1 for c in checks if c.get("status") == "pass"),
        checks_total=len(checks),
        status=verdict.status if verdict else "build failed",
        detail=_shortened(verdict.summary if verdict else result.detail),
        engine=engine_name,
        date=times.iso_utc(int(time.time()))[:10],
        dockerfile=dockerfile_sha256(cell),
    )
    build.remove_image(engine, result.reference)
    return row


def sweep(
    engine: docker.DockerClient, grid: Matrix, cells: list[Cell], house: wheelhouse.Wheelhouse, report: Report
) -> dict[str, SweepRow]:
    """Sweep the cells in turn, writing the record and the table after each; returns the record."""
    path = record_path(grid)
    rows = read_record(path)
    engine_name = daemon.description(engine)
    for number, cell in enumerate(cells, 1):
        step = f"[{number}/{len(cells)}] {cell.name}"
        previous = rows.get(cell.name)
        if (
            previous is not None
            and previous.passed
            and previous.build_id == _current_build_id(engine, grid, cell, house)
        ):
            report(f"{step}: passed at build ID {previous.build_id[:12]} already; skipped")
            continue
        report(f"{step}: building without cache, then self-testing")
        rows[cell.name] = sweep_cell(engine, grid, cell, house, report, engine_name)
        report(f"{step}: {rows[cell.name].status} ({rows[cell.name].detail})")
        write_record(path, rows)
        confined.write_text(table_path(grid), table(grid, rows))
    confined.write_text(table_path(grid), table(grid, rows))
    return rows


def record_passed(
    engine: docker.DockerClient, grid: Matrix, cells: list[Cell], house: wheelhouse.Wheelhouse, report: Report
) -> list[str]:
    """Write images/<cell>/image-id, with its base, for each cell whose sweep row passed at the build
    ID the cell has on this machine: the build ID hashes the base's image ID, so its equality says
    that the base bootstrapped here is the one the sweep built on. Returns the cells written."""
    rows, written = read_record(record_path(grid)), []
    for cell in cells:
        row = rows.get(cell.name)
        if row is None or not row.passed:
            report(f"{cell.name}: no passing sweep row; not recorded")
            continue
        try:
            base_reference, build_id = build.cell_build_id(engine, grid, build.preflight(cell, grid), report, house)
        except UserError as refused:
            report(f"{cell.name}: {refused.line()}; not recorded")
            continue
        if build_id != row.build_id:
            report(f"{cell.name}: swept at build ID {row.build_id[:12]}, {build_id[:12]} here; not recorded")
            continue
        agrees, said = recorded.compare(cell, row.image_id, build_id)
        if agrees is False:  # a record of these inputs says otherwise: the two runs disagree
            report(f"{cell.name}: the sweep's {said}; not recorded")
            continue
        recorded.write(cell, row.image_id, build_id, ids.config_digest(engine, base_reference))
        report(f"{cell.name}: recorded {row.image_id[7:19]} (build ID {build_id[:12]})")
        written.append(cell.name)
    return written


def _current_build_id(engine: docker.DockerClient, grid: Matrix, cell: Cell, house: wheelhouse.Wheelhouse) -> str:
    """The cell's build ID now (its base obtained if missing), or "" where its inputs are refused."""
    try:
        return build.cell_build_id(engine, grid, build.preflight(cell, grid), lambda _: None, house)[1]
    except UserError:
        return ""


def dockerfile_sha256(cell: Cell) -> str:
    path = cell.file("Dockerfile")
    return digests.sha256_file(path) if path.is_file() else ""


def table(grid: Matrix, rows: dict[str, SweepRow]) -> str:
    """docs/matrix.md: every cell of the matrix, with its last sweep where it has one."""
    current = {cell.name: cell for cell in grid.cells}
    lines = [
        "# The matrix, built and self-tested",
        "",
        "Written by `python -m builder sweep` (`./nox -s sweep`) from `images/sweep.json`; do not edit. Each",
        "row is the cell's last sweep on one machine: built without cache, self-tested in the image (no GPU",
        "there: the GPU checks are skipped), then removed before the next cell. A row marked *stale* was",
        "swept from another Dockerfile than this checkout's (its locks, scripts or self-test moved since):",
        "sweep it again.",
        "",
        "| cell | platform | build ID | image ID | size | largest layer | build | self-test | engine | date |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in sorted(current):
        row = rows.get(name)
        if row is None:
            lines.append(f"| {name} | {current[name].platform} | not swept | | | | | | | |")
            continue
        said = f"{row.status}, {row.checks_passed}/{row.checks_total}" if row.checks_total else row.status
        verdict = markdown_text(said)
        if row.dockerfile != dockerfile_sha256(current[name]):
            verdict = f"*stale*: {verdict}"
        cells = [name, markdown_text(row.platform), markdown_text(row.build_id[:12]), markdown_text(row.image_id[7:19]),
                 size.human(row.size_bytes), size.human(row.largest_layer_bytes), f"{row.build_seconds:.0f} s", verdict,
                 markdown_text(row.engine), markdown_text(row.date)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join([*lines, *_rejected_section(grid), *_former_section(current, rows)]) + "\n"


def _rejected_section(grid: Matrix) -> list[str]:
    """The axes' combinations the matrix rejects, each with its reason (what `plan` says)."""
    if not grid.rejected:
        return []
    lines = ["", "## Rejected combinations", "", "Not built: `python -m builder plan` gives the same reasons.", ""]
    lines += ["| combination | reason |", "|---|---|"]
    lines += [
        f"| {markdown_text(r.name)} | {markdown_text(r.reason)} |" for r in sorted(grid.rejected, key=lambda r: r.name)
    ]
    return lines


def _former_section(current: dict[str, Cell], rows: dict[str, SweepRow]) -> list[str]:
    """Swept rows of cells the matrix no longer builds: their last result, kept as history."""
    former = sorted(name for name in rows if name not in current)
    if not former:
        return []
    lines = ["", "## Swept before, no longer built", "", "| cell | build ID | result | date |", "|---|---|---|---|"]
    for name in former:
        row = rows[name]
        lines.append(f"| {code_text(name)} | {markdown_text(row.build_id[:12])} | {markdown_text(row.status)}: "
                     f"{markdown_text(row.detail)} | {markdown_text(row.date)} |")  # fmt: skip
    return lines
