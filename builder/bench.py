"""`nox -s bench`: the speed and size targets, measured side by side in one run.

Targets (issues' wording):
- plan + render of the whole matrix: under 2 s;
- the builder's no-op rebuild of a built cell against `docker build` of the same rendered
  Dockerfile with a warm cache: ratio at most 1.2;
- locking the whole matrix with a warm cache (reported; no target);
- bytes downloaded for a set of cells against the sum of their locks' distinct files: 1.0,
  every file downloaded once;
- the self-test on a CPU-only machine: under 180 s per image;
- normalization (reproducible layers) adds at most 25% to a cold build.
Nothing here is asserted in tests: timings are machine-dependent and belong in a report.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import docker
from rich.console import Console
from rich.table import Table

from builder import base, build, engine, lock, matrix, render, repro, smoke, wheelhouse
from builder.cell import Cell

console = Console(width=170)
CPU_CELL = "2.13.0-cpu-bookworm-runtime"


@dataclass
class Row:
    name: str
    measured: str
    reference: str
    ratio: float | None
    target: str
    ok: bool | None


def _seconds(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def bench_plan_render(path: Path) -> Row:
    def plan_and_render() -> None:
        grid = matrix.load_matrix(path)
        for cell in grid.cells:
            render.rendered(cell, grid)

    seconds = min(_seconds(plan_and_render) for _ in range(3))
    cells = len(matrix.load_matrix(path).cells)
    return Row(f"plan + render, {cells} cells", f"{seconds:.2f} s", "-", None, "< 2 s", seconds < 2)


def _docker_cli() -> str | None:
    """A docker CLI that can run the classic builder (Debian's 20.10 does; a CLI without buildx may not)."""
    for candidate in ("/usr/bin/docker", shutil.which("docker")):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def bench_noop_rebuild(grid: matrix.Matrix, cell: Cell) -> Row:
    client = engine.client()
    house = wheelhouse.Wheelhouse()
    result = build.build_cell(client, grid, cell, house, lambda _: None)  # warm the cache
    if result.status != "built":
        return Row("no-op rebuild", "build failed", result.detail, None, "<= 1.2", False)
    builder_s = min(_seconds(lambda: build.build_cell(client, grid, cell, house, lambda _: None)) for _ in range(3))
    cli = _docker_cli()
    if cli is None:
        return Row("no-op rebuild (builder)", f"{builder_s:.2f} s", "no docker CLI", None, "<= 1.2", None)
    base_ref = base.ensure(client, cell.base, grid.spec.source_date_epoch, lambda _: None)
    command = [
        cli, "build", "--quiet", "--network", "host", "--build-arg", f"BASE_IMAGE={base_ref}",
        "-f", str(lock.cell_dir(cell) / "Dockerfile"), "-t", build.local_reference(grid, cell), ".",
    ]  # fmt: skip
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}  # the same classic builder and cache the SDK uses
    with wheelhouse.serve(house, grid.spec.wheelhouse.listen):
        docker_s = min(
            _seconds(lambda: subprocess.run(command, env=env, check=True, capture_output=True, cwd=build.REPO_ROOT))
            for _ in range(3)
        )
    ratio = builder_s / docker_s
    measured, reference = f"{builder_s:.2f} s", f"docker build {docker_s:.2f} s"
    return Row(f"no-op rebuild {cell.name}", measured, reference, ratio, "<= 1.2", ratio <= 1.2)


def bench_lock_warm(grid: matrix.Matrix) -> Row:
    with tempfile.TemporaryDirectory() as scratch:
        original = lock.IMAGES_DIR
        lock.IMAGES_DIR = Path(scratch)
        try:
            lock.lock_cell(grid.cells[0], grid)  # warms uv's cache for shared packages
            seconds = _seconds(lambda: list(lock.lock_cells(grid.cells, grid, jobs=4)))
        finally:
            lock.IMAGES_DIR = original
    return Row(f"lock all {len(grid.cells)} cells (warm cache)", f"{seconds:.1f} s", "-", None, "report", None)


def bench_downloads(grid: matrix.Matrix, cells: list[Cell]) -> Row:
    with tempfile.TemporaryDirectory(dir=wheelhouse.default_root().parent) as scratch:
        house = wheelhouse.Wheelhouse(Path(scratch))
        distinct: dict[str, int] = {}
        for cell in cells:
            for locked in lock.read_locks(cell):
                for ref in house.refs(cell, grid, locked):
                    path = house.fetch(ref)
                    if not ref.url.startswith("file://"):
                        distinct[ref.sha256] = path.stat().st_size
        downloaded = house.bytes_downloaded
    expected = sum(distinct.values())
    ratio = downloaded / expected if expected else None
    names = ", ".join(c.name for c in cells)
    return Row(
        f"bytes downloaded for {names}",
        f"{downloaded / 1e9:.2f} GB",
        f"distinct files {expected / 1e9:.2f} GB",
        ratio,
        "1.0 (each file once)",
        ratio == 1.0 if ratio is not None else None,
    )


