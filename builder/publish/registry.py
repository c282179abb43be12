"""A client for the registry HTTP API v2 (distribution) on `requests`, with oras-py's
authentication: token (a `WWW-Authenticate: Bearer` challenge, as Docker Hub, GHCR, Quay,
Harbor, GitLab and ECR use) and basic, and credentials found the way docker finds them.

The engine pushes images; this client reads digests back to verify a push, moves aliases by
putting an already-pushed manifest, byte for byte, under another tag (one small request each,
so an alias never points at a half-pushed image), and pushes small JSON artifacts beside an
image. Credentials go to the registry's own origin and its token service only: requests drops
the Authorization header on a redirect to another host, and an upload location on another
host gets none.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import logging
import os
import shutil
import socket
import ssl
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import oras.auth
import oras.auth.utils
import requests

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
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
EMPTY_CONFIG = b"{}"
USER_VARIABLE, PASSWORD_VARIABLE = "TORCH_IMAGES_REGISTRY_USER", "TORCH_IMAGES_REGISTRY_PASSWORD"
# oras-py logs its own view of a refusal ("This endpoint requires a token..."); this client says
# what went wrong in one line of its own, so oras's log stays quiet.
logging.getLogger("oras").setLevel(logging.CRITICAL)


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


def system_ca_bundle() -> str | bool:
    """The system's CA store (where a site adds its own CA), not the bundle pip ships."""
    paths = ssl.get_default_verify_paths()
    return next((p for p in (paths.cafile, paths.openssl_cafile) if p and Path(p).is_file()), True)


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)
    source: str  # where they came from, for messages: never the secret itself


