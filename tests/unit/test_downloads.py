"""Every download goes through one client with retries: a server that answers 503 or 429 a few
times, then the file, is read; one that never recovers is an OSError after the retries."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from builder import downloads
from builder.errors import UserError
from builder.oci.registry import Registry


class Flaky(http.server.BaseHTTPRequestHandler):
    """Answers `failures` busy statuses, then the body."""

    failures: ClassVar[list[int]] = []
    served: ClassVar[list[str]] = []

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.served.append(self.path)
        status = self.failures.pop(0) if self.failures else 200
        body = b"the file" if status == 200 else b"busy"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        if status == 429:
            self.send_header("Retry-After", "0")
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def flaky(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setattr(downloads, "BACKOFF_S", 0.01)
    downloads._local.session = None  # a new session, with the short backoff
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Flaky.served = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    downloads._local.session = None


def test_a_busy_server_is_asked_again_until_it_answers(flaky: str, tmp_path: Path) -> None:
    Flaky.failures = [503, 429, 502]
    target = tmp_path / "file"
    downloads.download(f"{flaky}/x", target)
    assert target.read_bytes() == b"the file" and len(Flaky.served) == 4


def test_a_server_that_never_recovers_is_an_oserror_after_the_retries(flaky: str) -> None:
    Flaky.failures = [503] * (downloads.RETRIES + 1)
    with pytest.raises(OSError):
        downloads.get(f"{flaky}/x")
    assert len(Flaky.served) == downloads.RETRIES + 1


def test_a_missing_file_is_not_retried(flaky: str) -> None:
    Flaky.failures = [404]
    with pytest.raises(OSError):
        downloads.get(f"{flaky}/x")
    assert len(Flaky.served) == 1


def test_a_file_url_is_copied(tmp_path: Path) -> None:
    source = tmp_path / "source.deb"
    source.write_bytes(b"deb")
    downloads.download(source.as_uri(), tmp_path / "copy")
    assert (tmp_path / "copy").read_bytes() == b"deb"


def test_the_registry_client_asks_again_by_the_same_policy(flaky: str) -> None:
    """Issue 39: one retry policy. The registry client keeps its own loop (a layer's body is read
    again from its file on each try; an auth challenge is answered between tries), with the
    statuses, tries and backoff every download has."""
    client = Registry(flaky.removeprefix("http://"), backoff_s=0.01)
    Flaky.failures = [503, 429, 502]
    status, _, body = client._request("GET", "x")
    assert (status, body, len(Flaky.served)) == (200, b"the file", 4)
    Flaky.served, Flaky.failures = [], [404]
    assert client._request("GET", "x")[0] == 404 and len(Flaky.served) == 1
    Flaky.served, Flaky.failures = [], [503] * (downloads.RETRIES + 1)
    with pytest.raises(UserError, match=f"did not answer after {downloads.RETRIES + 1} tries"):
        client._request("GET", "x")
    assert len(Flaky.served) == downloads.RETRIES + 1
