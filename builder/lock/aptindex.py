"""Where each locked Debian package lives in its archive, and its sha256, from the archive's
signed index.

`lock` pins `package=version`; to keep a package like a wheel (fetched once, checked, served
from the cache, still there when the mirror has moved on) it also needs the file's path in the
archive and its sha256. Both come from the suite's Packages index, which is checked against the
SHA256 the suite's InRelease lists, whose signature gpgv checks against the archive's keyring
(Debian's from the host's debian-archive-keyring, Ubuntu's from the base's pinned keyring
package). Indexes are cached by their sha256, so locking many cells of one base reads each once.
"""

from __future__ import annotations

import email.utils
import io
import lzma
import subprocess
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from debian import deb822

from builder import downloads, paths
from builder.engine import bases, debfile
from builder.errors import UserError
from builder.plan.cell import BaseImage

DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")


@dataclass(frozen=True)
class ArchiveFile:
    path: str  # under the mirror's root: pool/main/g/gcc-12/gcc-12_12.2.0-14_amd64.deb
    sha256: str
    source: str = ""  # "" the release's mirror, "security" the security archive (BaseImage.mirror_of)


Index = dict[str, ArchiveFile]  # "package=version" -> its file


def _download(url: str, target: Path) -> None:
    try:
        downloads.download(url, target)
    except OSError as error:
        raise UserError(f"could not fetch {url} ({getattr(error, 'reason', error)}); check the base's mirror") from None


def _keyring(base: BaseImage, scratch: Path) -> Path:
    if base.keyring is not None:
        return bases.keyring_file(base.keyring, scratch)
    if not DEBIAN_KEYRING.is_file():
        raise UserError(
            f"{DEBIAN_KEYRING} is missing: apt-get install debian-archive-keyring, or give base {base.name} a keyring"
        )
    return DEBIAN_KEYRING


# Ubuntu's security indexes state no Valid-Until, so one must be dated within this: the archive
# publishes daily, and an older index is a stale mirror. Debian's state one (7 days ahead) while
# the suite is maintained and drop it when the suite is archived at its end of life (bullseye's,
# dated 2026-09-12, has none): a signed Debian index without it is a frozen suite, not a stale copy.
SECURITY_INDEX_MAX_AGE_S = 7 * 86400


def signed_release(
    base: BaseImage, suite: str, scratch: Path, mirror: str | None = None, age_limited: bool = False
) -> str:
    """The suite's Release text, after gpgv checked InRelease's signature, and, where it says
    until when it is valid (security archives do), that it still is: a mirror that stopped
    updating would otherwise read as "no new fixes"."""
    mirror = mirror or base.mirror
    signed = scratch / f"{suite}.InRelease"
    _download(f"{mirror}/dists/{suite}/InRelease", signed)
    keyring = _keyring(base, scratch)
    result = subprocess.run(
        ["gpgv", "--keyring", str(keyring), "--output", "-", str(signed)], capture_output=True, check=False
    )
    if result.returncode != 0:
        raise UserError(f"{mirror}/dists/{suite}/InRelease: its signature does not verify with {keyring}")
    release = result.stdout.decode()
    check_valid_until(
        release, f"{mirror}/dists/{suite}/InRelease", max_age_s=SECURITY_INDEX_MAX_AGE_S if age_limited else None
    )
    return release


def check_valid_until(release: str, where: str, now: float | None = None, max_age_s: float | None = None) -> None:
    """Refuse a signed Release whose Valid-Until has passed (one line, with the date); one that
    states none, with `max_age_s`, when its Date is older than that, or it has no Date."""
    stanza = deb822.Release(release)
    text = stanza.get("Valid-Until")
    now = time.time() if now is None else now
    if not text and max_age_s is not None:
        dated = stanza.get("Date")
        try:
            age = now - email.utils.parsedate_to_datetime(dated).timestamp() if dated else None
        except (TypeError, ValueError):
            age = None
        if age is None:
            raise UserError(f"{where}: states neither Valid-Until nor a readable Date; cannot tell whether it is stale")
        if age > max_age_s:
            raise UserError(
                f"{where} is dated {dated} ({age / 86400:.0f} days ago) and states no Valid-Until: a security index "
                f"older than {max_age_s / 86400:.0f} days is a stale mirror; use another mirror"
            )
        return
    if not text:
        return
    try:
        until = email.utils.parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError):
        raise UserError(f"{where}: Valid-Until {text[:60]!r} is not a date") from None
    if now > until:
        raise UserError(f"{where} expired on {text} (Valid-Until): the mirror is stale; use another mirror")


