"""How the torch stack is laid out in an image (data/layout.yaml): layers by package group,
and the paths removed from them, each with its reason."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated

from pydantic import Field

from builder import paths
from builder.config import flavor, grammar, validated, yamlsource
from builder.errors import UserError

LAYOUT_FILE = paths.DATA / "layout.yaml"
REST = "rest"


@dataclass(frozen=True)
class Group:
    name: str
    why: str
    packages: tuple[str, ...]  # fnmatch patterns


@dataclass(frozen=True)
class DpkgRule:
    """Paths dpkg does not unpack (path-exclude), with exceptions (path-include)."""

    exclude: tuple[str, ...]  # absolute path globs
    keep: tuple[str, ...] = ()
    kept_by: tuple[str, ...] = ()  # flavors whose own layer installs these files again

    def lines(self) -> list[str]:
        return [f"path-exclude={p}" for p in self.exclude] + [f"path-include={p}" for p in self.keep]


@dataclass(frozen=True)
class Layout:
    groups: tuple[Group, ...]
    prune: tuple[str, ...]  # glob patterns under site-packages
    rules: tuple[DpkgRule, ...] = ()

    @property
    def dpkg(self) -> tuple[str, ...]:
        """Every dpkg.cfg line (path-exclude=..., path-include=...): what the shared system layer
        leaves out, in every flavor."""
        return tuple(line for rule in self.rules for line in rule.lines())

    def rules_for(self, flavor: str | None) -> tuple[DpkgRule, ...]:
        """The rules in force in an image of this flavor once its own layer has restored what it
        keeps; for the base (flavor None), the rules no flavor restores: a restore reinstalls
        packages from the image's own repository, which holds the base's files only as they are."""
        return tuple(r for r in self.rules if (flavor not in r.kept_by if flavor is not None else not r.kept_by))

    def dpkg_for(self, flavor: str | None) -> tuple[str, ...]:
        """The dpkg.cfg lines of rules_for(flavor)."""
        return tuple(line for rule in self.rules_for(flavor) for line in rule.lines())

    def restored_by(self, flavor: str) -> tuple[str, ...]:
        """The exclude globs whose files this flavor's own layer installs again."""
        return tuple(glob for rule in self.rules if flavor in rule.kept_by for glob in rule.exclude)

    def split(self, packages: list[str]) -> list[tuple[str, list[str]]]:
        """The lock's packages by layer, in install order; groups without a package are left out."""
        layers: dict[str, list[str]] = {group.name: [] for group in self.groups}
        layers[REST] = []
        for name in sorted(packages):
            group = next((g for g in self.groups if any(fnmatch.fnmatchcase(name, p) for p in g.packages)), None)
            layers[group.name if group else REST].append(name)
        return [(name, members) for name, members in layers.items() if members]


def leaves_out(rules: tuple[DpkgRule, ...], path: str) -> bool:
    """Whether dpkg, under these rules, leaves `path` out: an exclude glob matches it and no
    include glob does (fnmatch, where `*` also matches `/`, as dpkg matches)."""
    excluded = any(fnmatch.fnmatchcase(path, glob) for rule in rules for glob in rule.exclude)
    return excluded and not any(fnmatch.fnmatchcase(path, glob) for rule in rules for glob in rule.keep)


PackagePattern = Annotated[str, validated.field(grammar.PACKAGE_PATTERN)]
PrunePath = Annotated[str, validated.field(grammar.PRUNE_PATH)]
DpkgPath = Annotated[str, validated.field(grammar.DPKG_PATH)]
Reason = Annotated[str, validated.field(grammar.REASON)]


class GroupSpec(validated.Strict):
    name: validated.Name
    why: Reason
    packages: Annotated[list[PackagePattern], Field(min_length=1)]


class PruneSpec(validated.Strict):
    paths: Annotated[list[PrunePath], Field(min_length=1)]
    why: Reason


class DpkgSpec(validated.Strict):
    exclude: Annotated[list[DpkgPath], Field(min_length=1)]
    keep: list[DpkgPath] = []
    why: Reason
    kept_by: list[validated.Name] = []


class LayoutFile(validated.Strict):
    layers: list[GroupSpec]
    prune: list[PruneSpec]
    dpkg: list[DpkgSpec] = []


def _checked(spec: LayoutFile, source: yamlsource.SourceMap) -> Layout:
    """What the schema cannot say alone: `rest` is the catch-all layer's name, and kept_by names flavors."""
    for i, group in enumerate(spec.layers):
        if group.name == REST:
            where: yamlsource.FieldPath = ("layers", i, "name")
            raise UserError(f"`{REST}` is the layer of every package no group names; pick another name",
                            source.location(where), yamlsource.dotted(where))  # fmt: skip
    known = set(flavor.load().flavors)
    for i, rule in enumerate(spec.dpkg):
        for j, name in enumerate(rule.kept_by):
            if name not in known:
                where = ("dpkg", i, "kept_by", j)
                raise UserError(f"{name!r} is not a flavor; write one of {sorted(known)}",
                                source.location(where), yamlsource.dotted(where))  # fmt: skip
    groups = tuple(Group(g.name, g.why, tuple(g.packages)) for g in spec.layers)
    prune = tuple(path for entry in spec.prune for path in entry.paths)
    rules = tuple(DpkgRule(tuple(r.exclude), tuple(r.keep), tuple(r.kept_by)) for r in spec.dpkg)
    return Layout(groups, prune, rules)


@cache
def load(path: Path = LAYOUT_FILE) -> Layout:
    data, source = yamlsource.load(path, "data/layout.yaml ships with the builder")
    return _checked(validated.validate(LayoutFile, data, source, "layers, prune, dpkg"), source)
