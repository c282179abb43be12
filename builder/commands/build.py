"""`python -m builder build`: build cells on the engine, then self-test each."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from pathlib import Path

import docker
from rich.table import Table

from builder.assemble import build, bundle, size, smoke
from builder.commands.common import (
    Register,
    cells_of,
    console,
    grid_of,
    progress,
    registry_of,
    registry_options,
    use_registry_option,
)
from builder.engine import bases, daemon
from builder.errors import UserError
from builder.lock.inputs import CellLocks
from builder.oci.registry import Registry
from builder.plan import matrix
from builder.plan.cell import Cell
from builder.publish import existing
from builder.repro import recorded
from builder.terminal import table_console
from builder.wheelhouse import wheelhouse


def add(register: Register) -> None:
    build_cmd = register(
        "build",
        "build cells on the Docker engine, then self-test each",
        "Needs the engine; downloads the locked wheels and .debs once into the cache (~/.cache/torch-images, "
        "TORCH_IMAGES_CACHE moves it), checks each by sha256, and bootstraps the base from its locked packages. "
        "A cell whose inputs did not change since its image was built is not built again.",
    )
    build_cmd.add_argument("cells", nargs="*", help="cells to build (default: the flagship)")
    build_cmd.add_argument("--all", action="store_true", help="every buildable cell")
    build_cmd.add_argument(
        "--skip-existing",
        action="store_true",
        help="do not build a cell whose build ID (a hash of all its inputs) is already in the registry under its "
        "versioned tag; needs the registry (default: build, or find it unchanged in the engine)",
    )
    registry_options(
        build_cmd, "with --skip-existing, look here instead of matrix.yaml's registry: HOST[:PORT][/REPOSITORY]"
    )
    build_cmd.add_argument(
        "--no-cache",
        action="store_true",
        help="build every step again and run the self-test again (default: reuse the engine's cache, "
        "and a passing self-test of the same image ID from an earlier run)",
    )
    build_cmd.add_argument(
        "--fresh-base",
        action="store_true",
        help="bootstrap each cell's base again from its hashed .debs, whatever the cache holds (a rebuild that owes "
        "nothing to the first build's cache: CI's rebuild job)",
    )
    build_cmd.add_argument(
        "--no-smoke", action="store_true", help="skip the self-test (then the image cannot be published)"
    )
    build_cmd.add_argument(
        "--no-normalize", action="store_true", help="keep the engine's timestamps (the image is not reproducible)"
    )
    build_cmd.add_argument(
        "--keep-build-cache",
        action="store_true",
        help="keep the engine's build steps, tagged torch-images/build-cache:<cell>, so that a changed cell "
        "rebuilds only what changed (default: removed after the run)",
    )
    build_cmd.add_argument(
        "--backend",
        choices=["sdk", "buildkit"],
        default="sdk",
        help="sdk (default): the engine's classic builder through the Docker SDK, works with any engine; "
        "buildkit: BuildKit through a docker CLI that offers it (Debian's docker.io 20.10 CLI, or one with buildx)",
    )
    build_cmd.add_argument(
        "--offline",
        action="store_true",
        help="download nothing: every wheel and .deb must be in the cache (or the bundle); no index, mirror, registry",
    )
    build_cmd.add_argument(
        "--bundle",
        type=Path,
        metavar="DIR",
        help="with --offline: rebuild the bundle's cell from the bundle alone (its files are checked against its "
        "manifest first); fails unless the image is the recorded image ID, where one is recorded",
    )
    build_cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.bundle and not args.offline:
        raise UserError("--bundle is for offline rebuilds; give --offline too (`build --offline --bundle DIR CELL`)")

    def say(text: str) -> None:
        console.print(text, highlight=False, soft_wrap=True)

    opened = bundle.open_bundle(args.bundle, say) if args.bundle else None
    # A bundle rebuilds the repository's cell: the repository's matrix and cell folder, with
    # the bundle's cache, once the bundle is shown to hold exactly what the repository commits.
    grid = grid_of(args)
    if opened and args.cells and args.cells != [opened.cell]:
        raise UserError(f"the bundle {opened.root} rebuilds {opened.cell} only; name no other cell")
    cells = [grid.cell(opened.cell)] if opened else cells_of(args, grid)
    checked = {cell.name: build.preflight(cell, grid) for cell in cells}  # before a byte reaches the engine
    if args.fresh_base:
        for locks in checked.values():
            bases.forget_cached_rootfs(build.locked_base_tag(locks))
    if opened:
        bundle.check_against_repository(opened, cells[0], checked[opened.cell])
    client = daemon.client()
    house = wheelhouse.Wheelhouse(offline=args.offline)
    if opened:
        say(f"{opened.root}: {bundle.import_cache(opened, house)} files copied into the cache {house.root}")
    results: list[build.BuildResult] = []
    use_registry_option(grid, args)
    registry = _registry_to_read(grid, args) if args.skip_existing else None
    try:
        for cell in cells:
            published = functools.partial(_published_or_unknown, registry, grid, cell) if registry else None
            # Kept before the self-test runs: an interrupted self-test leaves the run's
            # intermediates to the clean-up below, as a finished one does.
            results.append(_build(client, grid, checked[cell.name], house, args, published))
            _self_test(client, results[-1], args)
    finally:
        if args.keep_build_cache:
            for name in build.keep_intermediates(client, results):
                console.print(f"kept the build cache as {name}")
        else:
            build.discard_intermediates(client, results)
    table = Table(title="build summary")
    for column in ("cell", "tag", "image ID", "size", "build time", "status"):
        table.add_column(column, no_wrap=column in ("cell", "tag", "image ID"))  # whole, to be copied
    for r in results:
        table.add_row(r.cell, r.reference, r.image_id[7:19], size.human(r.size_bytes), f"{r.seconds:.0f} s", r.status)
    table_console().print(table)
    # A build that contradicts its cell's record fails, online and offline alike (its state says so).
    return 0 if all(not r.state.failed for r in results) else 1


def _registry_to_read(grid: matrix.Matrix, args: argparse.Namespace) -> Registry | None:
    """`--skip-existing`'s registry, or None (every cell built) where it cannot be read: CI builds
    before it logs in, and a registry that wants credentials says nothing of what it holds."""
    try:
        return registry_of(grid, args)
    except UserError as unread:
        console.print(f"--skip-existing: {unread.line()}; building every cell named", highlight=False)
        return None


def _published_or_unknown(registry: Registry, grid: matrix.Matrix, cell: Cell, build_id: str) -> bool:
    """`--skip-existing`: whether the build ID is under the cell's versioned tag. CI builds with no
    registry credentials (they come after the build): a registry that will not answer without them
    says nothing either way, and the cell is built."""
    try:
        return existing.is_published(registry, grid, cell, build_id)
    except UserError as unread:
        console.print(f"{cell.name}: cannot tell whether build ID {build_id[:12]} is published ({unread.line()}); "
                      "building it", highlight=False)  # fmt: skip
        return False


def _build(
    client: docker.DockerClient,
    grid: matrix.Matrix,
    locks: CellLocks,
    house: wheelhouse.Wheelhouse,
    args: argparse.Namespace,
    published: Callable[[str], bool] | None = None,
) -> build.BuildResult:
    cell = locks.cell
    with progress(f"{cell.name}: starting") as report:
        options = build.BuildOptions(args.no_cache, not args.no_normalize, args.backend, published)
        result = build.build_cell(client, grid, locks, house, report, options)
        if result.has_image and not args.no_normalize:
            result.recorded, said = recorded.compare(cell, result.image_id, result.build_id)
            report(f"{cell.name}: {said}")
            if result.recorded is True:
                result.notes.append("recorded ID")
            elif result.recorded is False:  # the same inputs, another image: never tested or published
                build.contradicts_record(client, result, said)
        if result.layers:
            report(f"{cell.name}: layers " + ", ".join(size.human(b) for _, b in result.layers))
    return result


def _self_test(client: docker.DockerClient, result: build.BuildResult, args: argparse.Namespace) -> None:
    """The self-test of a built image, then the cell's one line."""
    if result.has_image and not args.no_smoke:
        # --no-cache redoes everything: a report from an earlier run would leave a change to
        # how the self-test runs untried (CI builds the flagship so).
        known = None if args.no_cache else smoke.passing_report(result.image_id)
        if known is not None:
            result.notes.append("self-test pass (earlier run, same image ID)")
        else:
            with progress(f"{result.cell}: running the self-test in the image"):
                verdict = smoke.run(client, result.reference)
            result.notes.append(f"self-test {verdict.status}")
            result.detail = verdict.summary
            if verdict.status != "pass":
                result.state = build.BuildState.SELFTEST_FAILED
    console.print(
        f"{result.cell}: {result.status} ({result.detail})" if result.detail else f"{result.cell}: {result.status}",
        highlight=False,
    )
