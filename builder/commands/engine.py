"""`python -m builder engine`: start a Docker engine if none answers."""

from __future__ import annotations

import argparse

from builder.commands.common import (
    Register,
    console,
)
from builder.engine import daemon, emulation


def add(register: Register) -> None:
    engine_cmd = register(
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
        help="with --install, also what the tests use: docker-registry, apache2-utils (htpasswd), openssl, gnupg, sudo",
    )
    engine_cmd.add_argument(
        "--emulate",
        action="append",
        default=[],
        choices=sorted(emulation.ARCHITECTURES),
        help="make this architecture's programs run here (repeatable): on another architecture's host, as root, "
        "registers the qemu data/tools.yaml pins with binfmt_misc (fetched into the cache); nothing else "
        "of the host's is used, and builds of such cells do it too, when needed",
    )
    engine_cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    console.print(daemon.ensure_running(install=args.install, test_tools=args.test_tools))
    for arch in args.emulate:  # before a build needs it: a CI machine that builds arm64 cells
        emulation.ensure(arch, lambda text: console.print(text))
        console.print(f"{arch} programs run here" + (" (emulated)" if arch != emulation.host_architecture() else ""))
    return 0