def docker_config_path(environ: os._Environ[str] | dict[str, str] = os.environ) -> Path:
    """The file docker reads: $DOCKER_CONFIG/config.json, else ~/.docker/config.json."""
    return Path(environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"


def docker_config_credentials(host: str, config: Path) -> Credentials | None:
    """Credentials for `host` as docker finds them in its config: `auths`, then `credHelpers`,
    then `credsStore` (oras-py looks them up and runs the credential helper)."""
    if not config.is_file():
        return None
    try:
        document = json.loads(config.read_text())
    except (OSError, ValueError) as error:
        raise UserError(f"{config}: not a docker config file ({error.__class__.__name__}); fix or move it") from None
    auths, helpers, store = document.get("auths", {}), document.get("credHelpers", {}), document.get("credsStore")
    # Named the way oras-py looks (it may fill `auths` in with what a helper returned).
    if auths.get(host, {}).get("auth"):
        where = "auths"
    elif host in helpers:
        where = f"credHelpers ({helpers[host]})"
    else:
        where = f"credsStore ({store})"
    helper = helpers.get(host) or (store if where.startswith("credsStore") else None)
    if helper and not shutil.which(f"docker-credential-{helper}"):
        raise UserError(
            f"{config} names the credential helper {helper!r} for {host}, but docker-credential-{helper} "
            "is not on PATH; install it or run `docker login` again"
        )
    backend = oras.auth.TokenAuth()
    backend._auth_config = {"auths": dict(auths), "credHelpers": helpers, "credsStore": store}
    if not backend._load_auth(host):
        return None
    username, _, password = base64.b64decode(backend._basic_auth).decode().partition(":")
    return Credentials(username, password, f"{config} {where}")


def find_credentials(host: str, environ: os._Environ[str] | dict[str, str] = os.environ) -> Credentials | None:
    """Docker's config first, then TORCH_IMAGES_REGISTRY_USER and _PASSWORD."""
    found = docker_config_credentials(host, docker_config_path(environ))
    if found:
        return found
    if environ.get(USER_VARIABLE):
        return Credentials(environ[USER_VARIABLE], environ.get(PASSWORD_VARIABLE, ""), USER_VARIABLE)
    return None


@dataclass(frozen=True)
class Manifest:
    body: bytes
    media_type: str
    digest: str

    @classmethod
    def of(cls, body: bytes, media_type: str) -> Manifest:
        """A manifest this client made: its digest is the sha256 of the exact bytes."""
        return cls(body, media_type, "sha256:" + hashlib.sha256(body).hexdigest())


class Registry:
    def __init__(
        self,
        host: str,
        username: str | None = None,
        password: str | None = None,
        retries: int = 4,
        backoff_s: float = 0.5,
        ca_file: Path | None = None,
        insecure: bool = False,
        source: str = "the given credentials",
    ) -> None:
        """HTTPS, checked against the system's CA store or `ca_file`; plain HTTP only for a
        registry on a loopback address (without a CA file) or with `insecure`."""
        self.host = host
        plain = insecure or (ca_file is None and is_loopback(host))
        self.base = f"{'http' if plain else 'https'}://{host}/v2/"
        self.session = requests.Session()
        self.session.trust_env = False  # no netrc or proxy settings from the environment
        self.session.verify = str(ca_file) if ca_file else system_ca_bundle()
        self.credentials = Credentials(username, password or "", source) if username is not None else None
        # oras-py answers token challenges: it asks the realm for a token for the scope the
        # registry named, with the basic credentials when there are any.
        self.tokens = oras.auth.get_auth_backend(
            "token", session=self.session, insecure=plain, tls_verify=self.session.verify
        )
        if self.credentials:
            self.tokens.set_basic_auth(self.credentials.username, self.credentials.password)
        self.authorization: str | None = None  # what the registry's last challenge asked for
        self.retries, self.backoff_s = retries, backoff_s

    @classmethod
    def for_publishing(cls, host: str, ca_file: Path | None = None, insecure: bool = False) -> Registry:
        found = find_credentials(host)
        if found is None:
            return cls(host, ca_file=ca_file, insecure=insecure)
        return cls(host, found.username, found.password, ca_file=ca_file, insecure=insecure, source=found.source)

    def _refused(self, status: int) -> UserError:
        if self.credentials is None:
            return UserError(
                f"registry {self.host} wants credentials ({status}); log in with `docker login {self.host}` "
                f"or set {USER_VARIABLE} and {PASSWORD_VARIABLE}"
            )
        return UserError(f"registry {self.host} refused the credentials from {self.credentials.source} ({status})")

    def _answer_challenge(self, response: requests.Response) -> None:
        challenge = response.headers.get("WWW-Authenticate", "")
        if challenge.lower().startswith("bearer"):
            self.tokens.token = None  # expired, or for another scope: ask again
            _, granted = self.tokens.authenticate_request(response, {})
            if not granted or not self.tokens.token:
                raise self._refused(response.status_code)
            self.authorization = f"Bearer {self.tokens.token}"
        elif challenge.lower().startswith("basic") and self.credentials:
            pair = f"{self.credentials.username}:{self.credentials.password}".encode()
            self.authorization = "Basic " + base64.b64encode(pair).decode()
        else:
            raise self._refused(response.status_code)

    def _send(self, method: str, url: str, headers: dict[str, str], data: bytes | None) -> requests.Response:
        sent = dict(headers)
        if self.authorization and same_origin(url, self.base):
            sent["Authorization"] = self.authorization
        return self.session.request(method, url, headers=sent, data=data, timeout=30)

    def _request(
        self, method: str, path: str, headers: dict[str, str] | None = None, data: bytes | None = None
    ) -> tuple[int, Mapping[str, str], bytes]:
        """Status, headers (case-insensitive, as HTTP's are) and body."""
        url = path if path.startswith("http") else self.base + path
        last_error = ""
        for attempt in range(self.retries + 1):
            try:
                response = self._send(method, url, headers or {}, data)
                if response.status_code in (401, 403) and same_origin(url, self.base):
                    self._answer_challenge(response)
                    response = self._send(method, url, headers or {}, data)
                    if response.status_code in (401, 403):
                        raise self._refused(response.status_code)
                if response.status_code < 500:
                    return response.status_code, response.headers, response.content
                last_error = f"HTTP {response.status_code}"
            except requests.exceptions.SSLError as error:
                raise UserError(
                    f"registry {self.host}: its TLS certificate is not trusted ({error.__class__.__name__}); "
                    "give its CA with --registry-ca FILE"
                ) from None
            except requests.exceptions.RequestException as error:
                last_error = error.__class__.__name__
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
        return self._put_manifest(repository, reference, manifest).get("Docker-Content-Digest", manifest.digest)

    def _put_manifest(self, repository: str, reference: str, manifest: Manifest) -> Mapping[str, str]:
        status, headers, body = self._request(
            "PUT", f"{repository}/manifests/{reference}", {"Content-Type": manifest.media_type}, manifest.body
        )
        if status not in (200, 201):
            raise UserError(
                f"registry {self.host} refused the manifest for {repository}:{reference} ({status}: {body[:120]!r})"
            )
        return headers

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
        self,
        repository: str,
        reference: str,
        payload: bytes,
        media_type: str,
        annotations: dict[str, str],
        subject: Manifest,
    ) -> str:
        """One JSON document as an OCI artifact whose `subject` is the image it describes, under
        its own tag too (so `docker`-era tools find it by name). A registry with the referrers
        API indexes it by the subject (and says so with OCI-Subject); for one without, the
        referrers tag schema's index (`sha256-<hex>`) is updated, as OCI 1.1 clients expect."""
        config_digest = self.upload_blob(repository, EMPTY_CONFIG)
        layer_digest = self.upload_blob(repository, payload)
        document = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "artifactType": media_type,
            "config": {
                "mediaType": "application/vnd.oci.empty.v1+json",
                "digest": config_digest,
                "size": len(EMPTY_CONFIG),
            },
            "layers": [{"mediaType": media_type, "digest": layer_digest, "size": len(payload)}],
            "subject": {"mediaType": subject.media_type, "digest": subject.digest, "size": len(subject.body)},
            "annotations": annotations,
        }
        body = json.dumps(document, sort_keys=True).encode()
        artifact = Manifest.of(body, OCI_MANIFEST)
        headers = self._put_manifest(repository, artifact.digest, artifact)
        self.put_manifest(repository, reference, artifact)
        if headers.get("OCI-Subject") != subject.digest:
            self._add_to_referrers_tag(repository, subject.digest, artifact, media_type, annotations)
        return artifact.digest

    @staticmethod
    def referrers_tag(digest: str) -> str:
        return digest.replace(":", "-")

    def _add_to_referrers_tag(
        self, repository: str, subject: str, artifact: Manifest, artifact_type: str, annotations: dict[str, str]
    ) -> None:
        tag = self.referrers_tag(subject)
        current = self.manifest(repository, tag)
        listed: list[dict[str, Any]] = json.loads(current.body).get("manifests", []) if current else []
        entries = [e for e in listed if e.get("digest") != artifact.digest]
        entry = {"mediaType": OCI_MANIFEST, "digest": artifact.digest, "size": len(artifact.body)}
        entries.append({**entry, "artifactType": artifact_type, "annotations": annotations})
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}
        body = json.dumps(index, sort_keys=True).encode()
        self.put_manifest(repository, tag, Manifest.of(body, OCI_INDEX))

    def referrers(self, repository: str, subject: str, artifact_type: str | None = None) -> list[dict[str, Any]]:
        """The artifacts attached to `subject`: from the referrers API where the registry has it,
        else from the referrers tag."""
        status, _, body = self._request("GET", f"{repository}/referrers/{subject}", {"Accept": OCI_INDEX})
        if status == 200:
            manifests = json.loads(body).get("manifests", [])
        else:
            fallback = self.manifest(repository, self.referrers_tag(subject))
            manifests = json.loads(fallback.body).get("manifests", []) if fallback else []
        return [m for m in manifests if artifact_type is None or m.get("artifactType") == artifact_type]

    def attached(self, repository: str, subject: str) -> dict[str, str]:
        """artifactType -> digest of each artifact attached to `subject`."""
        return {str(m.get("artifactType")): str(m["digest"]) for m in self.referrers(repository, subject)}

    def blob(self, repository: str, digest: str) -> bytes:
        status, _, body = self._request("GET", f"{repository}/blobs/{digest}")
        if status != 200:
            raise UserError(f"registry {self.host} has no blob {digest} in {repository}")
        return body
