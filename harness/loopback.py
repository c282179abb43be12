"""A registry on loopback: Debian's docker-registry (the CNCF distribution) in a folder, with
optional htpasswd authentication. The tests publish to it, the benchmarks push and pull
through it, and a team can try `publish --registry` against it before its real registry."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from builder.errors import UserError

REGISTRY_BINARY = shutil.which("docker-registry") or "/usr/bin/docker-registry"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Tls:
    """Serve HTTPS with this certificate and key (PEM)."""

    certificate: Path
    key: Path


@dataclass(frozen=True)
class TokenAuth:
    """Distribution's `auth: token`: clients get a token from `realm`, signed by a key whose
    certificate is in `root_certificates`."""

    realm: str
    service: str
    issuer: str
    root_certificates: Path


def _config(root: Path, port: int, htpasswd: Path | None, tls: Tls | None, token: TokenAuth | None) -> Path:
    auth = f"auth:\n  htpasswd:\n    realm: test\n    path: {htpasswd}\n" if htpasswd else ""
    if token:
        auth = (
            f"auth:\n  token:\n    realm: {token.realm}\n    service: {token.service}\n"
            f"    issuer: {token.issuer}\n    rootcertbundle: {token.root_certificates}\n"
        )
    https = f"  tls:\n    certificate: {tls.certificate}\n    key: {tls.key}\n" if tls else ""
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n{https}{auth}"
    )
    return config


def _wait_until_up(port: int, scheme: str) -> None:
    insecure = ssl.create_default_context()
    insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE  # only: is it up?
    for _ in range(100):
        try:
            urllib.request.urlopen(f"{scheme}://127.0.0.1:{port}/v2/", timeout=1, context=insecure)
            return
        except urllib.error.HTTPError:
            return  # 401 from an authenticating registry: it is up
        except OSError:
            time.sleep(0.1)
    raise UserError(f"docker-registry did not answer on 127.0.0.1:{port} within 10 s")


@contextmanager
def registry(
    root: Path,
    user: str | None = None,
    password: str | None = None,
    tls: Tls | None = None,
    token: TokenAuth | None = None,
) -> Iterator[str]:
    """Run a registry storing under `root` until the block ends; yields its host:port. With
    `user`, htpasswd authentication; with `token`, token authentication instead."""
    if not Path(REGISTRY_BINARY).exists():
        raise UserError(
            "docker-registry is not installed; `python -m builder engine --install --test-tools` installs it"
        )
    port = free_port()
    root.mkdir(parents=True, exist_ok=True)
    htpasswd = None
    if user:
        entry = subprocess.run(["htpasswd", "-Bbn", user, password or ""], capture_output=True, text=True, check=True)
        htpasswd = root / "htpasswd"
        htpasswd.write_text(entry.stdout)
    with (root / "registry.log").open("wb") as log:
        process = subprocess.Popen(
            [REGISTRY_BINARY, "serve", str(_config(root, port, htpasswd, tls, token))], stdout=log, stderr=log
        )
        try:
            _wait_until_up(port, "https" if tls else "http")
            yield f"127.0.0.1:{port}"
        finally:
            process.terminate()
            process.wait(timeout=10)