def listed_sha256(release: str, name: str) -> str | None:
    """The sha256 a Release file lists for one of its index files (main/binary-amd64/Packages.xz)."""
    section = release.split("\nSHA256:\n", 1)[-1]
    for line in section.splitlines():
        if not line.startswith(" "):
            break
        fields = line.split()
        if len(fields) == 3 and fields[2] == name:
            return fields[0]
    return None


def packages_file(base: BaseImage, suite: str, component: str, release: str, mirror: str | None = None) -> Path:
    """The component's Packages.xz for the base's architecture, from the cache or the mirror,
    checked against the sha256 the signed Release lists."""
    mirror = mirror or base.mirror
    name = f"{component}/binary-{base.arch}/Packages.xz"
    expected = listed_sha256(release, name)
    if expected is None:
        raise UserError(f"{mirror} {suite} lists no {name}; check the base's suite, components and platform")
    cached = paths.cache_dir("apt-indexes") / expected / "Packages.xz"
    url = f"{mirror}/dists/{suite}/{name}"
    return debfile.fetch(url, expected, cached, "its signed Release says", "; check the base's mirror")


def parse_packages(text: str, source: str = "") -> Index:
    """`package=version` -> file, for every stanza of a Packages index."""
    found: Index = {}
    for stanza in deb822.Packages.iter_paragraphs(io.StringIO(text), use_apt_pkg=False):
        found[f"{stanza['Package']}={stanza['Version']}"] = ArchiveFile(stanza["Filename"], stanza["SHA256"], source)
    return found


def archive_index(base: BaseImage) -> Index:
    """Every package the base's suites and components offer for its architecture, the security
    archive's included. A package in several suites (jammy and jammy-updates) has the same file
    in each: one pool per mirror; one the release mirror also has is taken from there."""
    found: Index = {}
    with tempfile.TemporaryDirectory(prefix="torch-images-apt-") as scratch:
        Path(scratch).chmod(0o755)
        if base.security is not None and base.security[0] != base.mirror:
            found.update(_suite_packages(base, base.security[0], base.security[1], Path(scratch), "security"))
        for suite in (base.suite, *base.extra_suites):
            found.update(_suite_packages(base, base.mirror, suite, Path(scratch), ""))
    return found


def _suite_packages(base: BaseImage, mirror: str, suite: str, scratch: Path, source: str) -> Index:
    found: Index = {}
    release = signed_release(base, suite, scratch, mirror, age_limited=is_age_limited(base, suite, source))
    for component in base.components:
        if source and listed_sha256(release, f"{component}/binary-{base.arch}/Packages.xz") is None:
            continue  # a security suite may carry fewer components than the release
        with lzma.open(packages_file(base, suite, component, release, mirror)) as xz:
            found.update(parse_packages(xz.read().decode(), source))
    return found


def is_age_limited(base: BaseImage, suite: str, source: str) -> bool:
    """Ubuntu's security suites state no Valid-Until, so their Date is held to
    SECURITY_INDEX_MAX_AGE_S: the security archive read as such, and a `-security` suite read
    among the base's own (jammy-security in `extra_suites`), alike."""
    return base.distro == "ubuntu" and (bool(source) or suite.endswith("-security"))


def suite_index(base: BaseImage, mirror: str, suite: str) -> Index:
    """Every package one suite of a mirror offers for the base's architecture (a security
    archive, say), from its signed index."""
    with tempfile.TemporaryDirectory(prefix="torch-images-apt-") as scratch:
        Path(scratch).chmod(0o755)
        return _suite_packages(base, mirror, suite, Path(scratch), "security")


def files_of(index: Index, pins: Iterable[str], base: BaseImage) -> dict[str, ArchiveFile]:
    """Each pin's file; a pin the archive no longer serves is one line saying to lock again."""
    files = {}
    for pin in pins:
        if pin not in index:
            raise UserError(
                f"{pin} is not in {base.mirror} {base.suite} ({base.arch}) any more; "
                "lock again from a fresh base (remove the engine's torch-images/base images)"
            )
        files[pin] = index[pin]
    return files
