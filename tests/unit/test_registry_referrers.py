"""Artifacts attached to an image: through the referrers API where a registry has it, through
the referrers tag where it does not (Debian's distribution 2.8, which the integration tests use)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import ClassVar

import pytest

from builder.oci.registry import OCI_INDEX, OCI_MANIFEST, Manifest, Registry

SUBJECT_BODY = b'{"schemaVersion": 2}'
SUBJECT = Manifest.of(SUBJECT_BODY, OCI_MANIFEST)


class _OciOneOne(http.server.BaseHTTPRequestHandler):
    """A registry with the referrers API: it answers OCI-Subject and lists referrers itself."""

    requests: ClassVar[list[tuple[str, str]]] = []

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in {**(headers or {}), "Content-Length": str(len(body))}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.requests.append(("HEAD", self.path))
        self._send(200)  # every blob is "there already"

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.requests.append(("PUT", self.path))
        self._send(201, headers={"OCI-Subject": SUBJECT.digest})

    def do_GET(self) -> None:
        self.requests.append(("GET", self.path))
        if self.path.startswith("/v2/torch/referrers/"):
            listed = [{"digest": "sha256:" + "a" * 64, "artifactType": "application/x-report"}]
            index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": listed}
            self._send(200, json.dumps(index).encode(), {"Content-Type": OCI_INDEX})
        else:
            self._send(404)


@pytest.fixture
def oci_registry() -> Iterator[str]:
    _OciOneOne.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OciOneOne)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_registry_with_the_referrers_api_is_not_given_a_referrers_tag(oci_registry: str) -> None:
    client = Registry(oci_registry, retries=0)
    digest = client.push_artifact("torch", "x.report", b"{}", "application/x-report", {}, SUBJECT)
    puts = [path for method, path in _OciOneOne.requests if method == "PUT" and "/manifests/" in path]
    assert puts == [f"/v2/torch/manifests/{digest}", "/v2/torch/manifests/x.report"]  # no sha256-<hex> tag
    assert client.referrers("torch", SUBJECT.digest, "application/x-report") == [
        {"digest": "sha256:" + "a" * 64, "artifactType": "application/x-report"}
    ]
    assert ("GET", f"/v2/torch/referrers/{SUBJECT.digest}") in _OciOneOne.requests
    assert client.referrers("torch", SUBJECT.digest, "application/other") == []
