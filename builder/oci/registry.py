"""A client for the registry HTTP API v2 (distribution) on `requests`, with token (a
`WWW-Authenticate: Bearer` challenge, as Docker Hub, GHCR, Quay, Harbor, GitLab and ECR use) and
basic authentication, and credentials found the way docker finds them (oci/auth.py).

Every answer is validated before use (issue 25): its size against a cap, its shape, the
digest of anything fetched by digest, and `Docker-Content-Digest` against the body. An answer
that fails is one line, exit 2, and nothing moves.

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
import json
import os
import re
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import requests

from builder import downloads, jsonread
from builder.digests import sha256_file
from builder.errors import UserError
from builder.oci import auth
from builder.oci.auth import (  # re-exported: the publish stage's callers and tests name them here
    PASSWORD_VARIABLE,
    USER_VARIABLE,
    Credentials,
    docker_config_credentials,
    docker_config_path,
    find_credentials,
    is_loopback,
)
from builder.terminal import printable

__all__ = [
    "PASSWORD_VARIABLE", "USER_VARIABLE", "Credentials", "Manifest", "Registry", "docker_config_credentials",
    "docker_config_path", "find_credentials", "is_loopback",
]  # fmt: skip

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_INDEX = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_INDEX})
IMAGE_TYPES = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
MANIFEST_TYPES = ", ".join([DOCKER_MANIFEST, OCI_MANIFEST, DOCKER_INDEX, OCI_INDEX])
EMPTY_CONFIG = b"{}"
# Caps on what a registry's answer may hold (the distribution registry's own limit for a
# manifest is 4 MiB); past them an answer is refused unread.
MAX_MANIFEST_BYTES = 4 << 20  # manifests, indexes and referrer lists
MAX_BLOB_BYTES = 64 << 20  # blobs read into memory: image configs, SBOMs, self-test reports
MAX_LAYER_BYTES = 16 << 30  # blobs streamed into a file: layers (the largest flagship layer is under 2 GB)
MAX_REFERRERS = 10_000
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


# An Authorization value an error body may echo back: the scheme, then the credential.
CREDENTIAL_TEXT = re.compile(r"\b(Basic|Bearer)\s+[A-Za-z0-9+/=._~-]+", re.IGNORECASE)


DOCKER_HUB = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})


def api_host(host: str) -> str:
    """Where a registry's API answers: Docker Hub's names all answer at registry-1.docker.io."""
    return "registry-1.docker.io" if host in DOCKER_HUB else host


def environment_proxies(base: str) -> dict[str, str]:
    """HTTPS_PROXY and HTTP_PROXY (either case) for this registry, unless NO_PROXY names it; a
    loopback registry is always reached directly."""
    if is_loopback(urllib.parse.urlsplit(base).netloc):
        return {}
    proxies = {scheme: url for scheme, url in urllib.request.getproxies().items() if scheme in ("http", "https")}
    no_proxy = os.environ.get("NO_PROXY") or os.environ.get("no_proxy")
    if not proxies or requests.utils.should_bypass_proxies(base, no_proxy=no_proxy):
        return {}
    return proxies


def same_origin(url: str, base: str) -> bool:
    first, second = urllib.parse.urlsplit(url), urllib.parse.urlsplit(base)
    return (first.scheme, first.hostname, first.port) == (second.scheme, second.hostname, second.port)


def sha256_digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def json_object(body: bytes, what: str) -> dict[str, Any]:
    """A registry's answer as a JSON object, or one line saying it is not one."""
    try:
        document = jsonread.loads(body, what)
    except UserError as error:
        raise UserError(f"{error.message} ({len(body)} bytes); nothing was moved") from None
    if not isinstance(document, dict):
        raise UserError(f"{what} is JSON but not an object; nothing was moved")
    return document


