"""A second engine beside the host's: Ubuntu 24.04's Docker 29 and containerd 2.2, unpacked.

This is the engine a new Ubuntu user gets from `apt install docker.io` (noble-updates), and the
one GitHub's ubuntu-24.04 runners move to. Its .debs are unpacked (never installed) into the
builder's cache, checked against the sha256 pinned below; Ubuntu's runc and libnftables1 need
glibc 2.38, so Debian 12's run in their place (installed with apt when missing). containerd gets
its own root, state and sockets; dockerd its own data root, exec root, pid file and socket, and
a bridge of its own with no iptables (the builder builds with host networking and self-tests with
no network, so nothing reaches the bridge). Not `--bridge none`: with it, dockerd deletes the
host's `docker0`, the first engine's bridge, as it starts (measured: the first engine's containers
on the default network then fail with "could not find bridge docker0"). `store` picks the image
store: "containerd" (Docker 29's default on a fresh data root) or "overlay2" (the graph-driver
store an upgraded host keeps). `name` lets two engines of one store run side by side (the
hosted-runner test's beside the engine tests'): each name has its own data root, sockets and bridge.

Used by the integration tests, the bench and by hand:
    python -m harness.docker29 start containerd   # prints DOCKER_HOST=...
    python -m harness.docker29 stop containerd
Everything it starts is stopped by PID.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

UBUNTU = "http://archive.ubuntu.com/ubuntu/"
# Ubuntu noble-updates, as of 2026-12-05: (pool path, sha256).
DEBS = {
    "docker.io": (
        "pool/universe/d/docker.io-app/docker.io_29.1.3-0ubuntu3~24.04.2_amd64.deb",
        "bd5c22d42d4ce3021958b7a8d627701597f61a1a9867ba83fe3c841f04991e3a",
    ),
    "containerd": (
        "pool/main/c/containerd-app/containerd_2.2.1-0ubuntu1~24.04.4_amd64.deb",
        "213089e5957d1ea6554b312f8e69869229017fc962ef4f6950228d7160fef2e9",
    ),
    "docker-buildx": (
        "pool/universe/d/docker-buildx/docker-buildx_0.30.1-0ubuntu1~24.04.1_amd64.deb",
        "30723359cf4825afa5ac2087cf5833163f80fb74802bc32e0ed6c9efc13e4b3c",
    ),
}
# Debian 12's packages that stand in for Ubuntu's (glibc 2.38): program or library -> package.
DEBIAN_STAND_INS = {"/usr/sbin/runc": "runc", "/usr/lib/x86_64-linux-gnu/libnftables.so.1": "libnftables1"}
STORES = ("containerd", "overlay2")
# Each engine's own bridge: an address from TEST-NET-1 (RFC 5737, never routed), on a bridge no
# container of the tests uses (builds take the host's network, self-tests none).
BRIDGES = {
    "containerd": ("torch29c", "192.0.2.1/29"),
    "overlay2": ("torch29o", "192.0.2.9/29"),
    "runner": ("torch29r", "192.0.2.17/29"),
    "small": ("torch29s", "192.0.2.25/29"),  # the faults suite's engine on a small data root
}


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "torch-images" / "docker29"


def _fetch(name: str) -> Path:
    path, sha256 = DEBS[name]
    target = cache_root() / "debs" / Path(path).name
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    with urllib.request.urlopen(UBUNTU + path, timeout=300) as response, partial.open("wb") as sink:
        shutil.copyfileobj(response, sink, 1 << 20)
    actual = hashlib.sha256(partial.read_bytes()).hexdigest()
    if actual != sha256:
        partial.unlink()
        raise RuntimeError(f"{path}: sha256 {actual}, pinned {sha256}")
    partial.replace(target)
    return target


def unpacked() -> Path:
    """The folder the three .debs are unpacked into (once)."""
    root = cache_root() / "root"
    marker = root / ".unpacked"
    pins = json.dumps(DEBS, sort_keys=True)
    if marker.is_file() and marker.read_text() == pins:
        return root
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for name in DEBS:
        subprocess.run(["dpkg-deb", "-x", str(_fetch(name)), str(root)], check=True)
    marker.write_text(pins)
    return root


def _ensure_stand_ins() -> None:
    missing = [package for path, package in DEBIAN_STAND_INS.items() if not Path(path).exists()]
    if missing:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], check=True, env=env)


@dataclass(frozen=True)
class Engine:
    """One Docker 29 engine: where its files live, and how to reach it."""

    store: str
    name: str = ""  # the store's name unless given

    @property
    def key(self) -> str:
        return self.name or self.store

    @property
    def state(self) -> Path:
        # Under /var/lib: the data root must be on a file system overlayfs accepts, and the
        # socket paths short (108 bytes at most).
        return Path("/var/lib/torch-images-docker29") / self.key

    @property
    def run_dir(self) -> Path:
        return Path("/run/torch-images-docker29") / self.key

    @property
    def bridge(self) -> tuple[str, str]:
        return BRIDGES[self.key]

    @property
    def docker_host(self) -> str:
        return f"unix://{self.run_dir}/docker.sock"

    @property
    def containerd_socket(self) -> Path:
        return self.run_dir / "containerd.sock"

    def environment(self) -> dict[str, str]:
        """Variables for a process that talks to this engine: DOCKER_HOST, and the CLI and buildx
        of Docker 29 first on PATH (a CLI older than the daemon is refused by it)."""
        root = unpacked()
        # The CLI finds buildx in $DOCKER_CONFIG/cli-plugins.
        plugins = self.state / "client" / "cli-plugins"
        plugins.mkdir(parents=True, exist_ok=True)
        buildx = plugins / "docker-buildx"
        if not buildx.is_symlink():
            buildx.symlink_to(root / "usr/libexec/docker/cli-plugins/docker-buildx")
        return {
            "DOCKER_HOST": self.docker_host,
            "PATH": f"{root}/usr/bin:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "DOCKER_CONFIG": str(self.state / "client"),
        }


def _pid(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        pid = int(path.read_text().strip())
        os.kill(pid, 0)
        return pid
    return None


def _containerd_config(engine: Engine) -> str:
    state = engine.state
    return f"""version = 3
