"""Registry credentials, found the way docker finds them, and bearer tokens, asked for the way
the distribution spec's token authentication describes (Docker Hub, GHCR, Quay, Harbor, GitLab
and ECR use it).

Everything here is read from places the builder does not control: the docker config file, a
credential helper's output, a registry's challenge and a token service's answer. Each is
checked for its shape and size before use; a problem is one line naming the file and key (or
the host), never the secret. The basic credentials go only to a token service held to the
registry's own TLS rule: HTTPS, or plain HTTP on a loopback address (or the registry's own host
when it was allowed plain HTTP with --insecure-registry).

This replaces oras-py, whose private attributes the client used to read (issue 26).
"""

from __future__ import annotations

import base64
import binascii
import io
import ipaddress
import json
import os
import re
import shutil
import socket
import subprocess
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import requests

from builder import jsonread
from builder.errors import UserError

USER_VARIABLE, PASSWORD_VARIABLE = "TORCH_IMAGES_REGISTRY_USER", "TORCH_IMAGES_REGISTRY_PASSWORD"
HOST_VARIABLE = "TORCH_IMAGES_REGISTRY_HOST"  # the registry those two are for (default: the matrix's)
MAX_CONFIG_BYTES = 1 << 20  # a docker config is a few hundred bytes
MAX_HELPER_BYTES = 1 << 20
MAX_TOKEN_ANSWER_BYTES = 1 << 20  # a token answer is a few kilobytes (a JWT)
HELPER_TIMEOUT_S = 60
HELPER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
TOKEN = re.compile(r"[\x21-\x7e]{1,65536}")  # printable, no space: it goes into a header as it is


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)
    source: str  # where they came from, for messages: never the secret itself


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


# ---------------------------------------------------------------- the docker config


