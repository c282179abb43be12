"""Bench rows for what users pull after a fix, what siblings share and what a registry stores.

A cell is taken back to the state before two real fixes, in a scratch copy of the project
(matrix.yaml and images/): jinja2 3.1.5 (GHSA-cpwx-vrp4-4pq7, fixed in 3.1.6) and openssl
3.0.20 (Debian 12's point release; the security archive has the fix). Then the fixes are made
as a team makes them, with `update --security`: first the Debian one, then the Python one with
the OSV record (tests/fixtures/osv). After each, the cell is built again on the same engine,
which still holds the previous build's steps (`build --keep-build-cache`, as a CI runner with a
cache has them), and pushed to a loopback registry. What a user pulls is the layers whose diff
IDs are new, at their compressed size in the registry's manifest; the rebuild's time is set
against a cold build (`--no-cache`) of the same inputs, which must give the same image ID.
The last state is the repository's own, so its image ID is the recorded one where there is one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker

from builder.assemble import build, size
from builder.engine import daemon
from builder.lock import aptindex, audit, debian
from builder.lock import requirements as lock
from builder.oci.registry import Manifest, Registry
from builder.plan import matrix
from builder.plan.cell import Cell
from builder.repro import recorded
from builder.wheelhouse import wheelhouse
from harness import containerd

REPOSITORY = Path(__file__).resolve().parents[1]
OSV_FIXTURES = REPOSITORY / "tests" / "fixtures" / "osv"
PYTHON_FIX = ("jinja2", "3.1.5", "3.1.6")  # GHSA-cpwx-vrp4-4pq7
DEBIAN_FIX = ("openssl", "libssl3")  # taken back to the release's version; the security archive has the fix
FIX_SHARE_TARGET, REBUILD_RATIO_TARGET = 0.10, 0.3
CTR_NAMESPACE = "torch-images-bench"


@dataclass(frozen=True)
class Pushed:
    """One image in the loopback registry: its layers' diff IDs and compressed sizes, bottom first."""

    tag: str
    diff_ids: tuple[str, ...]
    compressed: tuple[int, ...]
    digests: tuple[str, ...]  # the compressed layers' digests, as the registry stores them
    image_id: str

    @property
    def total(self) -> int:
        return sum(self.compressed)

    def new_against(self, before: Pushed) -> tuple[int, int]:
        """(layers, compressed bytes) a client holding `before` fetches for this image."""
        held = set(before.diff_ids)
        fresh = [size for diff, size in zip(self.diff_ids, self.compressed, strict=True) if diff not in held]
        return len(fresh), sum(fresh)


@dataclass
class FixRun:
    cell: str
    flagship: bool  # the targets are the flagship's; the CPU cell's rows are reported beside it
    states: dict[str, Pushed] = dataclasses.field(default_factory=dict)  # before, debian, python
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)  # debian, python, cold rebuilds
    phases: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)  # where each build's time went
    cold_id: str = ""
    recorded: str | None = None


@contextlib.contextmanager
def scratch_project(grid: matrix.Matrix) -> Iterator[Path]:
    """A copy of the matrix file and its images/ folder: the fixes are made there, never here."""
    with tempfile.TemporaryDirectory(prefix="torch-images-fix-") as scratch:
        target = Path(scratch, grid.path.name)
        shutil.copyfile(grid.path, target)
        shutil.copytree(grid.images_dir, Path(scratch, grid.images_dir.name), symlinks=False)
        yield target


def _builder(matrix_path: Path, *args: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "builder", "--matrix", str(matrix_path), *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"builder {' '.join(args)}: {(result.stderr or result.stdout).strip()[-400:]}")


