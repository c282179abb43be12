"""A lazy first start: the flagship's SOCI index beside its gzip form, against full pulls.

A node is a containerd of its own (Debian's, its own root and socket) with AWS's SOCI
snapshotter as a proxy plugin (Debian's soci-snapshotter, harness/verifiers.py pins it),
both started from empty for each measurement, so every run starts with an empty content store.
Each form is timed from the pull's start to `python3 -c "import torch; print(torch.ones(2) + 1)"`
finishing in a container of it, and the bytes fetched are counted over the wire by a relay in
front of the loopback registry (benchmarks/updates.py's CountingRelay):
- gzip and zstd: `ctr images pull` (fetch and unpack everything), then `ctr run`;
- lazy: `soci image rpull` (the snapshotter finds the SOCI index among the image's referrers and
  mounts each large layer over FUSE), then `ctr run --snapshotter soci`, which fetches the spans
  the import reads.
The index is the one `publish` attaches with `publish.soci: true` (builder/publish/soci.py: a
referrer of the unchanged gzip manifest, so the image, its digest and its signatures stay as
they were). Used by the bench's lazy row and by the publish test that pulls lazily by the index.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness import containerd, verifiers

SOCI_ROOT = Path("/var/lib/soci-snapshotter-grpc")  # the soci CLI's content store: it has no option to move it
NAMESPACE = "bench"
FIRST_START = "import torch; print(torch.ones(2) + 1)"


@dataclass(frozen=True)
class Node:
    root: Path
    ca: Path  # the registry's CA, which the soci CLI (its oras client) trusts through SSL_CERT_FILE

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def soci_socket(self) -> Path:
        return self.root / "soci.sock"

    def ctr(self, *args: str, timeout: float = 1800) -> str:
        return containerd.ctr(NAMESPACE, *args, timeout=timeout, address=self.containerd_socket)

    def soci(self, *args: str, timeout: float = 1800) -> str:
        binary = str(verifiers.tool("soci", "soci-snapshotter"))
        command = [binary, "--address", str(self.containerd_socket), "--namespace", NAMESPACE, *args]
        env = {**os.environ, "SSL_CERT_FILE": str(self.ca)}
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, env=env)
        if result.returncode != 0:
            raise RuntimeError(f"soci {' '.join(args[:2])}: {(result.stderr or result.stdout)[-500:]}")
        return result.stdout


def available() -> bool:
    return shutil.which("containerd") is not None and shutil.which("ctr") is not None


def _config(node: Node) -> Path:
    config = node.root / "containerd.toml"
    config.write_text(
        f'version = 2\nroot = "{node.root}/containerd-root"\nstate = "{node.root}/containerd-state"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\n  address = "{node.containerd_socket}"\n'
        f'[proxy_plugins]\n  [proxy_plugins.soci]\n    type = "snapshot"\n    address = "{node.soci_socket}"\n'
    )
    return config


def _wait_for(path: Path, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{path.name} did not come up: {log.read_text()[-500:]}")
        time.sleep(0.1)


@contextlib.contextmanager
def node(root: Path, ca: Path, mirror: tuple[str, str] | None = None) -> Iterator[Node]:
    """A containerd with the SOCI snapshotter beside it, both from empty; removed afterwards.
    The snapshotter trusts `ca` (the loopback registry's): soci-snapshotter 0.4 fetches SOCI
    indexes and zTOCs over HTTPS only, and layers from a loopback host over plain HTTP only,
    so `mirror` (registry, plain-HTTP mirror) sends its layer requests to the same storage
    served without TLS."""
    _wipe(root)
    root.mkdir(parents=True)
    started = Node(root, ca)
    grpc = str(verifiers.tool("soci-snapshotter-grpc", "soci-snapshotter"))
    (root / "soci.toml").write_text(
        f'[[resolver.host."{mirror[0]}".mirrors]]\n  host = "{mirror[1]}"\n' if mirror else ""
    )
    logs = {name: (root / f"{name}.log").open("wb") for name in ("soci", "containerd")}
    processes = [
        subprocess.Popen(
            [grpc, "-address", str(started.soci_socket), "-root", str(SOCI_ROOT), "-config", str(root / "soci.toml")],
            stdout=logs["soci"],
            stderr=subprocess.STDOUT,
            env={**os.environ, "SSL_CERT_FILE": str(ca)},
        )
    ]
    try:
        _wait_for(started.soci_socket, processes[0], root / "soci.log")
        processes.append(
            subprocess.Popen(
                ["containerd", "--config", str(_config(started))], stdout=logs["containerd"], stderr=subprocess.STDOUT
            )
        )
        _wait_for(started.containerd_socket, processes[1], root / "containerd.log")
        yield started
    finally:
        for process in reversed(processes):
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=30)
            if process.poll() is None:
                process.kill()
        for handle in logs.values():
            handle.close()
        _wipe(root)


def _wipe(root: Path) -> None:
    """Unmount what the snapshotters left mounted (FUSE layers, overlay snapshots), then remove."""
    for where in (root, SOCI_ROOT):
        if not where.exists():
            continue
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(str(where))), reverse=True):
            subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
        shutil.rmtree(where, ignore_errors=True)


def _hosts(root: Path, ca: Path, reference: str) -> Path:
    """containerd's hosts directory for the registry of `reference`: HTTPS with our CA (on
    loopback, ctr would otherwise speak plain HTTP to it)."""
    host = reference.split("/", 1)[0]
    folder = root / "hosts"
    (folder / host).mkdir(parents=True, exist_ok=True)
    (folder / host / "hosts.toml").write_text(
        f'server = "https://{host}"\n[host."https://{host}"]\n  capabilities = ["pull", "resolve", "push"]\n'
        f'  ca = "{ca}"\n'
    )
    return folder


@dataclass(frozen=True)
class FirstStart:
    seconds: float
    pull_seconds: float
    output: str
    lazy_layers: int  # layers the snapshotter mounted over FUSE (0 for a full pull)


def first_start(root: Path, ca: Path, reference: str, mirror: str | None) -> FirstStart:
    """From an empty node: pull, then the first `import torch` in a container; timed. With a
    plain-HTTP `mirror` of the registry, the lazy form (SOCI), else a full pull."""
    lazy = mirror is not None
    with node(root, ca, (reference.split("/", 1)[0], mirror) if mirror else None) as empty:
        started = time.perf_counter()
        hosts = str(_hosts(root, ca, reference))
        if lazy:
            empty.soci("image", "rpull", "--hosts-dir", hosts, reference)
        else:
            empty.ctr("images", "pull", "--hosts-dir", hosts, reference)
        pulled = time.perf_counter()
        snapshotter = ["--snapshotter", "soci"] if lazy else []
        output = empty.ctr("run", "--rm", *snapshotter, reference, "first-start", "python3", "-c", FIRST_START)
        finished = time.perf_counter()
        mounts = Path("/proc/mounts").read_text().splitlines()
        fuse = sum(1 for line in mounts if line.split()[2].startswith("fuse") and str(SOCI_ROOT) in line)
    return FirstStart(finished - started, pulled - started, output.strip(), fuse)
