"""`python -m builder`: the top parser, one parser per command from builder/commands/ (each
beside what it runs), and the one place a UserError becomes its line and exit status 2."""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
import threading

from builder.commands import (
    audit,
    build,
    bundle,
    ci,
    compat,
    engine,
    lock,
    plan,
    publish,
    render,
    repro,
    size,
    smoke,
    sweep,
    update,
    verify,
)
from builder.commands.common import Register, console
from builder.config import schema
from builder.errors import EXIT_USER_ERROR, UserError

# In the order `--help` lists them.
COMMANDS = (
    plan,
    lock,
    render,
    build,
    sweep,
    publish,
    verify,
    ci,
    audit,
    repro,
    bundle,
    size,
    smoke,
    engine,
    compat,
    update,
)


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
    register = Register(commands, common)
    for command in COMMANDS:
        command.add(register)
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """argparse gives a command's cells only the words before its first option; cells written
    after one (`ci github --registry X CELL`) are cells too. Anything else left over is argparse's
    usual error."""
    args, extras = parser.parse_known_args(argv)
    if extras and isinstance(getattr(args, "cells", None), list) and not any(e.startswith("-") for e in extras):
        args.cells += extras
    elif extras:
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    return args


class Terminated(KeyboardInterrupt):
    """SIGTERM (a CI cancel, a timeout): unwound as an interrupt is, so every `finally` and
    clean-up on the way out runs (a failed build's and an interrupted one's alike)."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse(parser, argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)
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
        console.print(f"error: {error.line()}", style="red", soft_wrap=True)
        return EXIT_USER_ERROR
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # A full disk is the machine's state, not a fault of ours: one line, after the clean-up
        # on the way out (partial files, step images) ran as an interruption's does.
        where = f" writing {error.filename}" if error.filename else ""
        console.print(f"error: the disk is full ({os.strerror(error.errno)}{where}); what this run had begun was "
                      "removed; free space there (or point TORCH_IMAGES_CACHE elsewhere) and run it again",
                      style="red", soft_wrap=True)  # fmt: skip
        return EXIT_USER_ERROR
    except Terminated:
        console.print("terminated (SIGTERM); what this run had begun was removed")
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        console.print("interrupted; what this run had begun was removed")
        return 130


if __name__ == "__main__":
    sys.exit(main())
