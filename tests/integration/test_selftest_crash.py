"""A self-test that dies by a signal ends, with the signal's exit status, on the real engine.

Under qemu (an arm64 image on an x86 host) a crashing program dies by sending itself the signal,
and the kernel drops a signal a namespace's PID 1 sends itself: a self-test that was PID 1 and
crashed there waited forever (an arm64 CUDA image's segfault hung its sweep). The engine's init
is PID 1 now. The same drop happens natively when a program signals itself, which is what the
stand-in self-test here does, so the check needs no emulation."""

from __future__ import annotations

import io

import pytest

from builder.assemble import build, smoke
from builder.wheelhouse import wheelhouse
from tests.integration.conftest import BuiltCell

pytestmark = pytest.mark.integration

REFERENCE = "torch-images/test:selftest-crash"
# What qemu does when the guest crashes: the signal to itself, with no handler.
DOCKERFILE = """ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN printf '#!/bin/sh\\nkill -SEGV $$\\necho survived its own SIGSEGV\\nexit 3\\n' > /usr/local/bin/torch-selftest \\
 && chmod +x /usr/local/bin/torch-selftest
"""


def test_a_self_test_that_signals_itself_to_death_ends_with_that_signal(built: BuiltCell) -> None:
    engine = built.client
    base = build.cell_base(engine, built.grid, build.preflight(built.cell, built.grid), lambda _: None,
                           wheelhouse.Wheelhouse())  # fmt: skip
    try:
        for chunk in engine.api.build(
            fileobj=io.BytesIO(DOCKERFILE.encode()), tag=REFERENCE, buildargs={"BASE_IMAGE": base},
            rm=True, forcerm=True, decode=True,
        ):  # fmt: skip
            assert "error" not in chunk, chunk["error"]
        exit_code, stdout, stderr = smoke.run_selftest(engine, REFERENCE, [], gpus=False)
    finally:
        build.remove_image(engine, REFERENCE)
    assert exit_code == 128 + 11, (exit_code, stdout, stderr)  # as PID 1 it printed "survived" and exited 3
    assert "survived" not in stdout
