"""`python -m builder ...`: a thin layer that parses flags and calls one stage each."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
from rich.console import Console
from rich.table import Table

from builder.assemble import build, bundle, size, smoke, twice, wheelhouse
from builder.config import grammar, schema
from builder.engine import daemon, emulation
from builder.errors import EXIT_USER_ERROR, UserError
from builder.facts import compat, refresh
from builder.lock import debian, inputs
from builder.lock import requirements as lock
from builder.lock.inputs import CellLocks
from builder.plan import matrix, offers
from builder.plan.cell import Cell
from builder.publish import existing, publish, staging
from builder.publish.registry import Registry
from builder.render import ci, render
from builder.repro import recorded

console = Console(stderr=True)


def _matrix(args: argparse.Namespace) -> matrix.Matrix:
    return matrix.load_matrix(Path(args.matrix))


@contextlib.contextmanager
def progress(label: str) -> Iterator[Callable[[str], None]]:
    """Where each step of a long job is reported: a spinner on a terminal; elsewhere (CI logs,
    `| tee`) one line per step with the seconds since the job started."""
    if console.is_terminal:
        with console.status(label) as status:
            yield lambda text: status.update(text)
        return
    started = time.monotonic()

    def line(text: str) -> None:
        console.print(f"[{time.monotonic() - started:7.1f} s] {text}", highlight=False, soft_wrap=True)

    line(label)
    yield line


def _cells(args: argparse.Namespace, grid: matrix.Matrix) -> list:  # type: ignore[type-arg]
    if getattr(args, "all", False):
        return grid.cells
    if getattr(args, "cells", None):
        return grid.select(args.cells)
    return [grid.flagship]


def cmd_plan(args: argparse.Namespace) -> int:
    grid = _matrix(args)
    rows = [{**c.spec(), "status": "ok"} for c in grid.cells]
    rows += [{"cell": r.name, **r.selector, "status": f"rejected: {r.reason}"} for r in grid.rejected]
    trtllm = offers.trtllm_offers(grid, compat.load_trtllm_table()) if grid.spec.uses_flavor("trtllm") else None
    if args.json:
        print(json.dumps({"cells": rows, **({"trtllm": trtllm} if trtllm else {})}, indent=1))
        return 0
    table = Table(title=f"{args.matrix}: {len(grid.cells)} cells, {len(grid.rejected)} rejected")
    columns = ("cell", "torch", "cuda", "cudnn", "python", "glibc", "base", "flavor", "platform", "tag", "status")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(str(row.get(k) or "") for k in columns))
    Console(width=200).print(table)
    for line in offers.describe(trtllm) if trtllm else []:
        console.print(line, highlight=False, soft_wrap=True)
    return 0


def cmd_compat_refresh(args: argparse.Namespace) -> int:
    spec, _ = schema.parse(Path(args.matrix))
    refresh.refresh(spec, lambda text: console.print(text, highlight=False))
    return 0


def cmd_lock(args: argparse.Namespace) -> int:
    grid = _matrix(args)
    cells = grid.cells if args.all or not args.cells else grid.select(args.cells)
    if args.check:
        problems = [p for cell in cells for p in inputs.read(cell, grid).problems]
        for problem in problems:
            print(problem)
        return 1 if problems else 0
    if args.debian_only and args.python_only:
        raise UserError("--debian-only and --python-only exclude each other; give one")
    return _lock(grid, cells, args.jobs, args.python_only, args.debian_only)


def _lock(grid: matrix.Matrix, cells: list[Cell], jobs: int, python_only: bool, debian_only: bool = False) -> int:
    failures = []
    locked = list(cells) if debian_only else []
    with progress(f"locking {len(cells)} cells, {jobs} at a time") as report:
        for cell, outcome in [] if debian_only else lock.lock_cells(cells, grid, jobs):
            if isinstance(outcome, UserError):  # one cell that cannot resolve must not stop the others
                failures.append(outcome.line())
            else:
                locked.append(cell)
                report(f"{cell.name}: {', '.join(str(p) for p in outcome)}")
    if locked and not python_only:
        with progress("pinning Debian packages (apt resolves in a container of each base)") as report:
            for cell, path in debian.lock_cells(locked, grid.spec.source_date_epoch, daemon.client()):
                report(f"{cell.name}: {path}")
    for failure in failures:
        console.print(f"[red]error:[/red] {failure}", highlight=False, soft_wrap=True)
    return EXIT_USER_ERROR if failures else 0


def cmd_render(args: argparse.Namespace) -> int:
    grid = _matrix(args)
    if args.check:
        problems = render.drift(grid.cells, grid) + render.plan_drift(grid) + render.orphans(grid)
        for problem in problems:
            print(problem)
        if problems:
            print(f"{grid.images_dir} does not match {grid.path.name} and templates/; run `python -m builder render`")
        return 1 if problems else 0
    return _render(grid)


def _render(grid: matrix.Matrix) -> int:
    written = render.render(grid.cells, grid)
    removed = render.remove_orphans(grid)
    console.print(
        f"rendered {len(grid.cells)} cells into {grid.images_dir}, {len(written)} files changed"
        + (f", removed {len(removed)} folders of cells the matrix no longer has" if removed else "")
    )
    for problem in render.orphans(grid):  # folders holding files render does not write are left alone
        console.print(f"left in place: {problem} (it holds files render did not write)")
    return 0


def cmd_update(args: argparse.Namespace) -> int:
    """compat refresh, lock and render, in that order: each reads what the one before wrote."""
    if not args.no_refresh:
        cmd_compat_refresh(args)
    grid = _matrix(args)  # read again: the refresh may have changed which cells can be built
    status = _lock(grid, grid.cells, args.jobs, args.python_only)
    return status or _render(_matrix(args))


def cmd_engine(args: argparse.Namespace) -> int:
    console.print(daemon.ensure_running(install=args.install, test_tools=args.test_tools))
    for arch in args.emulate:  # before a build needs it: a CI machine that builds arm64 cells
        emulation.ensure(arch, lambda text: console.print(text))
        console.print(f"{arch} programs run here" + (" (emulated)" if arch != emulation.host_architecture() else ""))
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    if args.bundle and not args.offline:
        raise UserError("--bundle is for offline rebuilds; give --offline too (`build --offline --bundle DIR CELL`)")

    def say(text: str) -> None:
        console.print(text, highlight=False, soft_wrap=True)

    opened = bundle.open_bundle(args.bundle, say) if args.bundle else None
    # A bundle rebuilds the repository's cell: the repository's matrix and cell folder, with
    # the bundle's cache, once the bundle is shown to hold exactly what the repository commits.
    grid = _matrix(args)
    if opened and args.cells and args.cells != [opened.cell]:
        raise UserError(f"the bundle {opened.root} rebuilds {opened.cell} only; name no other cell")
    cells = [grid.cell(opened.cell)] if opened else _cells(args, grid)
    checked = {cell.name: build.preflight(cell, grid) for cell in cells}  # before a byte reaches the engine
    if opened:
        bundle.check_against_repository(opened, cells[0], checked[opened.cell])
    client = daemon.client()
    house = wheelhouse.Wheelhouse(offline=args.offline)
    if opened:
        say(f"{opened.root}: {bundle.import_cache(opened, house)} files copied into the cache {house.root}")
    results: list[build.BuildResult] = []
    _use_registry_option(grid, args)
    registry = _registry(grid, args) if args.skip_existing else None
    try:
        for cell in cells:
            published = functools.partial(existing.is_published, registry, grid, cell) if registry else None
            results.append(_build_and_test(client, grid, checked[cell.name], house, args, published))
    finally:
        if args.keep_build_cache:
            for name in build.keep_intermediates(client, results):
                console.print(f"kept the build cache as {name}")
        else:
            build.discard_intermediates(client, results)
    table = Table(title="build summary")
    for column in ("cell", "tag", "image ID", "size", "build time", "status"):
        table.add_column(column)
    for r in results:
        table.add_row(r.cell, r.reference, r.image_id[7:19], size.human(r.size_bytes), f"{r.seconds:.0f} s", r.status)
    Console(width=200).print(table)
    # An offline rebuild is a reproduction: an image other than the recorded one fails it.
    differs = args.offline and any(r.recorded is False for r in results)
    return 0 if all(not r.state.failed for r in results) and not differs else 1


def _use_registry_option(grid: matrix.Matrix, args: argparse.Namespace) -> None:
    """--registry, where given, in place of matrix.yaml's registry."""
    if args.registry:
        grid.spec = grid.spec.model_copy(update={"registry": args.registry})


