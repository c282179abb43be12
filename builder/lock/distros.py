"""New distro releases, noticed from their archives' signed indexes: Debian's current stable (its
`stable` suite's codename) and Ubuntu's newest released LTS (from the distro-info-data package
in the updates of the matrix's newest Ubuntu base: Ubuntu updates it in every supported release
when a release is named, and the archive lists no folder of suites). For one that no base
names, a base is proposed with the glibc, Python and keyring package its own index lists, each
read through the chain apt trusts: InRelease checked by gpgv with the matrix's keyring for that
distro, then each file by the sha256 the signed index gives it."""

from __future__ import annotations

import csv
import io
import lzma
import re
import tempfile
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from debian import deb822

from builder import paths
from builder.engine import debfile
from builder.errors import UserError
from builder.lock import aptindex
from builder.plan.cell import BaseImage

KEYRING_PACKAGE = {"debian": "debian-archive-keyring", "ubuntu": "ubuntu-keyring"}
KEYRING_FILE = {"debian": "usr/share/keyrings/debian-archive-keyring.gpg",
                "ubuntu": "usr/share/keyrings/ubuntu-archive-keyring.gpg"}  # fmt: skip
UBUNTU_CSV = "usr/share/distro-info/ubuntu.csv"
MAX_CSV_BYTES = 64 << 10  # Ubuntu's whole history is about 4 KB


@dataclass(frozen=True)
class Release:
    """A distro release as its archive names it."""

    distro: str
    codename: str
    version: str  # "26.04", "13.8"


@dataclass(frozen=True)
class ProposedBase:
    """A base for a release no base names, as its own signed index describes it."""

    release: Release
    glibc: str
    python: str
    keyring_deb: str  # URL of the archive keyring package, by its pool path
    keyring_sha256: str
    template: BaseImage  # the matrix's base of the same distro, whose bootstrap it follows

    def yaml(self) -> str:
        """The base's entry for matrix.yaml's `bases:`, after the template base's bootstrap."""
        old, new = self.template.suite, self.release.codename
        lines = [
            f"  {new}:",
            f"    distro: {self.release.distro}",
            f"    suite: {new}",
            f'    glibc: "{self.glibc}"',
            f'    python: "{self.python}"',
            "    bootstrap:",
            f"      tool: {self.template.bootstrap_tool}",
            f'      mirror: "{self.template.mirror}"',
            f"      components: [{', '.join(self.template.components)}]",
        ]
        if self.template.extra_suites:
            suites = [suite.replace(old, new, 1) for suite in self.template.extra_suites]
            lines.append(f"      extra_suites: [{', '.join(suites)}]")
        if self.template.include:
            lines.append(f"      include: [{', '.join(self.template.include)}]")
        if self.template.hooks:
            lines.append(f"      hooks: [{', '.join(self.template.hooks)}]")
        if self.template.keyring is not None:
            lines += [
                "      keyring:",
                f'        deb: "{self.keyring_deb}"',
                f"        sha256: {self.keyring_sha256}",
                f"        file: {KEYRING_FILE[self.release.distro]}",
            ]
        if self.template.security is not None:
            mirror, suite = self.template.security
            lines.append(f'      security: {{mirror: "{mirror}", suite: {suite.replace(old, new, 1)}}}')
        return "\n".join(lines)


def newest_release(template: BaseImage, today: date | None = None) -> Release:
    """The distro's release a team would move to: Debian's stable, Ubuntu's newest LTS out today."""
    if template.distro == "debian":
        release = _signed_release(template, "stable")
        return Release("debian", _field(release, "Codename", template), _field(release, "Version", template))
    return newest_lts(_ubuntu_csv(template), today or date.today())