def docker_config_path(environ: os._Environ[str] | dict[str, str] = os.environ) -> Path:
    """The file docker reads: $DOCKER_CONFIG/config.json, else ~/.docker/config.json."""
    return Path(environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"


def _config_document(config: Path) -> dict[str, Any]:
    try:
        with config.open("rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise UserError(f"{config}: cannot read ({error.strerror}); fix or move it") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise UserError(f"{config}: larger than {MAX_CONFIG_BYTES // 1024} KiB; not a docker config file")
    try:
        document = jsonread.loads(data, "it")
    except UserError as error:
        raise UserError(f"{config}: not a docker config file ({error.message}); fix or move it") from None
    if not isinstance(document, dict):
        raise UserError(f"{config}: not a docker config file (its top level is not an object); fix or move it")
    return document


def _mapping(config: Path, document: dict[str, Any], key: str) -> dict[str, Any]:
    value = document.get(key, {})
    if not isinstance(value, dict):
        raise UserError(f"{config}: {key} must be an object of registry hosts; fix it or run `docker login` again")
    return value


def _host_key(key: str) -> str:
    """A config key as the host it names: docker also writes `https://host/v1/` forms."""
    return urllib.parse.urlsplit(key if "//" in key else f"//{key}").netloc or key


def _lookup(table: dict[str, Any], host: str) -> tuple[str, Any] | None:
    for key, value in table.items():
        if key == host or _host_key(key) == host:
            return key, value
    return None


def _inline(config: Path, key: str, entry: object) -> Credentials | None:
    """`auths.<host>.auth`: base64 of `user:password`."""
    if not isinstance(entry, dict):
        raise UserError(f"{config}: auths.{key} must be an object; run `docker login {_host_key(key)}` again")
    encoded = entry.get("auth")
    if encoded in (None, ""):
        return None
    where = f"{config}: auths.{key}.auth"
    if not isinstance(encoded, str):
        raise UserError(f"{where} must be a string (base64 of user:password); run `docker login` again")
    try:
        pair = base64.b64decode(encoded, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise UserError(f"{where} is not base64 of user:password; run `docker login {_host_key(key)}` again") from None
    username, colon, password = pair.partition(":")
    if not colon or not username:
        raise UserError(f"{where} holds no user:password pair; run `docker login {_host_key(key)}` again")
    return Credentials(username, password, f"{config} auths")


def _from_helper(config: Path, key: str, helper: object, host: str) -> Credentials | None:
    """Ask `docker-credential-<helper> get` for the host (docker's credential helper protocol)."""
    if not isinstance(helper, str) or not HELPER_NAME.fullmatch(helper):
        raise UserError(f"{config}: {key} must name a credential helper (letters, digits, '.', '_', '-')")
    program = shutil.which(f"docker-credential-{helper}")
    if program is None:
        raise UserError(
            f"{config} names the credential helper {helper!r} for {host}, but docker-credential-{helper} "
            "is not on PATH; install it or run `docker login` again"
        )
    try:
        result = subprocess.run(
            [program, "get"], input=host.encode(), capture_output=True, timeout=HELPER_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise UserError(
            f"{config}: {key}: docker-credential-{helper} did not answer ({error.__class__.__name__})"
        ) from None
    if result.returncode != 0:
        if b"credentials not found" in result.stdout.lower() + result.stderr.lower():
            return None
        raise UserError(f"{config}: {key}: docker-credential-{helper} failed (exit {result.returncode}) for {host}")
    answer: object = None
    if len(result.stdout) <= MAX_HELPER_BYTES:
        try:
            answer = json.loads(result.stdout)
        except (ValueError, UnicodeDecodeError):
            answer = None
    username = answer.get("Username") if isinstance(answer, dict) else None
    secret = answer.get("Secret") if isinstance(answer, dict) else None
    if not isinstance(username, str) or not isinstance(secret, str) or not secret:
        # The output may hold the secret: it is described, never printed.
        raise UserError(
            f"{config}: {key}: docker-credential-{helper} answered for {host} with something other than a JSON "
            'object of "Username" and "Secret" strings; check the helper, or run `docker login` again'
        )
    return Credentials(username, secret, f"{config} {key}")


def docker_config_credentials(host: str, config: Path) -> Credentials | None:
    """Credentials for `host` as docker finds them in its config: the host's `credHelpers` entry;
    else, where `credsStore` is set, that store alone (docker then ignores an inline `auths` entry:
    the store's answer, empty when it has none, overwrites it); else the inline `auths` entry."""
    if not config.is_file():
        return None
    document = _config_document(config)
    helpers, auths = _mapping(config, document, "credHelpers"), _mapping(config, document, "auths")
    store = document.get("credsStore")
    if store is not None and not isinstance(store, str):
        raise UserError(f"{config}: credsStore must be the name of a credential helper; fix it")
    named = _lookup(helpers, host)
    if named is not None:
        return _from_helper(config, f"credHelpers.{named[0]} ({named[1]})", named[1], host)
    if store:
        return _from_helper(config, f"credsStore ({store})", store, host)
    inline = _lookup(auths, host)
    return _inline(config, inline[0], inline[1]) if inline is not None else None


def find_credentials(
    host: str, environ: os._Environ[str] | dict[str, str] = os.environ, configured: str | None = None
) -> Credentials | None:
    """Docker's config first (its entries name their registry), then TORCH_IMAGES_REGISTRY_USER
    and _PASSWORD, which belong to one registry: TORCH_IMAGES_REGISTRY_HOST where set, else the
    one the matrix (or --registry) configures. Another host never gets them: `verify` of someone
    else's image must not hand it the team's push credentials."""
    # docker writes Docker Hub's login under index.docker.io, whichever name the image used
    found = docker_config_credentials("index.docker.io" if host in ("docker.io", "registry-1.docker.io") else host,
                                      docker_config_path(environ))  # fmt: skip
    if found:
        return found
    owner = environ.get(HOST_VARIABLE) or configured
    if environ.get(USER_VARIABLE) and owner == host:
        return Credentials(environ[USER_VARIABLE], environ.get(PASSWORD_VARIABLE, ""), USER_VARIABLE)
    return None


# ---------------------------------------------------------------- bearer tokens

CHALLENGE_PARAMETER = re.compile(r'\s*([A-Za-z][A-Za-z0-9_-]*)\s*=\s*"([^"\\]*)"\s*(?:,|$)')


def challenge_parameters(header: str) -> dict[str, str]:
    """The parameters of a `Bearer realm="...",service="...",scope="..."` challenge."""
    rest = header.strip()[len("bearer") :]
    found: dict[str, str] = {}
    position = 0
    while position < len(rest):
        match = CHALLENGE_PARAMETER.match(rest, position)
        if match is None:
            break
        found.setdefault(match.group(1).lower(), match.group(2))
        position = match.end()
    return found


def token_service(realm: str, registry_host: str, registry_plain: bool, insecure: bool) -> str:
    """The realm a registry named, if the basic credentials may go there: held to the registry's
    own TLS rule (HTTPS, or plain HTTP on loopback, or on the registry's own host with --insecure-registry)."""
    parts = urllib.parse.urlsplit(realm)
    if parts.scheme not in ("http", "https") or not parts.hostname or not realm.isprintable():
        raise UserError(f"registry {registry_host} names a token service {realm[:100]!r} that is not an http(s) URL")
    if parts.scheme == "http":
        same_host = (
            insecure and registry_plain and parts.hostname == urllib.parse.urlsplit(f"//{registry_host}").hostname
        )
        if not (is_loopback(parts.netloc) or same_host):
            raise UserError(
                f"registry {registry_host} names a token service over plain HTTP on another host ({parts.netloc}); "
                "credentials go to a token service over HTTPS only: fix the registry's token realm"
            )
    return realm


def fetch_token(
    session: requests.Session, realm: str, parameters: dict[str, str], credentials: Credentials | None, host: str
) -> str | None:
    """A token from the token service (None when it refuses the credentials)."""
    query = {key: parameters[key] for key in ("service", "scope") if parameters.get(key)}
    auth = (credentials.username, credentials.password) if credentials else None
    try:
        response = session.get(realm, params=query, auth=auth, timeout=30, stream=True, allow_redirects=False)
        body = read_capped(response, MAX_TOKEN_ANSWER_BYTES, f"the token service of {host}")
    except requests.exceptions.SSLError as error:
        raise UserError(
            f"the token service of {host}: its TLS certificate is not trusted ({error.__class__.__name__})"
        ) from None
    except requests.exceptions.RequestException as error:
        raise UserError(f"the token service of {host} did not answer ({error.__class__.__name__})") from None
    if response.status_code in (401, 403):
        return None
    if response.status_code != 200:
        raise UserError(f"the token service of {host} answered {response.status_code}")
    try:
        answer = jsonread.loads(body, "the token service's answer")
    except UserError:
        answer = None
    token = (answer.get("token") or answer.get("access_token")) if isinstance(answer, dict) else None
    if not isinstance(token, str) or not TOKEN.fullmatch(token):
        raise UserError(f"the token service of {host} answered something that is not a token ({len(body)} bytes)")
    return token


def copy_capped(response: requests.Response, limit: int, what: str, sink: IO[bytes]) -> None:
    """A response's body into `sink`, refused once it passes `limit` bytes."""
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > limit:
        response.close()
        raise UserError(f"{what} answered {int(declared)} bytes, more than the {limit} such an answer may hold")
    size = 0
    for chunk in response.iter_content(1 << 16):
        size += len(chunk)
        if size > limit:
            response.close()
            raise UserError(f"{what} answered more than the {limit} bytes such an answer may hold")
        sink.write(chunk)


def read_capped(response: requests.Response, limit: int, what: str) -> bytes:
    """A response's body, refused once it passes `limit` bytes (read in pieces, never whole)."""
    body = io.BytesIO()
    copy_capped(response, limit, what, body)
    return body.getvalue()
