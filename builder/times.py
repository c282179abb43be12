"""Times as images, labels and records write them."""

from __future__ import annotations

import datetime


def iso_utc(seconds: float) -> str:
    """Seconds since the epoch as an RFC 3339 UTC time to the second (2023-11-14T22:13:20Z)."""
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
