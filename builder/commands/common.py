"""What the commands share: the console, the matrix and cells a command names, progress lines,
and the registry options."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path

from builder.config import grammar
from builder.oci.registry import Registry
from builder.plan import matrix
from builder.plan.cell import Cell
from builder.steps import Steps, fold_style
from builder.terminal import SafeConsole, without_password

console = SafeConsole(stderr=True)
NEEDS_NOTHING = "Offline; needs no engine."


class Register:
    """Adds one command's parser: its name, a summary (the help line) and details (its page)."""

    def __init__(self, commands: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
        self.commands, self.common = commands, common

    def __call__(self, name: str, summary: str, details: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = self.commands.add_parser(
            name, parents=[self.common], help=summary, description=f"{summary}. {details}"
        )
        return parser


def grid_of(args: argparse.Namespace) -> matrix.Matrix:
    return matrix.load_matrix(Path(args.matrix))


@contextlib.contextmanager
def progress(label: str) -> Iterator[Steps]:
    """Where a long job says how it goes: one line per step with the seconds since the job
    started, each phase folded in a CI log (builder/steps.py); on a terminal, also a spinner under
    them naming the latest line (the lines stay, so a build's steps can be read back). A CI job
    gets the folds and no spinner even where its output is a terminal (act runs steps on a pty)."""

    def raw(marker: str) -> None:  # a fold marker, written as it is (steps.py makes it printable)
        console.file.write(marker + "\n")
        console.file.flush()

    def line(text: str) -> None:
        console.print(text, highlight=False, soft_wrap=True)

    style = fold_style()
    if console.is_terminal and not style:
        with console.status(label) as status:

            def shown(text: str) -> None:
                line(text)
                status.update(text)

            yield Steps(shown)
        return
    steps = Steps(line, raw, style)
    steps(label)
    yield steps


def cells_of(args: argparse.Namespace, grid: matrix.Matrix) -> list[Cell]:
    """The cells a command names: --all, the names given, else the flagship."""
    if getattr(args, "all", False):
        return grid.cells
    if getattr(args, "cells", None):
        return grid.select(args.cells)
    return [grid.flagship]


def registry_options(command: argparse.ArgumentParser, registry_help: str) -> None:
    command.add_argument("--registry", type=registry_option, help=registry_help)
    command.add_argument(
        "--registry-ca",
        type=existing_file,
        metavar="FILE",
        help="trust this CA for the registry's HTTPS certificate (default: the system's CA store only)",
    )
    command.add_argument(
        "--insecure-registry",
        action="store_true",
        help="plain HTTP to a registry that is not on a loopback address (default: HTTPS; loopback gets HTTP)",
    )


def registry_option(value: str) -> str:
    if not grammar.REGISTRY_REF.matches(value):
        shown = without_password(value)
        if shown != value:
            raise argparse.ArgumentTypeError(
                f"{shown!r} carries credentials: give them with `docker login` or the environment, and write "
                f"{grammar.REGISTRY_REF.hint}"
            )
        raise argparse.ArgumentTypeError(f"{value!r} is not a registry: write {grammar.REGISTRY_REF.hint}")
    return value


def existing_file(value: str) -> Path:
    if not Path(value).is_file():
        raise argparse.ArgumentTypeError(f"{value} is not a file: give the registry's CA certificate (PEM)")
    return Path(value)


def use_registry_option(grid: matrix.Matrix, args: argparse.Namespace) -> None:
    """--registry REGISTRY[/REPOSITORY], where given, in place of matrix.yaml's registry (and
    repository, where it names one: CI publishes to ghcr.io/<owner>/torch)."""
    if args.registry:
        host, _, repository = args.registry.partition("/")
        grid.spec = grid.spec.model_copy(update={"registry": host, "repository": repository or grid.spec.repository})


def registry_of(grid: matrix.Matrix, args: argparse.Namespace) -> Registry:
    """The matrix's registry, reached as --registry-ca and --insecure-registry say."""
    return Registry.reached(grid.spec.registry, args.registry_ca, args.insecure_registry)
