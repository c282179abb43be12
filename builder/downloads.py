"""The one HTTP client every download goes through: the indexes' metadata, wheels, Debian's
indexes and .debs' keyrings. The registry client (oci/registry.py) retries by the same policy.

requests with urllib3's retries: a refused connection, a dropped one before the answer, and
the answers a busy server gives (429, 500, 502, 503, 504) are tried again with backoff, up to
RETRIES times. Proxy settings come from the environment as usual (`https_proxy`, `no_proxy`).
HTTPS is checked against the system's CA store, where a site adds its own CA (a proxy that
inspects TLS, say), not against the bundle requests ships; REQUESTS_CA_BUNDLE still overrides.
Errors are requests' exceptions, which are OSError, as the callers expect.
"""

from __future__ import annotations

import shutil
import ssl
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

RETRIES = 4
BACKOFF_S = 0.5  # 0.5, 1, 2, 4 s between tries
RETRIED_STATUSES = (429, 500, 502, 503, 504)
_local = threading.local()  # a session per thread: locks resolve cells in parallel


def system_ca_bundle() -> str | bool:
    """The system's CA store (where a site adds its own CA), not the bundle pip or requests ship."""
    paths = ssl.get_default_verify_paths()
    return next((p for p in (paths.cafile, paths.openssl_cafile) if p and Path(p).is_file()), True)


def session() -> requests.Session:
    if getattr(_local, "session", None) is None:
        retry = Retry(
            total=RETRIES,
            backoff_factor=BACKOFF_S,
            status_forcelist=RETRIED_STATUSES,
            allowed_methods=frozenset({"GET", "HEAD"}),
            raise_on_status=False,  # the last answer is returned, and raise_for_status says what it was
        )
        made = requests.Session()
        made.verify = system_ca_bundle()
        adapter = HTTPAdapter(max_retries=retry)
        made.mount("http://", adapter)
        made.mount("https://", adapter)
        _local.session = made
    current: requests.Session = _local.session
    return current


def get(url: str, headers: dict[str, str] | None = None, timeout: float = 60) -> bytes:
    """The whole body of a GET, after retries; an HTTP error status raises (an OSError)."""
    response = session().get(url, headers=headers or {}, timeout=timeout)
    response.raise_for_status()
    return response.content


@contextmanager
def stream(url: str, headers: dict[str, str] | None = None, timeout: float = 120) -> Iterator[requests.Response]:
    """A GET whose body is read in pieces (`iter_content`): for files of gigabytes."""
    response = session().get(url, headers=headers or {}, timeout=timeout, stream=True)
    try:
        response.raise_for_status()
        yield response
    finally:
        response.close()


def local_path(url: str) -> Path | None:
    """The file a file:// URL names (local wheel directories, mirrors and tests); None for any other URL.
    The one place that reads such URLs, so every reader agrees on what they name."""
    return Path(urllib.request.url2pathname(url.removeprefix("file://"))) if url.startswith("file://") else None


class TooLarge(OSError):
    """A body longer than the most its reader takes: the download stops there."""


def download(url: str, target: Path, timeout: float = 120, most: int | None = None) -> None:
    """Write the body of `url` to `target` (a file:// URL is copied: local mirrors and tests),
    stopping with TooLarge past `most` bytes: a server cannot fill the disk with a pinned file."""
    local = local_path(url)
    if local is not None:
        if most is not None and local.stat().st_size > most:
            raise TooLarge(f"{url} has more than {most} bytes")
        shutil.copyfile(local, target)
        return
    written = 0
    with stream(url, timeout=timeout) as response, target.open("wb") as sink:
        for chunk in response.iter_content(1 << 20):
            written += len(chunk)
            if most is not None and written > most:
                raise TooLarge(f"{url} sent more than {most} bytes")
            sink.write(chunk)
