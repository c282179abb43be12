"""What the registry tests need besides the registry: certificates made with openssl, and a small
token issuer (the service a registry's `WWW-Authenticate: Bearer realm=...` points at) that
checks basic credentials and signs tokens with the test key, as Docker Hub's or GHCR's do."""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import re
import secrets
import socket
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@dataclass(frozen=True)
class ServerCertificate:
    ca: Path  # what a client is told to trust
    certificate: Path
    key: Path


def server_certificate(directory: Path, ip: str = "127.0.0.1") -> ServerCertificate:
    """A CA, and a certificate it signed for `ip` (a subjectAltName, as clients check)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = directory / "ca.pem", directory / "ca-key.pem"
    cert, key, request = directory / "server.pem", directory / "server-key.pem", directory / "server.csr"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
             "-days", "2", "-subj", "/CN=torch-images test CA")  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(request), "-subj", f"/CN={ip}")
    extensions = directory / "san.cnf"
    extensions.write_text(f"subjectAltName=IP:{ip}\nextendedKeyUsage=serverAuth\n")
    _openssl("x509", "-req", "-in", str(request), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
             "-out", str(cert), "-days", "2", "-extfile", str(extensions))  # fmt: skip
    return ServerCertificate(ca, cert, key)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass
class TokenIssuer:
    """Issues RS256 tokens for the scopes asked, to the one user it knows; `ttl_s` short makes
    them expire while a test runs. `issued` counts tokens, `refused` wrong credentials."""

    directory: Path
    user: str
    password: str
    service: str = "torch-images-test-registry"
    issuer: str = "torch-images-test-issuer"
    ttl_s: int = 300
    issued: list[str] = field(default_factory=list)  # the scope of each token issued
    refused: int = 0
    port: int = 0

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.key, self.certificate = self.directory / "issuer-key.pem", self.directory / "issuer.pem"
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(self.key), "-out",
                 str(self.certificate), "-days", "2", "-subj", f"/CN={self.issuer}")  # fmt: skip
        der = subprocess.run(
            ["openssl", "x509", "-in", str(self.certificate), "-outform", "DER"], check=True, capture_output=True
        ).stdout
        self.chain = [base64.b64encode(der).decode()]

    @property
    def realm(self) -> str:
        return f"http://127.0.0.1:{self.port}/token"

    def _sign(self, data: bytes) -> bytes:
        return subprocess.run(
            ["openssl", "dgst", "-sha256", "-sign", str(self.key)], input=data, check=True, capture_output=True
        ).stdout

    def token(self, scopes: list[str]) -> str:
        now = int(time.time())
        access = []
        for scope in scopes:
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            access.append({"type": kind, "name": name, "actions": [a for a in actions.split(",") if a]})
        header = {"alg": "RS256", "typ": "JWT", "x5c": self.chain}
        claims = {"iss": self.issuer, "sub": self.user, "aud": self.service, "exp": now + self.ttl_s,
                  "nbf": now - 5, "iat": now, "jti": secrets.token_hex(8), "access": access}  # fmt: skip
        signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        return f"{signing_input}.{_b64url(self._sign(signing_input.encode()))}"

    def authorised(self, header: str | None) -> bool:
        expected = "Basic " + base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        return header == expected

    @contextmanager
    def serving(self) -> Iterator[TokenIssuer]:
        issuer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                if not issuer.authorised(self.headers.get("Authorization")):
                    issuer.refused += 1
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                scopes = query.get("scope", [])
                issuer.issued.append(" ".join(scopes))
                body = json.dumps({"token": issuer.token(scopes), "expires_in": issuer.ttl_s}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = server.server_address[1]
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()


def _accept_and_relay(
    listener: socket.socket,
    target_port: int,
    pump: Callable[[socket.socket, socket.socket, bool], None],
    opened: set[socket.socket] | None = None,
) -> None:
    """Join each connection `listener` accepts to a new one to the target on loopback, through
    `pump` each way (upstream True for what the client sends), until the listener closes."""
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        upstream = socket.create_connection(("127.0.0.1", target_port))
        if opened is not None:
            opened |= {client, upstream}
        threading.Thread(target=pump, args=(client, upstream, True), daemon=True).start()
        threading.Thread(target=pump, args=(upstream, client, False), daemon=True).start()


@dataclass
class CuttingProxy:
    """A TCP proxy on loopback in front of a registry that cuts the first connection carrying
    more than `cut_after` bytes upstream (a push), as a dropped network would, then forwards
    everything else untouched."""

    target_port: int
    cut_after: int = 32 << 20
    cuts: int = 0
    port: int = 0

    def _pump(self, source: socket.socket, sink: socket.socket, upstream: bool) -> None:
        sent = 0
        try:
            while data := source.recv(1 << 16):
                sent += len(data) if upstream else 0
                if upstream and self.cuts == 0 and sent > self.cut_after:
                    self.cuts += 1
                    break
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    def _serve(self, listener: socket.socket) -> None:
        _accept_and_relay(listener, self.target_port, self._pump)

    @contextmanager
    def serving(self) -> Iterator[str]:
        listener = socket.create_server(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        threading.Thread(target=self._serve, args=(listener,), daemon=True).start()
        try:
            yield f"127.0.0.1:{self.port}"
        finally:
            listener.close()


@dataclass
class DyingProxy:
    """A TCP proxy on loopback in front of a registry that dies at the first request whose bytes
    match `at` (a pattern over the request line: rb"^DELETE /v2/" for prune's first delete): every
    connection is cut, that request's before it reaches the registry, and the port refuses
    connections for `down_s` seconds, as a registry that crashed and is restarted does. Then it
    forwards again. A client's retries (about 7 s in all) do not outlast the default 20 s."""

    target_port: int
    at: bytes
    down_s: float = 20.0
    deaths: int = 0
    port: int = 0
    _open: set[socket.socket] = field(default_factory=set)
    _listener: socket.socket | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closing: bool = False

    def _pump(self, source: socket.socket, sink: socket.socket, upstream: bool) -> None:
        try:
            while data := source.recv(1 << 16):
                if upstream and self.deaths == 0 and re.search(self.at, data, re.MULTILINE):
                    self._die()
                    break
                sink.sendall(data)
        except OSError:
            pass
        self._close(source, sink)

    def _close(self, *ends: socket.socket) -> None:
        for end in ends:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()
            self._open.discard(end)

    def _die(self) -> None:
        with self._lock:
            self.deaths += 1
            listener, self._listener = self._listener, None
        if listener is not None:
            # Connections are refused from now on: shutdown wakes the accept blocked on it (a
            # close alone leaves the socket listening until that accept returns).
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        self._close(*list(self._open))
        threading.Timer(self.down_s, self._come_back).start()

    def _come_back(self) -> None:
        if self._closing:
            return
        listener = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._serve, args=(listener,), daemon=True).start()

    def _serve(self, listener: socket.socket) -> None:
        _accept_and_relay(listener, self.target_port, self._pump, self._open)

    def wait_until_back(self) -> None:
        """Returns once the registry answers through the proxy again."""
        for _ in range(int(self.down_s * 10) + 100):
            if self._listener is not None:
                return
            time.sleep(0.1)
        raise AssertionError("the proxy did not come back")

    @contextmanager
    def serving(self) -> Iterator[str]:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._serve, args=(self._listener,), daemon=True).start()
        try:
            yield f"127.0.0.1:{self.port}"
        finally:
            self._closing = True
            if self._listener is not None:
                with contextlib.suppress(OSError):
                    self._listener.shutdown(socket.SHUT_RDWR)
                self._listener.close()
            self._close(*list(self._open))