def _registry(grid: matrix.Matrix, args: argparse.Namespace) -> Registry:
    """The matrix's registry, reached as --registry-ca and --insecure-registry say."""
    found = Registry.for_publishing(grid.spec.registry, args.registry_ca, args.insecure_registry)
    found.check()
    return found


def _build_and_test(
    client: docker.DockerClient,
    grid: matrix.Matrix,
    locks: CellLocks,
    house: wheelhouse.Wheelhouse,
    args: argparse.Namespace,
    published: Callable[[str], bool] | None = None,
) -> build.BuildResult:
    cell = locks.cell
    with progress(f"{cell.name}: starting") as report:
        result = build.build_cell(
            client, grid, locks, house, report, args.no_cache, not args.no_normalize, args.backend, published=published
        )
        if result.has_image and (args.backend, not args.no_normalize) == recorded.RECORDED_PATH:
            result.recorded, said = recorded.compare(cell, result.image_id, result.build_id)
            report(f"{cell.name}: {said}")
            if result.recorded is not None:
                result.notes.append("recorded ID" if result.recorded else "NOT the recorded ID")
        if result.layers:
            report(f"{cell.name}: layers " + ", ".join(size.human(b) for _, b in result.layers))
        if result.has_image and not args.no_smoke:
            known = smoke.passing_report(result.image_id)
            if known is not None:
                result.notes.append("self-test pass (earlier run, same image ID)")
            else:
                report(f"{cell.name}: running the self-test in the image")
                verdict = smoke.run(client, result.reference)
                result.notes.append(f"self-test {verdict.status}")
                result.detail = verdict.summary
                if verdict.status != "pass":
                    result.state = build.BuildState.SELFTEST_FAILED
    console.print(
        f"{cell.name}: {result.status} ({result.detail})" if result.detail else f"{cell.name}: {result.status}",
        highlight=False,
    )
    return result


