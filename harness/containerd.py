"""containerd's own client, `ctr`, against the containerd the Docker engine runs: how the tests
and the benchmarks pull an image as a Kubernetes node does (containerd >= 1.5 reads zstd layers;
Debian 12's Docker 20.10 does not). Everything goes into a namespace of its own, which `clear`
empties and removes, so the engine's images (namespace `moby`) are never touched."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from builder.errors import UserError

# Docker's packaged engine starts its containerd here; a containerd of its own serves the second.
SOCKETS = (Path("/run/docker/containerd/containerd.sock"), Path("/run/containerd/containerd.sock"))


def socket() -> Path | None:
    return next((path for path in SOCKETS if path.exists()), None)


def available() -> bool:
    return shutil.which("ctr") is not None and socket() is not None


def ctr(namespace: str, *args: str, timeout: float = 900, address: Path | None = None) -> str:
    """`ctr` in `namespace` against the engine's containerd, or the one listening at `address`."""
    address = address or socket()
    if address is None or shutil.which("ctr") is None:
        raise UserError("no containerd to pull with: install containerd (its `ctr`) and start the engine")
    run = subprocess.run(
        ["ctr", "--address", str(address), "--namespace", namespace, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if run.returncode != 0:
        raise UserError(f"ctr {' '.join(args[:2])} failed: {(run.stderr or run.stdout).strip()[-300:]}")
    return run.stdout


def pull(namespace: str, reference: str, plain_http: bool = False, user: str | None = None) -> float:
    """Pull and unpack into the overlayfs snapshotter, as a node does; returns the seconds taken.
    Unpacking checks each layer, decompressed, against the config's diff IDs."""
    options = [*(["--plain-http"] if plain_http else []), *(["--user", user] if user else [])]
    started = time.perf_counter()
    ctr(namespace, "images", "pull", *options, reference)
    return time.perf_counter() - started


def manifest_digest(namespace: str, reference: str) -> str:
    """The digest `ctr images ls` records for a pulled reference."""
    for line in ctr(namespace, "images", "ls").splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == reference:
            return fields[2]
    raise UserError(f"containerd has no image {reference}")


def content(namespace: str, digest: str) -> bytes:
    address = socket()
    run = subprocess.run(
        ["ctr", "--address", str(address), "--namespace", namespace, "content", "get", digest],
        capture_output=True,
        timeout=60,
        check=False,
    )
    if run.returncode != 0:
        raise UserError(f"containerd has no content {digest[:19]}")
    return run.stdout


def clear(namespace: str) -> None:
    """Remove every image of the namespace, then the namespace: containerd's garbage collector
    takes their content and snapshots with them."""
    if socket() is None or namespace not in ctr("default", "namespaces", "ls", "-q").split():
        return
    for reference in ctr(namespace, "images", "ls", "-q").split():
        ctr(namespace, "images", "rm", "--sync", reference)
    for container in ctr(namespace, "containers", "ls", "-q").split():
        ctr(namespace, "containers", "rm", container)
    for _ in range(20):  # the collector may still hold the namespace for a moment
        try:
            ctr("default", "namespaces", "rm", namespace)
            return
        except UserError:
            time.sleep(0.5)
