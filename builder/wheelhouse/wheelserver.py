"""The wheelhouse server: the cache on loopback, for builds that reach it with host networking.

It answers only for the files builds asked for (`Wheelhouse.allow`): no directory listings, no
symbolic links, nothing else under the cache. Within one process a nested build reuses the
server already running on its address. A build in another process (a second CI job on the same
machine, `nox -s build` while the tests run) holds the address until its engine steps end: this
one waits for it, instead of failing, or of sharing a server that goes away when that build ends.
"""

from __future__ import annotations

import http.server
import os
import posixpath
import shutil
import stat
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from builder import confined
from builder.errors import UserError
from builder.wheelhouse.wheelhouse import MARKER, Wheelhouse


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves exactly the files builds asked for: no directory listings, no symbolic links."""

    house: Wheelhouse

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        relative = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")
        if relative.endswith("/") or not relative:  # pip reads a find-links page by its folder's URL
            relative += "index.html"
        relative = posixpath.normpath(relative)  # "locks/k/../../sha256/..." as a client may send it
        try:  # inside the root, through no link below it (the root itself may be one: a cache CI restores)
            path = confined.inside(self.house.root, relative)
        except UserError:
            self.send_error(404)
            return
        if not self.house.serves(relative):
            self.send_error(404)
            return
        try:
            handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            self.send_error(404)
            return
        with os.fdopen(handle, "rb") as source:
            info = os.fstat(source.fileno())
            if not stat.S_ISREG(info.st_mode):
                self.send_error(404)
                return
            self.send_response(200)
            kind = "text/html" if relative.endswith(".html") else "application/octet-stream"
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(info.st_size))
            self.end_headers()
            if body:
                shutil.copyfileobj(source, self.wfile, 1 << 20)


# The address's servers in this process, with the root each serves.
_RUNNING: dict[str, Path] = {}
WAIT_S = 3600.0  # how long a build waits for another process's build to free the address
POLL_S = 1.0


def _wheelhouse_root_at(host: str, port: int) -> str | None:
    """The root a builder's wheelhouse server on the address names (its marker file), or None
    when what answers there is not one."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/{MARKER}", timeout=2) as response:
            text: str = response.read(4096).decode(errors="replace")
    except (OSError, ValueError):
        return None
    return text if text.startswith("/") else None


def _bind(house: Wheelhouse, listen: str) -> http.server.ThreadingHTTPServer:
    """A server bound to the address; waits (saying so once) while another process's build serves
    its wheelhouse there; refuses an address something else holds."""
    host, port = listen.rsplit(":", 1)
    handler = type("WheelhouseHandler", (_Handler,), {"house": house})
    deadline, said = time.monotonic() + WAIT_S, False
    while True:
        try:
            return http.server.ThreadingHTTPServer((host, int(port)), handler)
        except OSError as error:
            other = _wheelhouse_root_at(host, int(port))
            if other is None:
                why = f"cannot serve the wheelhouse on {listen}: {error.strerror}"
                raise UserError(f"{why}; free the port or change wheelhouse.listen") from None
            if time.monotonic() > deadline:
                raise UserError(
                    f"{listen} still serves another build's wheelhouse ({other}) after {WAIT_S:.0f} s; "
                    "let that build finish, or stop it"
                ) from None
            if not said:
                house.report(f"waiting for {listen}: another build on this machine serves its wheelhouse there")
                said = True
            time.sleep(POLL_S)


@contextmanager
def serve(house: Wheelhouse, listen: str) -> Iterator[str]:
    """Serve the wheelhouse on a loopback address for the duration of a build.

    The address is fixed by matrix.yaml because it is part of the rendered RUN line (and so of
    the layer cache key). A nested build in this process reuses the server running for the same
    root; a build in another process is waited for (see the module's docstring).
    """
    running = _RUNNING.get(listen)
    if running is not None:
        if running != house.root.resolve():
            raise UserError(f"{listen} already serves the wheelhouse {running} in this run; one root per address")
        yield f"http://{listen}/"
        return
    server = _bind(house, listen)
    _RUNNING[listen] = house.root.resolve()
    # A short poll interval: shutdown() waits up to one interval, on every build.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://{listen}/"
    finally:
        del _RUNNING[listen]
        server.shutdown()
        server.server_close()