def cmd_smoke(args: argparse.Namespace) -> int:
    client = daemon.client()
    references = args.targets
    if not references:
        grid = _matrix(args)
        references = [build.local_reference(grid, grid.flagship)]
    elif any(not (":" in t or t.startswith("sha256")) for t in references):
        grid = _matrix(args)
        references = [t if ":" in t else build.local_reference(grid, grid.cell(t)) for t in references]
    failed = 0
    for reference in references:
        with progress(f"{reference}: running the self-test"):
            verdict = smoke.run(client, reference, gpus=None if not args.cpu else False)
        print(verdict.report.get("table", ""), end="")
        console.print(f"{reference}: self-test {verdict.status} ({verdict.summary}); report: {verdict.path}")
        failed += verdict.status != "pass"
    return 1 if failed else 0


def cmd_size(args: argparse.Namespace) -> int:
    client = daemon.client()
    grid = _matrix(args)
    target = args.target or grid.flagship.name
    reference = (
        target if ":" in target or target.startswith("sha256:") else build.local_reference(grid, grid.cell(target))
    )
    try:
        image_id = client.images.get(reference).id
    except docker.errors.ImageNotFound:
        raise UserError(
            f"no image {reference} in the engine; build it first (`python -m builder build {target}`)"
        ) from None
    with progress(f"{reference}: reading its layers"):
        layers = size.layers(client, image_id)
    table = Table(title=f"{reference}: {size.human(sum(layer.size for layer in layers))} uncompressed")
    for column in ("layer", "size", "step", "largest inside"):
        table.add_column(column)
    for layer in layers:
        largest = "\n".join(f"{size.human(b):>9}  {name}" for name, b in layer.largest(args.top))
        table.add_row(str(layer.index), size.human(layer.size), layer.step[:60], largest)
    Console(width=200).print(table)
    return 0