def take_back_fixes(matrix_path: Path, cell_name: str) -> None:
    """The cell's locks as they were before both fixes, then its Dockerfile rendered from them."""
    grid = matrix.load_matrix(matrix_path)
    cell = grid.cell(cell_name)
    stack_path = cell.file(lock.STACK_LOCK)
    name, vulnerable, fixed = PYTHON_FIX
    hashes = audit.file_hashes(grid, cell, name, vulnerable)
    stack_path.write_text(audit.with_python_fix(stack_path.read_text(), name, fixed, vulnerable, hashes))
    debian_path = debian.lock_path(cell.directory)
    pins = debian.DebianLock.read(debian_path)
    release = aptindex.suite_index(cell.base, cell.base.mirror, cell.base.suite)
    older = {package: version for package, version in audit.newest_versions(release).items() if package in DEBIAN_FIX}
    if set(older) != set(DEBIAN_FIX):
        raise RuntimeError(f"{cell.base.suite} does not list {', '.join(DEBIAN_FIX)}")

    def back(group: tuple[str, ...]) -> tuple[str, ...]:
        split = (pin.split("=", 1) for pin in group)
        return tuple(sorted(f"{p}={older.get(p, v)}" for p, v in split))

    files = {pin: file for pin, file in pins.files.items() if pin.split("=", 1)[0] not in older}
    files.update({f"{p}={v}": release[f"{p}={v}"] for p, v in older.items()})
    taken_back = debian.DebianLock(back(pins.common), back(pins.flavor), back(pins.base), files)
    if taken_back.common == pins.common:
        raise RuntimeError(f"{cell.name}: {', '.join(DEBIAN_FIX)} are not in its shared layer's pins")
    assert pins.fingerprint is not None
    debian_path.write_text(taken_back.text(pins.fingerprint))
    _builder(matrix_path, "render")


def push(client: docker.DockerClient, repository: str, tag: str) -> None:
    """The engine's push of `repository:tag` (gzip layers), raising on the first error it streams."""
    stream: Iterator[dict[str, Any]] = client.images.push(repository, tag, stream=True, decode=True)
    for chunk in stream:
        if "error" in chunk:
            raise RuntimeError(chunk["error"])


def push_form(client: docker.DockerClient, host: str, reference: str, tag: str) -> Manifest:
    """The local image `reference` pushed as `bench:<tag>` (its registry tag removed from the
    engine again), and the manifest the registry now serves for it."""
    client.images.get(reference).tag(f"{host}/bench", tag)
    push(client, f"{host}/bench", tag)
    client.images.remove(f"{host}/bench:{tag}")
    manifest = Registry(host).manifest("bench", tag)
    assert manifest is not None
    return manifest


def _push(client: docker.DockerClient, host: str, reference: str, tag: str) -> Pushed:
    body = json.loads(push_form(client, host, reference, tag).body)
    config = json.loads(Registry(host).blob("bench", body["config"]["digest"]))
    return Pushed(
        tag,
        tuple(config["rootfs"]["diff_ids"]),
        tuple(layer["size"] for layer in body["layers"]),
        tuple(layer["digest"] for layer in body["layers"]),
        body["config"]["digest"],
    )


def _build(
    client: docker.DockerClient, matrix_path: Path, cell_name: str, kept: list[build.BuildResult], no_cache: bool
) -> build.BuildResult:
    grid = matrix.load_matrix(matrix_path)
    locks = build.preflight(grid.cell(cell_name), grid)
    result = build.build_cell(
        client, grid, locks, wheelhouse.Wheelhouse(), lambda _: None, build.BuildOptions(no_cache=no_cache)
    )
    if result.status not in ("built", "unchanged"):
        raise RuntimeError(f"{cell_name}: {result.status}: {result.detail}")
    kept.append(result)  # its steps stay: the next state's build reuses those it shares
    return result


def run_fixes(grid: matrix.Matrix, cell: Cell, host: str) -> FixRun:
    """Build the cell before the fixes, after the Debian one, after the Python one, then cold."""
    client = daemon.client()
    run = FixRun(cell.name, cell == grid.flagship)
    record = recorded.read(cell)
    run.recorded = record.image_id if record else None
    kept: list[build.BuildResult] = []
    try:
        with scratch_project(grid) as matrix_path:
            take_back_fixes(matrix_path, cell.name)
            before = _build(client, matrix_path, cell.name, kept, no_cache=True)
            run.states["before"] = _push(client, host, before.reference, f"{cell.name}-before")
            for fix, osv in (("debian", []), ("python", ["--osv", str(OSV_FIXTURES)])):
                _builder(matrix_path, "update", "--security", cell.name, *osv)
                result = _build(client, matrix_path, cell.name, kept, no_cache=False)
                run.seconds[fix], run.phases[fix] = result.seconds, result.phases
                run.states[fix] = _push(client, host, result.reference, f"{cell.name}-{fix}")
            cold = _build(client, matrix_path, cell.name, kept, no_cache=True)
            run.seconds["cold"], run.phases["cold"], run.cold_id = cold.seconds, cold.phases, cold.image_id
    finally:
        build.discard_intermediates(client, kept)
    return run


