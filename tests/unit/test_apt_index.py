"""The Debian index `lock` reads is checked: InRelease's signature with gpgv, then Packages.xz
against the sha256 the signed Release lists. A tampered InRelease, one signed by another key, and
a Packages.xz that does not match are each refused with one line, with a real key and gpgv."""

from __future__ import annotations

import dataclasses
import hashlib
import lzma
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.errors import UserError
from builder.lock import aptindex
from builder.plan.matrix import load_matrix
from tests.conftest import FIXTURES

PACKAGES = (
    "Package: alpha\nVersion: 1.0-1\nArchitecture: amd64\nFilename: pool/main/a/alpha/alpha_1.0-1_amd64.deb\n"
    f"SHA256: {'a' * 64}\n\n"
)


def _gpg(home: Path, *args: str, data: bytes | None = None) -> bytes:
    return subprocess.run(
        ["gpg", "--homedir", str(home), "--batch", "--yes", "--pinentry-mode", "loopback", "--passphrase", "", *args],
        input=data, capture_output=True, check=True,
    ).stdout  # fmt: skip


HOMES: list[Path] = []  # each key's gpg home: its agent is stopped when the test ends


@pytest.fixture(autouse=True)
def stop_gpg_agents() -> Iterator[None]:
    yield
    while HOMES:
        subprocess.run(["gpgconf", "--homedir", str(HOMES.pop()), "--kill", "gpg-agent"], check=False)


def _key(home: Path, name: str) -> Path:
    """A fresh signing key in its own home, and its public keyring as gpgv reads it."""
    home.mkdir(mode=0o700)
    HOMES.append(home)
    _gpg(home, "--quick-generate-key", f"{name} <{name}@example.org>", "ed25519", "sign", "1d")
    keyring = home / "keyring.gpg"
    keyring.write_bytes(_gpg(home, "--export", f"{name}@example.org"))
    return keyring


@pytest.fixture
def mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, object]:
    """A file:// mirror of one suite whose InRelease the archive's (test) key signs."""
    archive_home = tmp_path / "archive-gpg"
    keyring = _key(archive_home, "archive")
    monkeypatch.setattr(aptindex, "DEBIAN_KEYRING", keyring)
    monkeypatch.setenv("TORCH_IMAGES_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "mirror"
    index = root / "dists/bookworm/main/binary-amd64/Packages.xz"
    index.parent.mkdir(parents=True)
    index.write_bytes(lzma.compress(PACKAGES.encode()))
    release = (
        "Origin: Test\nSuite: bookworm\nSHA256:\n"
        f" {hashlib.sha256(index.read_bytes()).hexdigest()} {index.stat().st_size} main/binary-amd64/Packages.xz\n"
    )
    (root / "dists/bookworm/InRelease").write_bytes(_gpg(archive_home, "--clearsign", data=release.encode()))
    base = load_matrix(FIXTURES / "multiarch.yaml").cells[0].base
    base = dataclasses.replace(
        base, mirror=root.as_uri(), suite="bookworm", extra_suites=(), components=("main",), keyring=None, arch="amd64"
    )
    return root, archive_home, base


def test_a_signed_index_is_read_and_its_files_found(mirror: tuple[Path, Path, object]) -> None:
    _, _, base = mirror
    index = aptindex.archive_index(base)  # type: ignore[arg-type]
    assert index == {"alpha=1.0-1": aptindex.ArchiveFile("pool/main/a/alpha/alpha_1.0-1_amd64.deb", "a" * 64)}


def test_a_tampered_inrelease_is_refused(mirror: tuple[Path, Path, object]) -> None:
    root, _, base = mirror
    signed = root / "dists/bookworm/InRelease"
    signed.write_bytes(signed.read_bytes().replace(b"Origin: Test", b"Origin: Evil"))
    with pytest.raises(UserError, match="InRelease: its signature does not verify"):
        aptindex.archive_index(base)  # type: ignore[arg-type]


def test_an_inrelease_signed_by_another_key_is_refused(mirror: tuple[Path, Path, object], tmp_path: Path) -> None:
    root, _, base = mirror
    other = tmp_path / "other-gpg"
    _key(other, "other")
    signed = root / "dists/bookworm/InRelease"
    text = _gpg(other, "--decrypt", data=signed.read_bytes()) if False else None  # noqa: F841 (the body is re-signed below)
    release = subprocess.run(
        ["gpgv", "--keyring", str(aptindex.DEBIAN_KEYRING), "--output", "-", str(signed)],
        capture_output=True,
        check=True,
    ).stdout
    signed.write_bytes(_gpg(other, "--clearsign", data=release))
    with pytest.raises(UserError, match="InRelease: its signature does not verify"):
        aptindex.archive_index(base)  # type: ignore[arg-type]


def test_a_packages_index_that_does_not_match_its_signed_sha256_is_refused(mirror: tuple[Path, Path, object]) -> None:
    root, _, base = mirror
    index = root / "dists/bookworm/main/binary-amd64/Packages.xz"
    index.write_bytes(lzma.compress(PACKAGES.replace("a" * 64, "b" * 64).encode()))
    with pytest.raises(UserError) as refused:
        aptindex.archive_index(base)  # type: ignore[arg-type]
    line = refused.value.line()
    assert "main/binary-amd64/Packages.xz has sha256" in line and "its signed Release says" in line
    assert not any((Path(os.environ["TORCH_IMAGES_CACHE"]) / "apt-indexes").rglob("Packages.xz"))  # not cached
