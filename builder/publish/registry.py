"""A small client for the registry HTTP API v2 (distribution), with retries for transient faults.

The engine pushes images; this client reads digests back to verify a push, moves aliases by
putting an already-pushed manifest under another tag (one small request each, so an alias
never points at a half-pushed image), and pushes small JSON artifacts beside an image.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from builder.errors import UserError

MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.index.v1+json",
    ]
)
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
EMPTY_CONFIG = b"{}"


def is_loopback(host: str) -> bool:
    """Whether every address `host` (host[:port]) resolves to is a loopback address.

    Decided from the resolved addresses, not the name: "localhost.example.com" or
    "127.0.0.1.example.com" are remote hosts and get HTTPS.
    """
    name = urllib.parse.urlsplit(f"//{host}").hostname or ""
    try:
        infos = socket.getaddrinfo(name, None)
    except (OSError, UnicodeError):
        return False
    return bool(infos) and all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def same_origin(url: str, base: str) -> bool:
    first, second = urllib.parse.urlsplit(url), urllib.parse.urlsplit(base)
    return (first.scheme, first.hostname, first.port) == (second.scheme, second.hostname, second.port)


@dataclass(frozen=True)
class Manifest:
    body: bytes
    media_type: str
    digest: str


class Registry:
    def __init__(
        self,
        host: str,
        username: str | None = None,
        password: str | None = None,
        retries: int = 4,
        backoff_s: float = 0.5,
    ) -> None:
        self.host = host
        self.base = f"{'http' if is_loopback(host) else 'https'}://{host}/v2/"
        self.auth = (
            "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode() if username is not None else None
        )
        self.retries, self.backoff_s = retries, backoff_s

    def _request(
        self, method: str, path: str, headers: dict[str, str] | None = None, data: bytes | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        url = path if path.startswith("http") else self.base + path
        headers = dict(headers or {})
        last_error = ""
        for attempt in range(self.retries + 1):
            request = urllib.request.Request(url, data=data, method=method, headers=headers)
            if self.auth and same_origin(url, self.base):
                # Unredirected: urllib copies ordinary headers onto a redirect to any host;
                # credentials go to the registry itself and nowhere else.
                request.add_unredirected_header("Authorization", self.auth)
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    return response.status, dict(response.headers), response.read()
            except urllib.error.HTTPError as error:
                if error.code in (401, 403):
                    raise UserError(
                        f"registry {self.host} refused the credentials ({error.code}); "
                        "set TORCH_IMAGES_REGISTRY_USER and TORCH_IMAGES_REGISTRY_PASSWORD"
                    ) from None
                if error.code < 500:
                    return error.code, dict(error.headers), error.read()
                last_error = f"HTTP {error.code}"
            except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
                reason = getattr(error, "reason", error)
                last_error = str(reason)
            if attempt < self.retries:
                time.sleep(self.backoff_s * 2**attempt)
        raise UserError(
            f"registry {self.host} did not answer after {self.retries + 1} tries ({last_error}); "
            "check that it runs and `registry:` in matrix.yaml"
        )

    def check(self) -> None:
        """Reachable, and the credentials (if any) accepted: before anything is pushed."""
        status, _, _ = self._request("GET", "")
        if status != 200:
            raise UserError(f"registry {self.host} answered {status} to /v2/; is it a registry?")

    def manifest(self, repository: str, reference: str) -> Manifest | None:
        status, headers, body = self._request("GET", f"{repository}/manifests/{reference}", {"Accept": MANIFEST_TYPES})
        if status == 404:
            return None
        if status != 200:
            raise UserError(f"registry {self.host} answered {status} for {repository}:{reference}")
        digest = headers.get("Docker-Content-Digest") or "sha256:" + hashlib.sha256(body).hexdigest()
        return Manifest(body, headers.get("Content-Type", ""), digest)

    def put_manifest(self, repository: str, reference: str, manifest: Manifest) -> str:
        status, headers, body = self._request(
            "PUT", f"{repository}/manifests/{reference}", {"Content-Type": manifest.media_type}, manifest.body
        )
        if status not in (200, 201):
            raise UserError(
                f"registry {self.host} refused the manifest for {repository}:{reference} ({status}: {body[:120]!r})"
            )
        return headers.get("Docker-Content-Digest", manifest.digest)

    def upload_blob(self, repository: str, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        status, _, _ = self._request("HEAD", f"{repository}/blobs/{digest}")
        if status == 200:
            return digest
        status, headers, _ = self._request("POST", f"{repository}/blobs/uploads/")
        location = headers.get("Location", "")
        if status != 202 or not location:
            raise UserError(f"registry {self.host} refused a blob upload ({status})")
        if location.startswith("/"):
            location = self.base.removesuffix("/v2/") + location
        # An upload location on another host (a storage service) gets no credentials: see _request.
        separator = "&" if "?" in location else "?"
        status, _, _ = self._request(
            "PUT", f"{location}{separator}digest={digest}", {"Content-Type": "application/octet-stream"}, data
        )
        if status != 201:
            raise UserError(f"registry {self.host} did not store a blob ({status})")
        return digest

    def push_artifact(
        self, repository: str, reference: str, payload: bytes, media_type: str, annotations: dict[str, str]
    ) -> str:
        """One JSON document as an OCI artifact under its own tag, beside the image it describes."""
        config_digest = self.upload_blob(repository, EMPTY_CONFIG)
        layer_digest = self.upload_blob(repository, payload)
        document = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {
                "mediaType": "application/vnd.oci.empty.v1+json",
                "digest": config_digest,
                "size": len(EMPTY_CONFIG),
            },
            "layers": [{"mediaType": media_type, "digest": layer_digest, "size": len(payload)}],
            "annotations": annotations,
        }
        body = json.dumps(document, sort_keys=True).encode()
        return self.put_manifest(
            repository, reference, Manifest(body, OCI_MANIFEST, "sha256:" + hashlib.sha256(body).hexdigest())
        )

    def blob(self, repository: str, digest: str) -> bytes:
        status, _, body = self._request("GET", f"{repository}/blobs/{digest}")
        if status != 200:
            raise UserError(f"registry {self.host} has no blob {digest} in {repository}")
        return body
