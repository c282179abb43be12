"""The grammar of every value that can reach a Dockerfile, in one place.

matrix.yaml, data/flavors.yaml and the lock files arrive through pull requests. Each value
taken from them is checked against the strict grammar of its kind before it is used, and
the templates refuse any value with a line break or control character as a last line of
defence (see render.py). Each pattern comes with what to write instead, for error messages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Grammar:
    pattern: str
    hint: str  # what to write instead, completing "write ..."

    def matches(self, value: str) -> bool:
        return re.fullmatch(self.pattern, value) is not None


VERSION = Grammar(r"[0-9]+(\.[0-9]+)+", 'a version such as "2.15.0"')
CUDA = Grammar(r"cpu|[0-9]+\.[0-9]+", 'a CUDA version such as "12.8", or "cpu"')
NAME = Grammar(r"[a-z0-9][a-z0-9._-]{0,62}", "a lower-case name (letters, digits, '.', '_', '-')")
DIGEST = Grammar(
    r"[a-z0-9][a-z0-9./:_-]{0,200}@sha256:[0-9a-f]{64}", "an image pinned by digest: name:tag@sha256:<64 hex>"
)
# Host names, IPv4 or [IPv6], an optional port, and a path of safe characters: nothing a
# shell, a Dockerfile or an HTML page gives meaning to.
URL = Grammar(
    r"https?://([A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*|\[[0-9A-Fa-f:]+\])(:[0-9]{1,5})?(/[A-Za-z0-9._~%/+-]*)?",
    "an http:// or https:// URL (host, optional port and path; no spaces, quotes or query)",
)
LOOPBACK = Grammar(r"127\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}:[0-9]{1,5}", 'a loopback address such as "127.0.0.1:8741"')
REGISTRY = Grammar(
    r"([a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*|\[[0-9a-f:]+\])(:[0-9]{1,5})?",
    'a registry host with an optional port, such as "ghcr.io" or "127.0.0.1:5000"',
)
# OCI distribution spec: repository path components, and tags.
REPOSITORY = Grammar(
    r"[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*",
    'a repository path such as "torch" or "ml/torch" (lower case, digits, separators . _ - /)',
)
# Where CI publishes: a registry host, optionally with the repository path under it.
REGISTRY_REF = Grammar(
    f"({REGISTRY.pattern})(/{REPOSITORY.pattern})?",
    'a registry, optionally with a repository: "ghcr.io/acme/torch", "harbor.example.com/ml/torch" or "127.0.0.1:5000"',
)
TAG = Grammar(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}", "at most 128 of A-Z a-z 0-9 _ . - (not starting with . or -)")
# A CI runner label (GitHub's runs-on, GitLab's tags): plain name characters, nothing a workflow
# or a shell reads as syntax.
# A repository is never `.` or `..` (`actions/..` would name the owner's folder in a `uses:` path).
ACTION = Grammar(
    r"[A-Za-z0-9][A-Za-z0-9-]{0,38}/(?!\.{1,2}$)[A-Za-z0-9._-]{1,100}", "a GitHub action as owner/repository"
)
ACTION_VERSION = Grammar(r"v[0-9]+(\.[0-9]+){0,2}", "a release tag such as v4.2.2")
COMMIT = Grammar(r"[0-9a-f]{40}", "a commit: 40 lower-case hex digits (a tag can be moved; a commit cannot)")
RUNNER_LABEL = Grammar(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", "a runner label such as self-hosted or gpu")
# A relative folder inside the project: no absolute paths, no `..`.
RELATIVE_DIR = Grammar(
    r"(?!\.\.?(/|$))[A-Za-z0-9_][A-Za-z0-9._-]*(/(?!\.\.?(/|$))[A-Za-z0-9_][A-Za-z0-9._-]*)*",
    'a folder relative to the matrix file, such as "images" (no "..", no leading "/")',
)
# Debian policy: package names, and [epoch:]upstream[-revision] versions.
DEBIAN_PACKAGE = Grammar(r"[a-z0-9][a-z0-9+.-]+", "a Debian package name such as python3-dev")
DEBIAN_PIN = Grammar(
    r"[a-z0-9][a-z0-9+.-]+=([0-9]+:)?[0-9][A-Za-z0-9.+~-]*", "package=version, such as libc6-dev=2.36-9+deb12u14"
)
DEBIAN_VERSION = Grammar(r"([0-9]+:)?[0-9][A-Za-z0-9.+~-]*", "a Debian version such as 0.4.1-6")
# A program's file name in a package's usr/bin (no folder).
PROGRAM_NAME = Grammar(r"[A-Za-z0-9][A-Za-z0-9+._-]{0,63}", "a program's file name such as soci or qemu-x86_64")
DEBIAN_ARCHITECTURE = Grammar(r"amd64|arm64", 'a Debian architecture: "amd64" or "arm64"')
# A .deb's path in a Debian or Ubuntu archive, as its Packages index names it (Filename:).
DEBIAN_POOL_PATH = Grammar(
    # `%` only as the archive escapes an epoch's colon (`%3a`): an escaped dot or slash could climb.
    r"pool/(?!.*\.\.)(?!.*%(?!3[aA]))[A-Za-z0-9+._~-]+(/[A-Za-z0-9+._~%-]+)*\.deb",
    "an archive path such as pool/main/g/gcc-12/gcc-12_12.2.0-14_amd64.deb",
)
# PEP 503 normalized names and PEP 440 public or local versions, as a lock writes them.
PYTHON_NAME = Grammar(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", "a Python project name (PEP 508)")
PYTHON_VERSION = Grammar(
    r"([0-9]+!)?[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?(\+[a-z0-9]+(\.[a-z0-9]+)*)?",
    "a PEP 440 version such as 2.15.0 or 2.13.0+cpu",
)
# A Python requirement template, as data/flavors.yaml writes them: a name, extras, a specifier,
# and {fields} the torch wheel's pins fill in; nothing a resolver or a shell gives other meaning.
REQUIREMENT = Grammar(r"[A-Za-z0-9_.\[\]{}~=<>!,-]+", "a requirement such as numpy or ninja==1.11 (fields in braces)")
# data/layout.yaml: package-name patterns (a normalized name with `*`), paths under site-packages
# (safe characters and globs, relative, no `..`), dpkg path globs (absolute, no `..`), and the
# reason every entry gives.
PACKAGE_PATTERN = Grammar(r"[a-z0-9*][a-z0-9.*_-]*", "a package name pattern such as nvidia-*")
PRUNE_PATH = Grammar(r"(?!/)(?!.*(^|/)\.\.(/|$))[A-Za-z0-9_.*/+-]+", "a path under site-packages such as triton/x")
DPKG_PATH = Grammar(r"/(?!.*(^|/)\.\.(/|$))[A-Za-z0-9_.*/+-]+", "an absolute path glob such as /usr/share/doc/*")
VULNERABILITY = Grammar(r"[A-Za-z][A-Za-z0-9]*-[A-Za-z0-9._:-]{2,80}", "an advisory ID such as CVE-2025-1234")
# An advisory vex.yaml may name: never a distribution's suite (bookworm-security), which a Debian
# finding names in place of an advisory and which would cover every fix of a package.
VEX_VULNERABILITY = Grammar(
    r"(?![A-Za-z]+-(security|updates|backports|proposed)$)[A-Za-z][A-Za-z0-9]*-[A-Za-z0-9._:-]{2,80}",
    "an advisory ID such as GHSA-cpwx-vrp4-4pq7 or CVE-2025-1234 (not a suite such as bookworm-security)",
)
CELL_PATTERN = Grammar(r"[a-z0-9*?][a-z0-9.*?_-]{0,127}", "a cell name or pattern such as 2.13.0-*")
# One line of plain text: it reaches scanners' reports, pull requests and terminals.
IMPACT = Grammar(r"[^\x00-\x1f\x7f-\x9f]{10,500}", "one line of 10 to 500 plain characters: why it does not apply")
REASON = Grammar(r"\s*\S[\s\S]*", "a reason (why: what the entry is for)")
PLATFORM = Grammar(r"linux/(amd64|arm64)", 'a platform: "linux/amd64" or "linux/arm64"')
SHA256 = Grammar(r"[0-9a-f]{64}", "64 lower-case hex digits")
MEDIA_TYPE = Grammar(r"[a-z0-9][a-z0-9.+_-]{0,62}/[a-z0-9][a-z0-9.+_-]{0,126}", "a media type such as application/json")
BUILD_ID = Grammar(r"[0-9a-f]{32}", "32 lower-case hex digits (a build ID)")
# Image and layer sizes in decimal units, as `docker images` prints them.
SIZE = Grammar(r"[0-9]+(\.[0-9]+)? ?(MB|GB)", 'a size such as "5.6 GB" or "800 MB"')


def size_bytes(text: str) -> int:
    """A SIZE in bytes (decimal units: 1 GB = 10^9 bytes)."""
    number, unit = re.fullmatch(r"([0-9.]+) ?(MB|GB)", text).groups()  # type: ignore[union-attr]
    return round(float(number) * (10**9 if unit == "GB" else 10**6))


# Variables a matrix may expand in find_links, as docs/custom-images.md names them.
ENV_VARIABLES = ("TORCH_WHEEL_DIR", "TRTLLM_WHEEL_DIR")
ENV_REFERENCE = re.compile(r"\$\{(\w+)(?::-([^}$]*))?\}")
FIND_LINKS = Grammar(
    r"([A-Za-z0-9_./~+-]|\$\{(" + "|".join(ENV_VARIABLES) + r")(:-[A-Za-z0-9_./~+-]*)?\})+",
    "a directory path; it may use ${TORCH_WHEEL_DIR} or ${TRTLLM_WHEEL_DIR} (optionally ${VAR:-default}) and "
    "no other variable",
)
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