def where_time_went(phases: dict[str, float]) -> str:
    """The engine's build and the canonical pass, as build_cell timed them."""
    engine, canonical = phases.get("engine", 0.0), phases.get("normalize", 0.0)
    parts = ", ".join(f"{name.removeprefix('normalize.')} {seconds:.0f} s" for name, seconds in phases.items()
                      if name.startswith("normalize."))  # fmt: skip
    return f"engine {engine:.0f} s + canonical pass {canonical:.0f} s ({parts})"


def fix_rows(run: FixRun, Row: Any) -> list[Any]:
    """Two rows per cell: the Debian fix and the Python fix, bytes pulled and rebuild time."""
    rows = []
    previous = run.states["before"]
    last = run.states["python"]
    reproduced = run.cold_id == last.image_id
    as_recorded = run.recorded in (None, last.image_id)  # the last state is the repository's own
    same = "cold build gives the same image ID" if reproduced else (
        f"cold build gives ANOTHER image ID ({run.cold_id[:19]})"
    )  # fmt: skip
    if run.recorded is not None:
        same += "; it is the recorded ID" if run.recorded == last.image_id else "; NOT the recorded ID"
    for fix, what in (
        ("debian", f"{'/'.join(DEBIAN_FIX)} 3.0.20 -> security fix"),
        ("python", "jinja2 3.1.5 -> 3.1.6"),
    ):
        state = run.states[fix]
        layers, fetched = state.new_against(previous)
        share = fetched / state.total
        ratio = run.seconds[fix] / run.seconds["cold"]
        python = fix == "python"
        fast_enough = ratio <= REBUILD_RATIO_TARGET or not python
        rows.append(
            Row(
                f"{fix.capitalize()} security fix ({what}, update --security), {run.cell}: pulled, rebuild",
                f"{size.human(fetched)} in {layers} of {len(state.diff_ids)} layers ({share:.1%} of "
                f"{size.human(state.total)} compressed); rebuild {run.seconds[fix]:.0f} s: "
                + where_time_went(run.phases[fix]),
                f"cold build {run.seconds['cold']:.0f} s: {where_time_went(run.phases['cold'])} ({same})",
                ratio,
                (f"<= {FIX_SHARE_TARGET:.0%} of the image" + (f", rebuild <= {REBUILD_RATIO_TARGET}" if python else ""))
                if run.flagship
                else "reported (the targets are the flagship's); the same image ID cold and as recorded",
                reproduced and as_recorded and ((share <= FIX_SHARE_TARGET and fast_enough) or not run.flagship),
            )
        )
        previous = state
    return rows


# ---------------------------------------------------------------- siblings and the registry


class CountingRelay:
    """A TCP relay on loopback in front of the registry that counts the bytes it sends back: what
    a client's pull fetched over the wire, whatever it asked for."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.received = 0
        self.lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.host = f"127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.server.accept()
                upstream = socket.create_connection(self.target)
                threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
                threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, count: bool) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(1 << 16):
                if count:
                    with self.lock:
                        self.received += len(chunk)
                sink.sendall(chunk)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.server.close()


def sibling_pull(host: str, runtime: Pushed, devel: Pushed) -> tuple[int, int]:
    """(bytes containerd fetched over the wire pulling devel after its runtime sibling, devel's own
    layers' compressed bytes)."""
    relay = CountingRelay(host)
    try:
        containerd.clear(CTR_NAMESPACE)
        containerd.pull(CTR_NAMESPACE, f"{relay.host}/bench:{runtime.tag}", plain_http=True)
        held = relay.received
        containerd.pull(CTR_NAMESPACE, f"{relay.host}/bench:{devel.tag}", plain_http=True)
        fetched = relay.received - held
    finally:
        relay.close()
        containerd.clear(CTR_NAMESPACE)
    return fetched, devel.new_against(runtime)[1]


def stored_bytes(images: list[Pushed]) -> int:
    """What a registry stores for these images' layers: each compressed layer once, by digest."""
    sizes = {digest: size for image in images for digest, size in zip(image.digests, image.compressed, strict=True)}
    return sum(sizes.values())


def build_and_push(grid: matrix.Matrix, cell: Cell, host: str) -> Pushed:
    """The cell as the repository has it, built (kept as its tag), then pushed."""
    client = daemon.client()
    kept: list[build.BuildResult] = []
    try:
        result = _build(client, grid.path, cell.name, kept, no_cache=False)
        return _push(client, host, result.reference, cell.name)
    finally:
        build.discard_intermediates(client, kept)