def _descriptor(entry: object, what: str) -> dict[str, Any]:
    """An OCI descriptor: an object with a sha256 digest and a size (and optional strings)."""
    if not isinstance(entry, dict):
        raise UserError(f"{what}: a descriptor that is not an object; nothing was moved")
    digest, size = entry.get("digest"), entry.get("size", 0)
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise UserError(f"{what}: a descriptor whose digest is not sha256:<64 hex>; nothing was moved")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise UserError(f"{what}: descriptor {digest[:19]} has no valid size; nothing was moved")
    for key in ("mediaType", "artifactType"):
        if key in entry and not isinstance(entry[key], str):
            raise UserError(f"{what}: descriptor {digest[:19]} has a {key} that is not a string; nothing was moved")
    annotations = entry.get("annotations", {})
    if not isinstance(annotations, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()
    ):
        raise UserError(f"{what}: descriptor {digest[:19]} has annotations that are not strings; nothing was moved")
    platform = entry.get("platform", {})
    if not isinstance(platform, dict) or not all(isinstance(v, str | list) for v in platform.values()):
        raise UserError(f"{what}: descriptor {digest[:19]} has a platform that is not an object; nothing was moved")
    return entry


def check_manifest_shape(document: dict[str, Any], media_type: str, what: str) -> None:
    """An image manifest names a config and layers; an index lists manifests: each a descriptor."""
    if document.get("schemaVersion") != 2:
        raise UserError(f"{what}: schemaVersion is not 2; nothing was moved")
    if media_type in INDEX_TYPES:
        listed = document.get("manifests")
        if not isinstance(listed, list) or len(listed) > MAX_REFERRERS:
            raise UserError(f"{what}: an index without a list of manifests; nothing was moved")
        for entry in listed:
            _descriptor(entry, what)
        return
    _descriptor(document.get("config"), what)
    layers = document.get("layers")
    if not isinstance(layers, list):
        raise UserError(f"{what}: a manifest without a list of layers; nothing was moved")
    for entry in layers:
        _descriptor(entry, what)
    if "subject" in document:
        _descriptor(document["subject"], what)


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
        credentials: Credentials | None = None,
        retries: int = downloads.RETRIES,
        backoff_s: float = downloads.BACKOFF_S,
        ca_file: Path | None = None,
        insecure: bool = False,
    ) -> None:
        """HTTPS, checked against the system's CA store or `ca_file`; plain HTTP only for a
        registry on a loopback address (without a CA file) or with `insecure`. `docker.io` is
        Docker Hub, whose API answers at registry-1.docker.io. `login` gives credentials by name."""
        self.host = host
        self.plain = insecure or (ca_file is None and is_loopback(host))
        self.insecure = insecure
        self.base = f"{'http' if self.plain else 'https'}://{api_host(host)}/v2/"
        self.session = requests.Session()
        self.session.trust_env = False  # no netrc from the environment; its proxies, below
        self.session.proxies.update(environment_proxies(self.base))
        self.session.verify = str(ca_file) if ca_file else downloads.system_ca_bundle()
        self.credentials = credentials
        self.authorization: str | None = None  # what the registry's last challenge asked for
        self.retries, self.backoff_s = retries, backoff_s

    @staticmethod
    def login(username: str, password: str | None, source: str = "the given credentials") -> Credentials:
        """Credentials given by name and password (a test's, a CI secret's)."""
        return Credentials(username, password or "", source)

    @classmethod
    def for_publishing(
        cls, host: str, ca_file: Path | None = None, insecure: bool = False, configured: str | None = None
    ) -> Registry:
        """A client of `host` with its credentials; the environment's go only to `configured`
        (the matrix's registry; by default `host` itself, the one being published to)."""
        found = find_credentials(host, configured=host if configured is None else configured)
        if found is None:
            return cls(host, ca_file=ca_file, insecure=insecure)
        return cls(host, found, ca_file=ca_file, insecure=insecure)

    @classmethod
    def reached(cls, host: str, ca_file: Path | None = None, insecure: bool = False) -> Registry:
        """The registry a command publishes to, with its credentials, checked to answer: how every
        command that pushes, stages, tests on a GPU or promotes gets its client."""
        found = cls.for_publishing(host, ca_file, insecure)
        found.check()
        return found

    def quoted(self, body: bytes) -> str:
        """The start of a registry's answer, for an error line: never a credential (an error body
        may echo the request's Authorization header), never a control character."""
        text = body[:400].decode("utf-8", errors="replace")
        secrets = [self.credentials.password] if self.credentials and self.credentials.password else []
        if self.authorization:
            secrets.append(self.authorization.split(" ", 1)[-1])
        for secret in secrets:
            text = text.replace(secret, "***")
        text = CREDENTIAL_TEXT.sub(lambda found: f"{found.group(1)} ***", text)
        return repr(printable(text)[:120])

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
            parameters = auth.challenge_parameters(challenge)
            if not parameters.get("realm"):
                raise UserError(
                    f"registry {self.host} asked for a token but named no token service (realm) in its challenge"
                )
            realm = auth.token_service(parameters["realm"], self.host, self.plain, self.insecure)
            token = auth.fetch_token(self.session, realm, parameters, self.credentials, self.host)
            if token is None:
                raise self._refused(response.status_code)
            self.authorization = f"Bearer {token}"
        elif challenge.lower().startswith("basic") and self.credentials:
            pair = f"{self.credentials.username}:{self.credentials.password}".encode()
            self.authorization = "Basic " + base64.b64encode(pair).decode()
        else:
            raise self._refused(response.status_code)

    def _send(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        data: bytes | Path | None,
        limit: int,
        sink: IO[bytes] | None = None,
    ) -> tuple[requests.Response, bytes]:
        sent = dict(headers)
        if self.authorization and same_origin(url, self.base):
            sent["Authorization"] = self.authorization
        if isinstance(data, Path):  # a layer: streamed from the start of its file on every try
            with data.open("rb") as body:
                sent["Content-Length"] = str(data.stat().st_size)
                response = self.session.request(method, url, headers=sent, data=body, timeout=30, stream=True)
        else:
            response = self.session.request(method, url, headers=sent, data=data, timeout=30, stream=True)
        if method == "HEAD":  # no body: its Content-Length is the blob's (a layer of a GB), not an answer's
            response.close()
            return response, b""
        what = f"registry {self.host} ({method} {urllib.parse.urlsplit(url).path[:120]})"
        if sink is not None and response.status_code == 200:  # a layer: into its file, from the start on every try
            sink.seek(0)
            sink.truncate()
            auth.copy_capped(response, limit, what, sink)
            return response, b""
        return response, auth.read_capped(response, limit, what)

    def _request(
        self,
        method: str,
        path: str,
        headers: dict[str, str] | None = None,
        data: bytes | Path | None = None,
        limit: int = MAX_MANIFEST_BYTES,
        sink: IO[bytes] | None = None,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """Status, headers (case-insensitive, as HTTP's are) and body (at most `limit` bytes; a
        successful body goes into `sink` instead, where one is given).

        Tried again as every download is (downloads.py's policy: its statuses, tries and backoff),
        by a loop of its own: a layer's body is read again from its file on each try, and an
        auth challenge is answered between tries, neither of which urllib3's retries can do."""
        url = path if path.startswith("http") else self.base + path
        last_error = ""
        for attempt in range(self.retries + 1):
            try:
                response, body = self._send(method, url, headers or {}, data, limit, sink)
                if response.status_code in (401, 403) and not same_origin(response.url or url, self.base):
                    # A redirect's target asked for credentials: they are the registry's, not its.
                    where = urllib.parse.urlsplit(response.url).netloc[:80]
                    raise UserError(
                        f"registry {self.host} redirected to {where}, which asked for credentials "
                        f"({response.status_code}); the registry's are not sent there"
                    )
                if response.status_code in (401, 403) and same_origin(url, self.base):
                    self._answer_challenge(response)
                    response, body = self._send(method, url, headers or {}, data, limit, sink)
                    if response.status_code in (401, 403):
                        raise self._refused(response.status_code)
                if response.status_code not in downloads.RETRIED_STATUSES:
                    return response.status_code, response.headers, body
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
        """The manifest under a tag or digest, checked: at most 4 MiB, a JSON manifest or index of
        a known type, its body hashing to the digest asked for and to `Docker-Content-Digest`."""
        status, headers, body = self._request("GET", f"{repository}/manifests/{reference}", {"Accept": MANIFEST_TYPES})
        if status == 404:
            return None
        what = f"registry {self.host}: {repository}:{reference[:80]}"
        if status != 200:
            raise UserError(f"{what}: answered {status}")
        digest = sha256_digest(body)
        said = headers.get("Docker-Content-Digest")
        if said is not None and said != digest:
            raise UserError(
                f"{what}: Docker-Content-Digest says {said[:80]}, the body hashes to {digest}; nothing was moved"
            )
        if DIGEST.fullmatch(reference) and reference != digest:
            raise UserError(f"{what}: the body hashes to {digest}, not the digest asked for; nothing was moved")
        document = json_object(body, what)
        media_type = headers.get("Content-Type", "").split(";")[0].strip() or str(document.get("mediaType", ""))
        if media_type not in IMAGE_TYPES | INDEX_TYPES:
            raise UserError(f"{what}: media type {media_type[:80]!r} is not a manifest or index; nothing was moved")
        check_manifest_shape(document, media_type, what)
        return Manifest(body, media_type, digest)

    def put_manifest(self, repository: str, reference: str, manifest: Manifest) -> str:
        said = self._put_manifest(repository, reference, manifest).get("Docker-Content-Digest", manifest.digest)
        if said != manifest.digest:
            raise UserError(
                f"registry {self.host}: stored {repository}:{reference[:80]} as {said[:80]}, but its bytes hash to "
                f"{manifest.digest}"
            )
        return manifest.digest

    def _put_manifest(self, repository: str, reference: str, manifest: Manifest) -> Mapping[str, str]:
        status, headers, body = self._request(
            "PUT", f"{repository}/manifests/{reference}", {"Content-Type": manifest.media_type}, manifest.body
        )
        if status not in (200, 201):
            raise UserError(
                f"registry {self.host} refused the manifest for {repository}:{reference} "
                f"({status}: {self.quoted(body)})"
            )
        return headers

    @staticmethod
    def is_digest(text: str) -> bool:
        return bool(DIGEST.fullmatch(text))

    def has_blob(self, repository: str, digest: str) -> bool:
        status, _, _ = self._request("HEAD", f"{repository}/blobs/{digest}")
        return status == 200

    def upload_blob(self, repository: str, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if not self.has_blob(repository, digest):
            self._upload(repository, digest, data)
        return digest

    def upload_blob_file(self, repository: str, path: Path, digest: str) -> None:
        """A blob from a file (a layer of a GB is never held in memory), `digest` its sha256 as
        its writer computed it; the registry checks it against the bytes it receives."""
        if not self.has_blob(repository, digest):
            self._upload(repository, digest, path)

    def _upload(self, repository: str, digest: str, data: bytes | Path) -> None:
        """A monolithic upload: POST for a location, then one PUT of the whole blob."""
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
            raise UserError(f"registry {self.host} did not store blob {digest[:19]} ({status})")

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
        self.put_referrer(repository, artifact, subject.digest, media_type, annotations)
        self.put_manifest(repository, reference, artifact)
        return artifact.digest

    def put_referrer(
        self, repository: str, artifact: Manifest, subject: str, artifact_type: str, annotations: dict[str, str]
    ) -> None:
        """A manifest whose `subject` is `subject`, put by its digest: a registry with the
        referrers API indexes it (and says so with OCI-Subject); for one without, the referrers
        tag schema's index (`sha256-<hex>`) is updated, as OCI 1.1 clients expect."""
        headers = self._put_manifest(repository, artifact.digest, artifact)
        if headers.get("OCI-Subject") != subject:
            self._add_to_referrers_tag(repository, subject, artifact, artifact_type, annotations)

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
        self._put_referrers_tag(repository, tag, entries)

    def _put_referrers_tag(self, repository: str, tag: str, entries: list[dict[str, Any]]) -> None:
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}
        self.put_manifest(repository, tag, Manifest.of(json.dumps(index, sort_keys=True).encode(), OCI_INDEX))

    def delete_manifest(self, repository: str, digest: str) -> None:
        """Delete a manifest by digest (with the tags on it); one that is already gone is fine."""
        if not DIGEST.fullmatch(digest):
            raise UserError(f"{digest[:80]!r} is not a sha256 digest; only a manifest's digest is deleted")
        status, _, _ = self._request("DELETE", f"{repository}/manifests/{digest}")
        if status == 405:
            raise UserError(
                f"registry {self.host} does not allow deleting manifests (405); turn deletion on "
                "(distribution: storage.delete.enabled) or delete them in its interface"
            )
        if status not in (200, 202, 404):
            raise UserError(f"registry {self.host}: deleting {repository}@{digest[:19]} answered {status}")

    def drop_from_referrers_tag(self, repository: str, subject: str, digests: set[str]) -> None:
        """Take deleted artifacts out of the subject's referrers tag, where the registry keeps
        one (a registry with the referrers API drops them itself)."""
        tag = self.referrers_tag(subject)
        current = self.manifest(repository, tag) if digests else None
        if current is None or current.media_type not in INDEX_TYPES:
            return
        listed = json.loads(current.body).get("manifests", [])
        kept = [entry for entry in listed if isinstance(entry, dict) and entry.get("digest") not in digests]
        if len(kept) != len(listed):
            self._put_referrers_tag(repository, tag, kept)

    def referrers(self, repository: str, subject: str, artifact_type: str | None = None) -> list[dict[str, Any]]:
        """The artifacts attached to `subject`: from the referrers API where the registry has it,
        else from the referrers tag. Each entry is checked: a descriptor with a sha256 digest."""
        status, _, body = self._request("GET", f"{repository}/referrers/{subject}", {"Accept": OCI_INDEX})
        what = f"registry {self.host}: the referrers of {subject[:19]}"
        if status == 200:
            document = json_object(body, what)
            check_manifest_shape(document, OCI_INDEX, what)
            manifests: list[dict[str, Any]] = document["manifests"]
        else:
            fallback = self.manifest(repository, self.referrers_tag(subject))
            if fallback is not None and fallback.media_type not in INDEX_TYPES:
                raise UserError(f"{what}: the referrers tag holds a {fallback.media_type}, not an index")
            manifests = json.loads(fallback.body)["manifests"] if fallback else []
        return [m for m in manifests if artifact_type is None or m.get("artifactType") == artifact_type]

    def attached(self, repository: str, subject: str) -> dict[str, str]:
        """artifactType -> digest of each artifact attached to `subject`."""
        return {str(m.get("artifactType")): str(m["digest"]) for m in self.referrers(repository, subject)}

    def blob(self, repository: str, digest: str, limit: int = MAX_BLOB_BYTES) -> bytes:
        """A blob, at most `limit` bytes, whose bytes hash to the digest asked for."""
        if not DIGEST.fullmatch(digest):
            raise UserError(f"registry {self.host}: {digest[:80]!r} is not a sha256 digest")
        status, _, body = self._request("GET", f"{repository}/blobs/{digest}", limit=limit)
        if status != 200:
            raise UserError(f"registry {self.host} has no blob {digest} in {repository}")
        if sha256_digest(body) != digest:
            raise UserError(
                f"registry {self.host}: blob {digest[:19]} hashes to {sha256_digest(body)[:19]}; nothing was moved"
            )
        return body

    def download_blob(self, repository: str, digest: str, target: Path, limit: int = MAX_LAYER_BYTES) -> None:
        """A blob (a layer of GBs) streamed into `target`, then checked against its digest; a blob
        that does not hash to it is removed and refused."""
        if not DIGEST.fullmatch(digest):
            raise UserError(f"registry {self.host}: {digest[:80]!r} is not a sha256 digest")
        try:
            with target.open("wb") as sink:
                status, _, _ = self._request("GET", f"{repository}/blobs/{digest}", limit=limit, sink=sink)
            if status != 200:
                raise UserError(f"registry {self.host} has no blob {digest} in {repository}")
            found = "sha256:" + sha256_file(target)
            if found != digest:
                raise UserError(f"registry {self.host}: blob {digest[:19]} hashes to {found[:19]}; nothing was moved")
        except UserError:
            target.unlink(missing_ok=True)
            raise

    def artifact_manifest(self, repository: str, digest: str) -> dict[str, Any]:
        """An artifact's manifest (subject, annotations, its one layer), checked to carry one document."""
        manifest = self.manifest(repository, digest)
        if manifest is None:
            raise UserError(f"registry {self.host} lists artifact {digest} but does not serve it")
        document: dict[str, Any] = json.loads(manifest.body)
        if manifest.media_type not in IMAGE_TYPES or len(document.get("layers", [])) != 1:
            raise UserError(f"registry {self.host}: artifact {digest[:19]} is not one document; nothing was moved")
        return document

    def artifact_document(
        self, repository: str, manifest: dict[str, Any], limit: int = MAX_BLOB_BYTES
    ) -> dict[str, Any]:
        """The JSON document an artifact manifest (as artifact_manifest read it) carries as its layer."""
        digest = str(manifest["layers"][0]["digest"])
        return json_object(self.blob(repository, digest, limit), f"registry {self.host}: artifact layer {digest[:19]}")

    def artifact(self, repository: str, digest: str, limit: int = MAX_BLOB_BYTES) -> dict[str, Any]:
        """The JSON document an artifact manifest carries as its one layer (an SBOM, a report)."""
        return self.artifact_document(repository, self.artifact_manifest(repository, digest), limit)