def _settle_seconds(client: docker.DockerClient, reference: str, dockerfile: Path) -> float:
    """What the settle-layer.sh steps cost the build: one run over the finished image, times the
    RUN steps that end with it (an upper bound: earlier steps walk a smaller tree)."""
    steps = dockerfile.read_text().count("&& sh /opt/torch-images/settle-layer.sh\n")
    script = "a=$(date +%s%N); sh /opt/torch-images/settle-layer.sh; b=$(date +%s%N); echo $((b - a))"
    output = client.containers.run(reference, ["sh", "-c", script], remove=True, network_mode="none")
    return steps * int(output) / 1e9


def bench_normalization(grid: matrix.Matrix, cell: Cell) -> Row:
    """A cold build (no cache) without normalization, then normalizing its result.

    The settle-layer.sh steps run inside the build, so their cost moves from the build to
    the normalization side of the ratio."""
    client = engine.client()
    house = wheelhouse.Wheelhouse()
    reference = build.local_reference(grid, cell)
    cold = build.build_cell(client, grid, cell, house, lambda _: None, no_cache=True, normalize=False)
    if cold.status != "built":
        return Row("normalization overhead", "build failed", cold.detail, None, "<= 1.25", False)
    epoch = grid.spec.source_date_epoch
    keep = base.layer_count(client, base.ensure(client, cell.base, epoch, lambda _: None))
    normalize_s = _seconds(lambda: repro.normalize_image(client, reference, epoch, keep, lambda _: None))
    settle_s = _settle_seconds(client, reference, lock.cell_dir(cell) / "Dockerfile")
    plain_build = cold.seconds - settle_s
    ratio = (cold.seconds + normalize_s) / plain_build
    return Row(
        f"cold build + normalization, {cell.name}",
        f"{cold.seconds + normalize_s:.0f} s (settle steps {settle_s:.1f} s, after the build {normalize_s:.1f} s)",
        f"cold build without them {plain_build:.0f} s",
        ratio,
        "<= 1.25",
        ratio <= 1.25,
    )


def bench_selftest(grid: matrix.Matrix, cell: Cell) -> Row:
    client = engine.client()
    result = smoke.run(client, build.local_reference(grid, cell), gpus=False)
    return Row(
        f"self-test on CPU, {cell.name}",
        f"{result.seconds:.0f} s ({result.status})",
        "-",
        None,
        "< 180 s",
        result.seconds < 180 and result.status == "pass",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m builder.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--matrix", default=str(matrix.DEFAULT_MATRIX))
    parser.add_argument("--cell", default=CPU_CELL, help="the built cell for rebuild and self-test timings")
    parser.add_argument(
        "--download-cells",
        nargs="*",
        help="cells whose wheels are downloaded into an empty wheelhouse (default: the flagship and its devel sibling)",
    )
    parser.add_argument(
        "--skip", action="append", default=[], choices=["rebuild", "lock", "downloads", "selftest", "normalize"]
    )
    args = parser.parse_args(argv)
    grid = matrix.load_matrix(Path(args.matrix))
    cell = grid.cell(args.cell)
    rows = [bench_plan_render(Path(args.matrix))]
    if "rebuild" not in args.skip:
        rows.append(bench_noop_rebuild(grid, cell))
    if "lock" not in args.skip:
        rows.append(bench_lock_warm(grid))
    if "downloads" not in args.skip:
        flagship = grid.flagship
        sibling = next((c for c in grid.cells if c.name == flagship.name.replace("-runtime", "-devel")), None)
        default = [flagship, *([sibling] if sibling else [])]
        chosen = grid.select(args.download_cells) if args.download_cells else default
        rows.append(bench_downloads(grid, chosen))
    if "normalize" not in args.skip:
        rows.append(bench_normalization(grid, cell))
    if "selftest" not in args.skip:
        rows.append(bench_selftest(grid, cell))
    table = Table(title="torch-images benchmarks")
    for column in ("benchmark", "measured", "reference", "ratio", "target", "ok"):
        table.add_column(column)
    for row in rows:
        verdict = "-" if row.ok is None else ("yes" if row.ok else "NO")
        ratio = f"{row.ratio:.2f}" if row.ratio is not None else "-"
        table.add_row(row.name, row.measured, row.reference, ratio, row.target, verdict)
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