def _registry_options(command: argparse.ArgumentParser, registry_help: str) -> None:
    command.add_argument("--registry", type=_registry_option, help=registry_help)
    command.add_argument(
        "--registry-ca",
        type=_existing_file,
        metavar="FILE",
        help="trust this CA for the registry's HTTPS certificate (default: the system's CA store only)",
    )
    command.add_argument(
        "--insecure-registry",
        action="store_true",
        help="plain HTTP to a registry that is not on a loopback address (default: HTTPS; loopback gets HTTP)",
    )


def _registry_option(value: str) -> str:
    if not grammar.REGISTRY.matches(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a registry: write {grammar.REGISTRY.hint}")
    return value


def _existing_file(value: str) -> Path:
    if not Path(value).is_file():
        raise argparse.ArgumentTypeError(f"{value} is not a file: give the registry's CA certificate (PEM)")
    return Path(value)


def cmd_publish(args: argparse.Namespace) -> int:
    grid = _matrix(args)
    _use_registry_option(grid, args)
    cells, say = _cells(args, grid), lambda text: console.print(text)
    if args.stage or args.promote:
        staging.check_run(args.run)
        registry = _registry(grid, args)
        if args.stage:
            items = staging.stage(daemon.client(), registry, grid, cells, args.run, say)
            for item in items:
                console.print(f"{item.cell.name}: staged {grid.spec.registry}/{grid.spec.repository}:{item.target}")
            return 0
        items = staging.promote(registry, grid, cells, args.run, say)
    else:
        items = publish.publish(
            daemon.client(), grid, cells, say, ca_file=args.registry_ca, insecure=args.insecure_registry
        )
    for item in items:
        state = "unchanged" if item.unchanged and not item.moved_aliases else "published"
        where = f" ({item.cell.platform} {item.target} {item.digest})" if item.tag_digest else ""
        console.print(
            f"{item.cell.name}: {state} {grid.spec.registry}/{grid.spec.repository}:{item.cell.tag} "
            f"{item.points_to}{where}"
        )
    return 0


def cmd_ci(args: argparse.Namespace) -> int:
    text = ci.workflow(_matrix(args), args.system)
    if args.output:
        Path(args.output).write_text(text)
        console.print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_verify_repro(args: argparse.Namespace) -> int:
    grid = _matrix(args)
    client = daemon.client()
    house = wheelhouse.Wheelhouse()
    cells = _cells(args, grid)
    if args.once:
        return _verify_against_recorded(client, grid, cells, house)
    failed = 0
    for cell in cells:
        verdict, build_id = twice.build_twice(client, grid, cell, house, progress)
        table = Table(title=f"{cell.name}: {'reproducible' if verdict.reproducible else 'NOT reproducible'}")
        for column in ("layer", "build 1", "build 2", "same"):
            table.add_column(column)
        for index, (first, second) in enumerate(verdict.layers):
            table.add_row(str(index), first[7:19], second[7:19], "yes" if first == second else "NO")
        Console(width=200).print(table)
        console.print(f"image ID: {verdict.first_id[7:19]} and {verdict.second_id[7:19]}")
        for index, paths in verdict.differences.items():
            console.print(f"layer {index} differs in: {', '.join(paths)}")
        failed += not verdict.reproducible
        same, said = recorded.compare(cell, verdict.first_id, build_id)
        if args.record and verdict.reproducible:
            written = recorded.write(cell, verdict.first_id, build_id)
            console.print(f"{cell.name}: recorded {verdict.first_id[7:19]} in {written}")
        else:
            console.print(f"{cell.name}: {said}")
            failed += same is False
    return 1 if failed else 0


def _verify_against_recorded(
    client: docker.DockerClient, grid: matrix.Matrix, cells: list[Cell], house: wheelhouse.Wheelhouse
) -> int:
    """One build without cache per cell, compared with its recorded image ID."""
    failed = 0
    for cell in cells:
        if recorded.read(cell) is None:
            raise UserError(
                f"{cell.name} has no recorded image ID ({recorded.path(cell)}); record one with "
                f"`python -m builder verify-repro --record {cell.name}`"
            )
        image_id, build_id = twice.build_once(client, grid, cell, house, progress)
        same, said = recorded.compare(cell, image_id, build_id)
        console.print(f"{cell.name}: built {image_id[7:19]}: {said}")
        failed += same is not True  # a record for other inputs proves nothing either way
    return 1 if failed else 0


def cmd_bundle(args: argparse.Namespace) -> int:
    grid = _matrix(args)
    cell = grid.cell(args.cell)
    started = time.monotonic()
    with progress(f"{cell.name}: bundling into {args.output}") as report:
        made = bundle.gather(grid, cell, args.output, wheelhouse.Wheelhouse(report=report), report)
    total = sum((made.root / name).stat().st_size for name in made.files)
    console.print(
        f"{cell.name}: bundled {len(made.files)} files ({size.human(total)}) into {made.root} in "
        f"{time.monotonic() - started:.0f} s; rebuild with "
        f"`python -m builder build --offline --bundle {made.root}`"
    )
    return 0


NEEDS_NOTHING = "Offline; needs no engine."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m builder",
        description="Reproducible, tested container images for GPU PyTorch, from one matrix file. "
        "Every command takes --matrix before or after its name.",
    )
    matrix_help = "the matrix file (default: ./matrix.yaml); its images: folder is beside it"
    parser.add_argument("--matrix", default=str(schema.DEFAULT_MATRIX), help=matrix_help)
    # The same option after the subcommand; SUPPRESS keeps the value given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--matrix", default=argparse.SUPPRESS, help=matrix_help)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, details: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, parents=[common], help=summary, description=f"{summary}. {details}")

    plan = command(
        "plan", "list every cell with resolved versions, or why it is rejected", NEEDS_NOTHING + " Reads data/."
    )
    plan.add_argument("--json", action="store_true", help="print JSON (for CI matrices) instead of a table")
    plan.set_defaults(func=cmd_plan)

    lock_cmd = command(
        "lock",
        "resolve hash-pinned requirements (requirements.lock, flavor.lock) and Debian pins (debian.lock)",
        "Needs the package index (PyPI or the matrix's indexes) and, for Debian pins, the engine and the distro "
        "mirror. Writes images/<cell>/. With --check: offline, needs no engine, writes nothing.",
    )
    lock_cmd.add_argument("cells", nargs="*", help="cells to lock (default: every buildable cell)")
    lock_cmd.add_argument("--all", action="store_true", help="every buildable cell (the default when none is named)")
    lock_cmd.add_argument(
        "--check",
        action="store_true",
        help="validate every line of the locks and fail when one does not match the matrix or was edited; offline",
    )
    lock_cmd.add_argument("--jobs", type=int, default=4, help="cells resolved at once (default: 4)")
    lock_cmd.add_argument("--python-only", action="store_true", help="skip the Debian pins (then no engine is needed)")
    lock_cmd.add_argument(
        "--debian-only",
        action="store_true",
        help="pin only the Debian packages, keeping the Python locks as they are (after a distro point release)",
    )
    lock_cmd.set_defaults(func=cmd_lock)

    render_cmd = command(
        "render",
        "write images/<cell>/Dockerfile and spec.json from templates/ and the locks",
        NEEDS_NOTHING + " Removes folders of cells the matrix no longer has.",
    )
    render_cmd.add_argument(
        "--check", action="store_true", help="fail when images/ differs from a fresh render; writes nothing"
    )
    render_cmd.set_defaults(func=cmd_render)

    build_cmd = command(
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
    _registry_options(build_cmd, "with --skip-existing, look here instead of matrix.yaml's registry (host:port)")
    build_cmd.add_argument("--no-cache", action="store_true", help="build every step again (default: reuse the cache)")
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
    build_cmd.set_defaults(func=cmd_build)

    publish_cmd = command(
        "publish",
        "push cells whose self-test passed for that exact image ID, then their SBOM and report, then aliases",
        "Needs the engine and the registry; credentials as docker finds them (~/.docker/config.json: auths, "
        "credHelpers, credsStore; `docker login` writes them), else TORCH_IMAGES_REGISTRY_USER and "
        "TORCH_IMAGES_REGISTRY_PASSWORD; token and basic authentication. Writes published/<cell>.json beside "
        "the matrix.",
    )
    publish_cmd.add_argument("cells", nargs="*", help="cells to publish (default: the flagship)")
    publish_cmd.add_argument("--all", action="store_true", help="every buildable cell")
    _registry_options(publish_cmd, "push here instead of matrix.yaml's registry (host:port)")
    stages = publish_cmd.add_mutually_exclusive_group()
    stages.add_argument(
        "--stage",
        action="store_true",
        help="CI, per cell: push the self-tested image under <tag>.staging-RUN with its SBOM and report attached; "
        "moves no versioned tag or alias (a cell --skip-existing did not build is staged from the registry)",
    )
    stages.add_argument(
        "--promote",
        action="store_true",
        help="CI, once every cell passed: gate on the reports attached in the registry (no engine or image needed), "
        "then point the versioned tags at the staged images and move the aliases",
    )
    publish_cmd.add_argument(
        "--run", default="local", help="with --stage and --promote: the run ID that ties them (CI's run number)"
    )
    publish_cmd.set_defaults(func=cmd_publish)

    ci_cmd = command(
        "ci",
        "print a CI workflow: one job per buildable cell (build, self-test, stage), then one promote job",
        NEEDS_NOTHING + " Reads the plan; the jobs run the same nox sessions a user runs.",
    )
    ci_cmd.add_argument("system", choices=ci.SYSTEMS, help="github (Actions) or gitlab (GitLab CI)")
    ci_cmd.add_argument("--output", metavar="FILE", help="write the workflow there (default: standard output)")
    ci_cmd.set_defaults(func=cmd_ci)

    repro_cmd = command(
        "verify-repro",
        "build cells twice without cache and compare image IDs and layers",
        "Needs the engine. Default: the flagship, which is about 6 GB and takes minutes per build; name a small "
        "cell (such as the CPU one) for a quick check.",
    )
    repro_cmd.add_argument("cells", nargs="*", help="cells to verify (default: the flagship)")
    repro_cmd.add_argument("--all", action="store_true", help="every buildable cell (hours)")
    repro_modes = repro_cmd.add_mutually_exclusive_group()
    repro_modes.add_argument(
        "--record",
        action="store_true",
        help="when the two builds agree, write the image ID to images/<cell>/image-id (commit it: later builds, "
        "here or on another machine, are compared with it)",
    )
    repro_modes.add_argument(
        "--once",
        action="store_true",
        help="build once without cache and compare with the recorded image ID (another machine's build is evidence)",
    )
    repro_cmd.set_defaults(func=cmd_verify_repro)

    bundle_cmd = command(
        "bundle",
        "gather everything one cell's rebuild needs into a folder: matrix, locks, templates, self-test, wheels, "
        ".debs, with a manifest of sha256s",
        "Reads the cache (fetching what is missing: the index and the mirror when online). No engine needed. "
        "Rebuild with `build --offline --bundle DIR`, with no index, mirror or registry.",
    )
    bundle_cmd.add_argument("cell", help="the cell to bundle")
    bundle_cmd.add_argument("--output", required=True, type=Path, help="a new or empty folder")
    bundle_cmd.set_defaults(func=cmd_bundle)

    size_cmd = command(
        "size",
        "a built image's layers: each one's size, the step that wrote it, and the largest packages inside",
        "Needs the engine and the built image; reads it once through `docker save`. Sizes are uncompressed.",
    )
    size_cmd.add_argument("target", nargs="?", help="a cell name or an image reference (default: the flagship)")
    size_cmd.add_argument("--top", type=int, default=5, help="packages or folders listed per layer (default: 5)")
    size_cmd.set_defaults(func=cmd_size)

    smoke_cmd = command(
        "smoke",
        "run the in-image self-test on cells or images",
        "Needs the engine; passes every GPU when the engine has the NVIDIA runtime. The report is kept in the "
        "cache under the image ID; publish requires a passing one.",
    )
    smoke_cmd.add_argument("targets", nargs="*", help="cell names or image references (default: the flagship)")
    smoke_cmd.add_argument("--cpu", action="store_true", help="do not pass GPUs to the container")
    smoke_cmd.set_defaults(func=cmd_smoke)

    engine_cmd = command(
        "engine",
        "start a Docker engine if none answers",
        "Starting dockerd needs root; it keeps running in the background (log: /var/log/torch-images-dockerd.log).",
    )
    engine_cmd.add_argument(
        "--install",
        action="store_true",
        help="as root, install with apt what is missing: Debian's docker.io and mmdebstrap (bootstraps bases)",
    )
    engine_cmd.add_argument(
        "--test-tools",
        action="store_true",
        help="with --install, also what the tests use: docker-registry, apache2-utils (htpasswd) and openssl",
    )
    engine_cmd.add_argument(
        "--emulate",
        action="append",
        default=[],
        choices=sorted(emulation.ARCHITECTURES),
        help="make this architecture's programs run here (repeatable): on another architecture's host, as root, "
        "installs qemu-user-static, binfmt-support and arch-test with apt and registers them (builds of such "
        "cells do it too, when needed)",
    )
    engine_cmd.set_defaults(func=cmd_engine)

    compat_cmd = command("compat", "compatibility data derived from the wheels' own metadata", "See refresh.")
    compat_sub = compat_cmd.add_subparsers(
        dest="compat_command", required=True, metavar="ACTION", help="refresh: re-read the metadata into data/"
    )
    refresh_cmd = compat_sub.add_parser(
        "refresh",
        parents=[common],
        help="re-read torch and TensorRT-LLM metadata into data/",
        description="Re-read the metadata of the matrix's torch versions from its indexes into "
        "data/torch_wheels.json, and of its TensorRT-LLM versions into data/trtllm.json. Needs the indexes "
        "(PyPI); writes those two files.",
    )
    refresh_cmd.set_defaults(func=cmd_compat_refresh)

    update_cmd = command(
        "update",
        "regenerate everything generated from the matrix: compat refresh, then lock, then render",
        "The one command to run after editing matrix.yaml, data/flavors.yaml or templates/; commit what it "
        "changes (CI's `render --check` and `lock --check` fail until you do). Needs the package indexes, and "
        "for Debian pins the engine and the distro mirror.",
    )
    update_cmd.add_argument(
        "--no-refresh",
        action="store_true",
        help="keep data/torch_wheels.json and data/trtllm.json as they are (default: re-read them first)",
    )
    update_cmd.add_argument("--jobs", type=int, default=4, help="cells resolved at once (default: 4)")
    update_cmd.add_argument(
        "--python-only", action="store_true", help="skip the Debian pins (then no engine is needed)"
    )
    update_cmd.set_defaults(func=cmd_update)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader stopped early (`plan --json | head`): not an error of ours. Point stdout at
        # /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except UserError as error:
        console.print(f"[red]error:[/red] {error.line()}", highlight=False, soft_wrap=True)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
