"""Content digests: of files, read in chunks (wheels and layers are too large to hold in memory),
and the one serialisation of a JSON document whose digest names it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def sha256_file(path: Path) -> str:
    """The file's sha256, as hex digits."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def canonical_json(document: dict[str, Any]) -> bytes:
    """A config or manifest serialised one way only: its sha256 is the image ID or manifest digest."""
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
