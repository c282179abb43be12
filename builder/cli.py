"""`python -m builder ...`: a thin layer that parses flags and calls one stage each."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from builder import build, compat, engine, lock, matrix, publish, render, repro, smoke, wheelhouse
from builder.errors import EXIT_USER_ERROR, UserError

console = Console(stderr=True)


def _matrix(args: argparse.Namespace) -> matrix.Matrix:
    return matrix.load_matrix(Path(args.matrix))


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
    if args.json:
        print(json.dumps({"cells": rows}, indent=1))
        return 0
    table = Table(title=f"{args.matrix}: {len(grid.cells)} cells, {len(grid.rejected)} rejected")
    for column in ("cell", "torch", "cuda", "cudnn", "python", "glibc", "base", "flavor", "tag", "status"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(
            *(
                str(row.get(k) or "")
                for k in (
                    "cell",
                    "torch",
                    "cuda",
                    "cudnn",
                    "python",
                    "glibc",
                    "base",
                    "flavor",
                    "tag",
                    "status",
                )
            )
        )
    Console(width=200).print(table)
    return 0


def cmd_compat_refresh(args: argparse.Namespace) -> int:
    spec, _ = matrix.parse(Path(args.matrix))
    versions = set(spec.axes.torch if spec.axes else []) | {s.torch for s in spec.include if s.torch}
    table = compat.TorchWheels.load().table
    unreachable: list[str] = []
    for name, index in spec.indexes.items():
        links = [Path(matrix.expand_env(p)) for p in index.find_links]
        builds = compat.read_torch_builds(sorted(versions), index.urls, [p for p in links if p.is_dir()], unreachable)
        table[name] = {**table.get(name, {}), **{b.version: b for b in builds}}  # other matrices share the file
        console.print(f"{name}: {', '.join(b.version + ' (' + b.cuda + ')' for b in builds)}")
    compat.TorchWheels(table).save()
    console.print(f"wrote {compat.TORCH_WHEELS}")
    releases = compat.load_trtllm()
    wanted = {s.trtllm for s in spec.include if s.trtllm} - set(releases)
    urls = [url for index in spec.indexes.values() for url in index.urls]
    for version in sorted(wanted):
        for url in urls:
            try:
                releases[version] = compat.read_trtllm_release(version, url)
                console.print(f"tensorrt-llm {version}: torch {releases[version].torch}, from {url}")
                break
            except OSError as error:
                unreachable.append(f"{url} for tensorrt-llm {version} ({getattr(error, 'reason', error)})")
    if releases:
        compat.save_trtllm(releases)
    for line in sorted(set(unreachable)):
        console.print(f"not read: {line}")
    return 0


def _human(size: int) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e8 else f"{size / 1e6:.0f} MB"


def cmd_lock(args: argparse.Namespace) -> int:
    grid = _matrix(args)
    cells = grid.cells if args.all or not args.cells else grid.select(args.cells)
    if args.check:
        problems = [p for cell in cells for p in lock.check_cell(cell, grid)]
        for problem in problems:
            print(problem)
        return 1 if problems else 0
    failures = []
    locked = []
    with console.status(f"locking {len(cells)} cells, {args.jobs} at a time"):
        for cell, outcome in lock.lock_cells(cells, grid, args.jobs):
            if isinstance(outcome, UserError):  # one cell that cannot resolve must not stop the others
                failures.append(outcome.line())
            else:
                locked.append(cell)
                console.print(f"{cell.name}: {', '.join(str(p) for p in outcome)}")
    if locked and not args.python_only:
        with console.status("pinning Debian packages (apt resolves in a container of each base)") as status:
            for cell, path in lock.lock_debian(locked, grid, engine.client()):
                status.update(f"pinned {path}")
                console.print(f"{cell.name}: {path}")
    for failure in failures:
        console.print(f"[red]error:[/red] {failure}", highlight=False, soft_wrap=True)
    return EXIT_USER_ERROR if failures else 0


def cmd_render(args: argparse.Namespace) -> int:
    grid = _matrix(args)
    if args.check:
        problems = render.drift(grid.cells, grid) + render.orphans(grid)
        for problem in problems:
            print(problem)
        if problems:
            print("images/ does not match matrix.yaml and templates/; run `python -m builder render`")
        return 1 if problems else 0
    written = render.render(grid.cells, grid)
    console.print(f"rendered {len(grid.cells)} cells, {len(written)} files changed")
    return 0


def cmd_engine(args: argparse.Namespace) -> int:
    console.print(engine.ensure_running(install=args.install))
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    grid = _matrix(args)
    cells = _cells(args, grid)
    for cell in cells:  # every cell checked before the first byte reaches the engine
        build.preflight(cell, grid)
    client = engine.client()
    house = wheelhouse.Wheelhouse()
    results = []
    for cell in cells:
        with console.status(f"{cell.name}: starting") as status:
            result = build.build_cell(
                client,
                grid,
                cell,
                house,
                lambda text: status.update(text),
                args.no_cache,
                not args.no_normalize,
                args.backend,
            )
        if result.status == "built" and not args.no_smoke:
            with console.status(f"{cell.name}: running the self-test in the image"):
                verdict = smoke.run(client, result.reference)
            result.status = f"built, self-test {verdict.status}"
            result.detail = verdict.summary
            if verdict.status != "pass":
                result.status = "failed: self-test"
        results.append(result)
        console.print(
            f"{cell.name}: {result.status} ({result.detail})" if result.detail else f"{cell.name}: {result.status}"
        )
    table = Table(title="build summary")
    for column in ("cell", "tag", "image ID", "size", "build time", "status"):
        table.add_column(column)
    for r in results:
        table.add_row(r.cell, r.reference, r.image_id[7:19], _human(r.size_bytes), f"{r.seconds:.0f} s", r.status)
    Console(width=200).print(table)
    return 0 if all(not r.status.startswith("failed") for r in results) else 1


def cmd_smoke(args: argparse.Namespace) -> int:
    client = engine.client()
    references = args.targets
    if not references:
        grid = _matrix(args)
        references = [build.local_reference(grid, grid.flagship)]
    elif any(not (":" in t or t.startswith("sha256")) for t in references):
        grid = _matrix(args)
        references = [t if ":" in t else build.local_reference(grid, grid.cell(t)) for t in references]
    failed = 0
    for reference in references:
        with console.status(f"{reference}: running the self-test"):
            verdict = smoke.run(client, reference, gpus=None if not args.cpu else False)
        print(verdict.report.get("table", ""), end="")
        console.print(f"{reference}: self-test {verdict.status} ({verdict.summary}); report: {verdict.path}")
        failed += verdict.status != "pass"
    return 1 if failed else 0


def cmd_publish(args: argparse.Namespace) -> int:
    grid = _matrix(args)
    if args.registry:
        grid.spec = grid.spec.model_copy(update={"registry": args.registry})
    items = publish.publish(engine.client(), grid, _cells(args, grid), lambda text: console.print(text))
    for item in items:
        state = "unchanged" if item.unchanged and not item.moved_aliases else "published"
        console.print(
            f"{item.cell.name}: {state} {grid.spec.registry}/{grid.spec.repository}:{item.cell.tag} {item.digest}"
        )
    return 0


def cmd_verify_repro(args: argparse.Namespace) -> int:
    grid = _matrix(args)
    client = engine.client()
    house = wheelhouse.Wheelhouse()
    failed = 0
    for cell in _cells(args, grid):
        ids = []
        for attempt in (1, 2):
            with console.status(f"{cell.name}: build {attempt} of 2, without cache") as status:
                result = build.build_cell(client, grid, cell, house, lambda t: status.update(t), no_cache=True)
            if result.status != "built":
                raise UserError(f"{cell.name}: build {attempt} failed: {result.detail}")
            ids.append(result.image_id)
        verdict = repro.compare(client, cell.name, ids[0], ids[1])
        table = Table(title=f"{cell.name}: {'reproducible' if verdict.reproducible else 'NOT reproducible'}")
        for column in ("layer", "build 1", "build 2", "same"):
            table.add_column(column)
        for index, (first, second) in enumerate(verdict.layers):
            table.add_row(str(index), first[7:19], second[7:19], "yes" if first == second else "NO")
        Console(width=200).print(table)
        console.print(f"image ID: {ids[0][7:19]} and {ids[1][7:19]}")
        for index, paths in verdict.differences.items():
            console.print(f"layer {index} differs in: {', '.join(paths)}")
        failed += not verdict.reproducible
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m builder", description=__doc__)
    parser.add_argument("--matrix", default=str(matrix.DEFAULT_MATRIX), help="matrix file (default: ./matrix.yaml)")
    commands = parser.add_subparsers(dest="command", required=True)

    plan = commands.add_parser("plan", help="list every cell with resolved versions, or why it is rejected")
    plan.add_argument("--json", action="store_true", help="print JSON instead of a table")
    plan.set_defaults(func=cmd_plan)

    lock_cmd = commands.add_parser("lock", help="resolve hash-pinned requirements for cells (all by default)")
    lock_cmd.add_argument("cells", nargs="*")
    lock_cmd.add_argument("--all", action="store_true")
    lock_cmd.add_argument("--check", action="store_true", help="fail when a lock does not match the matrix")
    lock_cmd.add_argument("--jobs", type=int, default=4, help="cells resolved at once (default 4)")
    lock_cmd.add_argument("--python-only", action="store_true", help="skip pinning Debian packages (needs no engine)")
    lock_cmd.set_defaults(func=cmd_lock)

    render_cmd = commands.add_parser("render", help="write images/<cell>/Dockerfile and spec.json")
    render_cmd.add_argument("--check", action="store_true", help="fail when images/ differs from a fresh render")
    render_cmd.set_defaults(func=cmd_render)

    build_cmd = commands.add_parser("build", help="build cells (default: the flagship) on the Docker engine")
    build_cmd.add_argument("cells", nargs="*")
    build_cmd.add_argument("--all", action="store_true", help="every buildable cell")
    build_cmd.add_argument("--no-cache", action="store_true")
    build_cmd.add_argument("--no-smoke", action="store_true", help="skip the self-test (the image cannot be published)")
    build_cmd.add_argument(
        "--no-normalize", action="store_true", help="keep the engine's timestamps (not reproducible)"
    )
    build_cmd.add_argument(
        "--backend",
        choices=["sdk", "buildkit"],
        default="sdk",
        help="sdk: the engine's classic builder through the Docker SDK (default, works everywhere); "
        "buildkit: BuildKit through a docker CLI that offers it",
    )
    build_cmd.set_defaults(func=cmd_build)

    publish_cmd = commands.add_parser("publish", help="push cells whose self-test passed (default: the flagship)")
    publish_cmd.add_argument("cells", nargs="*")
    publish_cmd.add_argument("--all", action="store_true")
    publish_cmd.add_argument("--registry", help="override matrix.yaml's registry (host:port)")
    publish_cmd.set_defaults(func=cmd_publish)

    repro_cmd = commands.add_parser("verify-repro", help="build a cell twice without cache and compare the images")
    repro_cmd.add_argument("cells", nargs="*")
    repro_cmd.add_argument("--all", action="store_true")
    repro_cmd.set_defaults(func=cmd_verify_repro)

    smoke_cmd = commands.add_parser("smoke", help="run the in-image self-test on cells or images")
    smoke_cmd.add_argument("targets", nargs="*", help="cell names or image references (default: the flagship)")
    smoke_cmd.add_argument("--cpu", action="store_true", help="do not pass GPUs to the container")
    smoke_cmd.set_defaults(func=cmd_smoke)

    engine_cmd = commands.add_parser("engine", help="start a Docker engine if none answers (root only)")
    engine_cmd.add_argument("--install", action="store_true", help="install Debian's docker.io if missing")
    engine_cmd.set_defaults(func=cmd_engine)

    compat_cmd = commands.add_parser("compat", help="compatibility data derived from the wheels' metadata")
    compat_sub = compat_cmd.add_subparsers(dest="compat_command", required=True)
    refresh = compat_sub.add_parser("refresh", help="re-read torch wheel metadata into data/torch_wheels.json")
    refresh.set_defaults(func=cmd_compat_refresh)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except UserError as error:
        console.print(f"[red]error:[/red] {error.line()}", highlight=False, soft_wrap=True)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
