"""The one way the builder's data files are validated: pydantic models whose fields carry the
grammar of their kind (config/grammar.py), read from config/yamlsource.py's bounded YAML, and
their first error turned into one line with the file, line and field. matrix.yaml
(config/schema.py), data/flavors.yaml (config/flavor.py) and data/layout.yaml
(config/layout.py) all go through `validate`.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from builder.config import grammar
from builder.config.grammar import Grammar
from builder.config.yamlsource import FieldPath, SourceMap, dotted
from builder.errors import Location, UserError

Model = TypeVar("Model", bound=BaseModel)


def field(grammar: Grammar) -> Any:
    return Field(pattern=f"^(?:{grammar.pattern})$")


# Pattern (as pydantic reports it) -> what to write instead, for error messages: every grammar
# the module defines, so a new one never shows its regular expression to a user.
HINTS = {f"^(?:{g.pattern})$": g.hint for g in vars(grammar).values() if isinstance(g, grammar.Grammar)}
Version = Annotated[str, field(grammar.VERSION)]
Cuda = Annotated[str, field(grammar.CUDA)]
Name = Annotated[str, field(grammar.NAME)]
Digest = Annotated[str, field(grammar.DIGEST)]
HttpUrl = Annotated[str, field(grammar.URL)]
Loopback = Annotated[str, field(grammar.LOOPBACK)]
RegistryHost = Annotated[str, field(grammar.REGISTRY)]
Repository = Annotated[str, field(grammar.REPOSITORY)]
RelativeDir = Annotated[str, field(grammar.RELATIVE_DIR)]
FindLinks = Annotated[str, field(grammar.FIND_LINKS)]
Size = Annotated[str, field(grammar.SIZE)]
Sha256 = Annotated[str, field(grammar.SHA256)]
DebianPackage = Annotated[str, field(grammar.DEBIAN_PACKAGE)]
PlatformName = Annotated[str, field(grammar.PLATFORM)]
RunnerLabel = Annotated[str, field(grammar.RUNNER_LABEL)]
Requirement = Annotated[str, field(grammar.REQUIREMENT)]


class Strict(BaseModel):
    # Python's re: the grammars use lookaheads, which pydantic's default (Rust) engine lacks.
    # Each field's docstring is its description: the JSON schema editors read and the key table of
    # docs/custom-images.md come from it (`python -m harness.docs_tables`).
    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, regex_engine="python-re", use_attribute_docstrings=True
    )


def validate(model: type[Model], data: Any, source: SourceMap, what: str) -> Model:
    """`data` as `model`, or the first problem as one line: file:line, field, what to write."""
    if not isinstance(data, dict):
        raise UserError(f"the top level must be a mapping of keys ({what})", Location(source.path, 1))
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise schema_error(error.errors()[0], source) from None  # type: ignore[arg-type]


def schema_error(error: dict[str, Any], source: SourceMap) -> UserError:
    where: FieldPath = tuple(error["loc"])
    kind, field_name = error["type"], dotted(where)
    raw = source.raw.get(where)
    if kind == "extra_forbidden":
        return UserError(
            f"unknown key '{where[-1]}'; remove it or check its spelling", source.location(where), field_name
        )
    if kind == "missing":
        return UserError("is required and missing; add it", source.location(where[:-1]), field_name)
    if kind in ("string_type", "string_pattern_mismatch") and raw is not None:
        value = error.get("input")
        if isinstance(value, int | float) and not isinstance(value, bool):
            return UserError(
                f'{raw} is a number, not a version string; quote it: "{raw}"',
                source.location(where),
                field_name,
            )
    if kind == "string_pattern_mismatch":
        pattern = error.get("ctx", {}).get("pattern", "")
        expected = HINTS.get(pattern, f"text matching {pattern}")
        return UserError(
            f"{raw or error.get('input')!r} is not valid; write {expected}",
            source.location(where),
            field_name,
        )
    return UserError(f"{error['msg'].lower()} (got {raw or error.get('input')!r})", source.location(where), field_name)