def newest_lts(table: str, today: date) -> Release:
    """The newest LTS in distro-info-data's ubuntu.csv whose release date has come."""
    found = []
    for row in csv.DictReader(io.StringIO(table)):
        version, codename, released = row.get("version", ""), row.get("series", ""), row.get("release", "")
        if "LTS" not in version or not re.fullmatch(r"[a-z]+", codename):
            continue
        try:
            if date.fromisoformat(released) <= today:
                found.append(Release("ubuntu", codename, version.split()[0]))
        except ValueError:
            continue
    if not found:
        raise UserError("Ubuntu's distro-info-data lists no LTS release that has come out; is the archive Ubuntu's?")
    return max(found, key=lambda release: tuple(int(p) for p in re.findall(r"\d+", release.version)))


def propose(template: BaseImage, release: Release) -> ProposedBase:
    """A base for `release`: its glibc, Python and keyring package from its own main component."""
    packages = _main_packages(template, release.codename)
    keyring = _newest(packages, KEYRING_PACKAGE[release.distro])
    if keyring is None:
        raise UserError(f"{template.mirror} {release.codename}: main lists no {KEYRING_PACKAGE[release.distro]}")
    return ProposedBase(
        release,
        glibc=_upstream_minor(packages, "libc6", template, release),
        python=_upstream_minor(packages, "python3", template, release),
        keyring_deb=f"{template.mirror}/{keyring[1].path}",
        keyring_sha256=keyring[1].sha256,
        template=template,
    )


def _upstream_minor(packages: aptindex.Index, name: str, template: BaseImage, release: Release) -> str:
    """2.43 of libc6's 2.43-0ubuntu3, 3.14 of python3's 3.14.2-1."""
    found = _newest(packages, name)
    match = re.match(r"(?:\d+:)?(\d+\.\d+)", found[0]) if found else None
    if match is None:
        raise UserError(f"{template.mirror} {release.codename}: main lists no {name} with a version like 2.43")
    return match.group(1)


def _newest(packages: aptindex.Index, name: str) -> tuple[str, aptindex.ArchiveFile] | None:
    """The version and file of `name` in an index (the one listed last, where a suite lists two)."""
    found = [(pin.split("=", 1)[1], file) for pin, file in packages.items() if pin.split("=", 1)[0] == name]
    return found[-1] if found else None


def _signed_release(template: BaseImage, suite: str) -> str:
    with tempfile.TemporaryDirectory(prefix="torch-images-release-") as scratch:
        Path(scratch).chmod(0o755)
        return aptindex.signed_release(template, suite, Path(scratch))


def _field(release: str, name: str, template: BaseImage) -> str:
    value = str(deb822.Release(release).get(name, ""))
    if not re.fullmatch(r"[a-z0-9][a-z0-9.+-]{0,40}", value):
        raise UserError(f"{template.mirror}: its signed Release states no usable {name} ({value[:40]!r})")
    return value


def _main_packages(template: BaseImage, suite: str) -> aptindex.Index:
    """The suite's main Packages for the template's architecture, read as `lock` reads it: from the
    file the signed Release names by its sha256 (aptindex)."""
    release = _signed_release(template, suite)
    with lzma.open(aptindex.packages_file(template, suite, "main", release)) as xz:
        return aptindex.parse_packages(xz.read().decode())


def _ubuntu_csv(template: BaseImage) -> str:
    """ubuntu.csv of the distro-info-data package in the template's `-updates` suite (its release
    suite where it names none)."""
    updates = f"{template.suite}-updates"
    suite = updates if updates in template.extra_suites else template.suite
    found = _newest(_main_packages(template, suite), "distro-info-data")
    if found is None:
        raise UserError(f"{template.mirror} {suite}: main lists no distro-info-data")
    sha256 = found[1].sha256
    cached = paths.cache_dir("debs") / sha256 / "distro-info-data.deb"
    deb = debfile.fetch(f"{template.mirror}/{found[1].path}", sha256, cached, "its signed Packages says")
    root = debfile.unpacked(deb, cached.parent / "root", sha256)
    table = root / UBUNTU_CSV
    if table.is_symlink() or not table.is_file() or table.stat().st_size > MAX_CSV_BYTES:
        raise UserError(f"{deb.name}: has no {UBUNTU_CSV} of at most {MAX_CSV_BYTES} bytes")
    return table.read_text()
