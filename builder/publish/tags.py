"""Names the builder derives from a cell's tag for the registry (the staging tag, a platform's
tag, the artifacts' tags), held to the registries' 128-character limit in one place.

An image's own tags are refused when too long (matrix validation leaves room for `-arm64` and
`-zstd`, and the staging tag refuses a run ID that does not fit): two images must never share a
name. An artifact's tag is only a second way to find what the referrers API already lists, so a
long one is shortened, with a hash of the whole name that keeps it apart from any other.
"""

from __future__ import annotations

import hashlib

from builder.errors import UserError

MAX_TAG = 128


def fitted(name: str) -> str:
    """`name`, or when longer than a tag may be, its start and a hash of the whole."""
    if len(name) <= MAX_TAG:
        return name
    return f"{name[: MAX_TAG - 13].rstrip('.-')}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"


def exact(name: str, what: str, hint: str) -> str:
    """`name` as it is, or one line saying it would not fit (never cut: it names an image)."""
    if len(name) > MAX_TAG:
        raise UserError(
            f"{what} {name[:60]}... would be {len(name)} characters, past the registries' {MAX_TAG}; {hint}"
        )
    return name
