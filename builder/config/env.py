"""${VAR} references in matrix.yaml's find_links."""

from __future__ import annotations

import os
import re

from builder.config import grammar


def expand_env(text: str) -> str:
    """${VAR} and ${VAR:-default} in find_links, so a matrix can point at a site's wheel directory.

    Only the variables docs/custom-images.md names (grammar.ENV_VARIABLES) expand; the schema refuses any
    other, so a matrix cannot read the environment. Messages print the text as written, never
    the expanded value.
    """

    def value(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2) or ""
        return (os.environ.get(name) or default) if name in grammar.ENV_VARIABLES else match.group(0)

    return grammar.ENV_REFERENCE.sub(value, text)
