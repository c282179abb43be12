"""`python -m builder compat refresh`: re-read the wheels' own metadata into data/."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder.commands.common import (
    Register,
    console,
)
from builder.config import schema
from builder.facts import refresh


def add(register: Register) -> None:
    compat_cmd = register("compat", "compatibility data derived from the wheels' own metadata", "See refresh.")
    compat_sub = compat_cmd.add_subparsers(
        dest="compat_command", required=True, metavar="ACTION", help="refresh: re-read the metadata into data/"
    )
    refresh_cmd = compat_sub.add_parser(
        "refresh",
        parents=[register.common],
        help="re-read torch and TensorRT-LLM metadata into data/",
        description="Re-read the metadata of the matrix's torch versions from its indexes into "
        "data/torch_wheels.json, and of its TensorRT-LLM versions into data/trtllm.json. Needs the indexes "
        "(PyPI); writes those two files.",
    )
    refresh_cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    spec, _ = schema.parse(Path(args.matrix))
    refresh.refresh(spec, lambda text: console.print(text, highlight=False))
    return 0