root = "{state}/containerd"
state = "{engine.run_dir}/containerd-state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"]
[grpc]
  address = "{engine.containerd_socket}"
[ttrpc]
  address = "{engine.containerd_socket}.ttrpc"
[debug]
  address = "{engine.run_dir}/containerd-debug.sock"
"""


def _answers(engine: Engine) -> bool:
    import socket

    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as connection:
        connection.settimeout(5)
        connection.connect(engine.docker_host.removeprefix("unix://"))
        connection.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
        return b"OK" in connection.recv(1024)
    return False


def start(store: str, name: str = "") -> Engine:
    """Start (or find running) Docker 29 with the given image store; returns how to reach it."""
    if store not in STORES:
        raise ValueError(f"store must be one of {STORES}")
    engine = Engine(store, name)
    if engine.key not in BRIDGES:
        raise ValueError(f"name must be one of {sorted(BRIDGES)}")
    if _answers(engine):
        return engine
    root = unpacked()
    _ensure_stand_ins()
    engine.state.mkdir(parents=True, exist_ok=True)
    engine.run_dir.mkdir(parents=True, exist_ok=True)
    (engine.state / "client").mkdir(exist_ok=True)
    config = engine.state / "containerd.toml"
    config.write_text(_containerd_config(engine))
    env = {
        **os.environ,
        "PATH": f"{root}/usr/bin:{root}/usr/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
        # The runtime shim is Ubuntu's containerd-shim-runc-v2, which finds runc on PATH: Debian's.
    }
    log = (engine.state / "engine.log").open("ab")
    if _pid(engine.run_dir / "containerd.pid") is None:
        process = subprocess.Popen(
            [f"{root}/usr/bin/containerd", "--config", str(config)],
            stdout=log,
            stderr=log,
            env=env,
            start_new_session=True,
        )
        (engine.run_dir / "containerd.pid").write_text(str(process.pid))
        for _ in range(60):
            if engine.containerd_socket.exists():
                break
            time.sleep(0.5)
    _ensure_bridge(engine)
    daemon_json = engine.state / "daemon.json"
    daemon_json.write_text(json.dumps({"features": {"containerd-snapshotter": store == "containerd"}}))
    subprocess.Popen(
        [
            f"{root}/usr/bin/dockerd",
            "--config-file", str(daemon_json),
            "--data-root", str(engine.state / "docker"),
            "--exec-root", str(engine.run_dir / "exec"),
            "--pidfile", str(engine.run_dir / "docker.pid"),
            "-H", engine.docker_host,
            "--containerd", str(engine.containerd_socket),
            "--bridge", engine.bridge[0], "--iptables=false", "--ip6tables=false", "--ip-forward=false",
        ],
        stdout=log,
        stderr=log,
        env=env,
        start_new_session=True,
    )  # fmt: skip
    for _ in range(90):
        if _answers(engine):
            return engine
        time.sleep(1)
    raise RuntimeError(f"Docker 29 ({engine.key}) did not answer within 90 s; see {engine.state / 'engine.log'}")


def _ensure_bridge(engine: Engine) -> None:
    name, address = engine.bridge
    if subprocess.run(["ip", "link", "show", name], capture_output=True, check=False).returncode != 0:
        subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True)
        subprocess.run(["ip", "addr", "add", address, "dev", name], check=True)


def stop(store: str, name: str = "") -> None:
    """Stop dockerd, then containerd, by PID; unmount what dockerd leaves under its exec root."""
    engine = Engine(store, name)
    for name in ("docker.pid", "containerd.pid"):
        pid = _pid(engine.run_dir / name)
        if pid is None:
            continue
        os.kill(pid, signal.SIGTERM)
        for _ in range(60):
            if _pid(engine.run_dir / name) is None:
                break
            time.sleep(0.5)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(FileNotFoundError):
            (engine.run_dir / name).unlink()
    mounts = Path("/proc/mounts").read_text().splitlines()
    for line in reversed(mounts):
        point = line.split()[1]
        if point.startswith(str(engine.run_dir)) or point.startswith(str(engine.state)):
            subprocess.run(["umount", "-l", point], check=False, capture_output=True)
    subprocess.run(["ip", "link", "delete", engine.bridge[0]], check=False, capture_output=True)


def remove(store: str, name: str = "") -> None:
    """Stop the engine and delete its data root: the next start is a fresh install."""
    stop(store, name)
    engine = Engine(store, name)
    shutil.rmtree(engine.state, ignore_errors=True)
    shutil.rmtree(engine.run_dir, ignore_errors=True)


@contextlib.contextmanager
def running(store: str, fresh: bool = False, name: str = "") -> Iterator[Engine]:
    """A Docker 29 engine for the block's length: stopped (by PID) after it if this started it."""
    engine = Engine(store, name)
    was_running = _answers(engine)
    if fresh:
        remove(store, name)
        was_running = False
    yield start(store, name)
    if not was_running:
        stop(store, name)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop", "remove") or argv[1] not in STORES:
        print("usage: python -m harness.docker29 start|stop|remove containerd|overlay2", file=sys.stderr)
        return 2
    action, store = argv
    if action == "start":
        engine = start(store)
        for key, value in engine.environment().items():
            print(f"export {key}={value}")
    elif action == "stop":
        stop(store)
    else:
        remove(store)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
