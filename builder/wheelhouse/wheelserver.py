"""The wheelhouse server: the cache on loopback, for builds that reach it with host networking.

It answers only for the files builds asked for (`Wheelhouse.allow`): no directory listings, no
symbolic links, nothing else under the cache. A server another process started on the same
address and root is reused.
"""

from __future__ import annotations

import http.server
import os
import posixpath
import shutil
import stat
import threading
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


def _serving_same_root(host: str, port: int, root: Path) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/{MARKER}", timeout=2) as response:
            return bool(response.read().decode() == str(root.resolve()))
    except OSError:
        return False


@contextmanager
def serve(house: Wheelhouse, listen: str) -> Iterator[str]:
    """Serve the wheelhouse on a loopback address for the duration of a build.

    The address is fixed by matrix.yaml because it is part of the rendered RUN line (and so of
    the layer cache key). A second build reuses a server already serving the same cache.
    """
    host, port = listen.rsplit(":", 1)
    handler = type("WheelhouseHandler", (_Handler,), {"house": house})
    try:
        server = http.server.ThreadingHTTPServer((host, int(port)), handler)
    except OSError as error:
        if _serving_same_root(host, int(port), house.root):
            yield f"http://{listen}/"
            return
        raise UserError(
            f"cannot serve the wheelhouse on {listen}: {error.strerror}; free the port or change wheelhouse.listen"
        ) from None
    # A short poll interval: shutdown() waits up to one interval, on every build.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://{listen}/"
    finally:
        server.shutdown()
        server.server_close()
