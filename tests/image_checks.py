"""Checks the integration tests run on built images, kept apart so that unit tests can show
each one catches what it is for (tests/unit/test_image_checks.py).

- duplicated_libraries: a shared library stored twice (same bytes in two inodes), or a CUDA
  library present in two different builds (a CUDA base image plus the wheels, say);
- host_only_certificates and find_in_layers: a certificate the host trusts beyond the image's
  own CA bundle, searched for in every file of every layer of the image (a file added in one
  layer and deleted in the next is still in the pushed image).
"""

from __future__ import annotations

import base64
import re
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

import docker


def library_listing(root: str = "/") -> str:
    """A shell command printing "inode sha256 path" for every shared library over 64 KiB under
    root (one file system), to run in the image."""
    return (
        f"find {root} -xdev -type f -name 'lib*.so*' -size +64k -exec sh -c 'for f; do "
        'echo $(stat -c %i "$f") $(sha256sum "$f" | cut -c1-64) "$f"; done\' _ {} + 2>/dev/null'
    )


CUDA_LIBRARIES = ("libcudart.so", "libcudnn.so", "libcublas.so", "libnccl.so", "libcufft.so", "libcusparse.so")


def duplicated_libraries(listing: str) -> list[str]:
    """What is wrong in a library_listing() output (empty when nothing is)."""
    inodes: dict[str, set[str]] = {}
    paths: dict[str, list[str]] = {}
    for line in listing.splitlines():
        if not line.strip():
            continue
        inode, digest, path = line.split(" ", 2)
        inodes.setdefault(digest, set()).add(inode)
        paths.setdefault(digest, []).append(path)
    problems = [
        f"identical bytes stored {len(found)} times: {', '.join(sorted(paths[digest]))}"
        for digest, found in inodes.items()
        if len(found) > 1
    ]
    for library in CUDA_LIBRARIES:
        builds = {digest for digest, names in paths.items() if any(Path(p).name.startswith(library) for p in names)}
        if len(builds) > 1:
            where = sorted(p for d in builds for p in paths[d])
            problems.append(f"{library} in {len(builds)} different builds: {', '.join(where)}")
    return problems


def library_names(listing: str) -> set[str]:
    return {Path(line.split(" ", 2)[2]).name for line in listing.splitlines() if line.strip()}


# ---------------------------------------------------------------- certificates

PEM = re.compile(rb"-----BEGIN CERTIFICATE-----\s+(.+?)\s+-----END CERTIFICATE-----", re.S)


def certificates(bundle: bytes) -> set[bytes]:
    """The DER bytes of every PEM certificate in a bundle."""
    return {base64.b64decode(b"".join(match.group(1).split())) for match in PEM.finditer(bundle)}


def host_only_certificates(host_bundle: bytes, image_bundle: bytes, host_public: bytes = b"") -> set[bytes]:
    """Certificates the host trusts that are neither in the image's own bundle nor among the
    host distro's public CAs (`host_public`): a site's own CAs, such as a proxy's, which
    update-ca-certificates adds from /usr/local/share/ca-certificates. Public CAs are taken
    out because a newer distro in the image may have dropped some that the host's older bundle
    still has (Ubuntu 24.04's bundle dropped TrustCor, E-Tugra and Hongkong Post Root CA 1,
    while pip's vendored certifi still carries one of them): those are not a leak."""
    return certificates(host_bundle) - certificates(image_bundle) - certificates(host_public)


def needles(der_certificates: Iterable[bytes]) -> list[bytes]:
    """Byte strings that betray a certificate in a file, PEM or DER: a run from the middle of its
    DER bytes, and the base64 line a PEM file of it would hold at the same place."""
    found = []
    for der in der_certificates:
        middle = len(der) // 2 - (len(der) // 2) % 3
        found.append(der[middle : middle + 48])
        pem = base64.b64encode(der)
        start = (len(pem) // 2) // 64 * 64  # a whole 64-character line of the PEM text
        found.append(pem[start : start + 64])
    return found


def _layers(engine: docker.DockerClient, image: str) -> Iterator[tuple[str, IO[bytes]]]:
    """(layer name, layer tar stream) of every layer of a `docker save` of the image, streamed."""
    chunks = engine.images.get(image).save(chunk_size=1 << 20)

    class Stream:
        def __init__(self) -> None:
            self.pending = b""

        def read(self, size: int = -1) -> bytes:
            while size < 0 or len(self.pending) < size:
                try:
                    self.pending += next(chunks)
                except StopIteration:
                    break
            data, self.pending = (self.pending, b"") if size < 0 else (self.pending[:size], self.pending[size:])
            return data

    with tarfile.open(fileobj=Stream(), mode="r|") as archive:  # type: ignore[call-overload]
        for member in archive:
            if member.isfile() and member.name.endswith("layer.tar"):
                handle = archive.extractfile(member)
                if handle is not None:
                    yield member.name, handle


def find_in_layers(engine: docker.DockerClient, image: str, patterns: list[bytes]) -> list[str]:
    """`layer: path` for every file of every layer that holds one of the byte strings."""
    overlap = max((len(p) for p in patterns), default=0)
    found = []
    for layer, handle in _layers(engine, image):
        with tarfile.open(fileobj=handle, mode="r|") as entries:
            for entry in entries:
                if not entry.isfile():
                    continue
                source = entries.extractfile(entry)
                if source is None:
                    continue
                tail = b""
                while chunk := source.read(1 << 20):
                    window = tail + chunk
                    if any(p in window for p in patterns):
                        found.append(f"{layer}: {entry.name}")
                        break
                    tail = window[-overlap:] if overlap else b""
    return found
