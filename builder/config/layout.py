"""How the torch stack is laid out in an image (data/layout.yaml): layers by package group,
and the paths removed from them, each with its reason."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from builder import paths
from builder.config import flavor, grammar, yamlsource
from builder.errors import UserError

LAYOUT_FILE = paths.DATA / "layout.yaml"
REST = "rest"
# Package-name patterns: a normalized name with `*` wildcards.
PACKAGE_PATTERN = re.compile(r"[a-z0-9*][a-z0-9.*_-]*")
# Paths under site-packages: safe characters and globs, no `..`, not absolute.
PRUNE_PATH = re.compile(r"(?!/)(?!.*(^|/)\.\.(/|$))[A-Za-z0-9_.*/+-]+")
# dpkg path-exclude globs: absolute, safe characters, no `..`.
DPKG_PATH = re.compile(r"/(?!.*(^|/)\.\.(/|$))[A-Za-z0-9_.*/+-]+")


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


def _fail(path: Path, where: str, message: str) -> UserError:
    return UserError(message, path, where)


def _strings(path: Path, where: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise _fail(path, where, "must be a non-empty list of strings")
    return value


def _checked(path: Path, data: Any) -> Layout:
    if not isinstance(data, dict) or set(data) - {"dpkg"} != {"layers", "prune"}:
        raise _fail(path, "", "must hold `layers:` and `prune:`, and may hold `dpkg:`")
    groups = []
    for i, entry in enumerate(data["layers"] or []):
        where = f"layers[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"name", "why", "packages"}:
            raise _fail(path, where, "each layer has exactly name, why and packages")
        if not grammar.NAME.matches(str(entry["name"])) or entry["name"] == REST:
            raise _fail(path, f"{where}.name", f"is not {grammar.NAME.hint} (and not `{REST}`)")
        for pattern in _strings(path, f"{where}.packages", entry["packages"]):
            if not PACKAGE_PATTERN.fullmatch(pattern):
                raise _fail(path, f"{where}.packages", f"{pattern!r} is not a package name pattern such as nvidia-*")
        groups.append(Group(entry["name"], str(entry["why"]), tuple(entry["packages"])))
    prune: list[str] = []
    for i, entry in enumerate(data["prune"] or []):
        where = f"prune[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"paths", "why"} or not str(entry["why"]).strip():
            raise _fail(path, where, "each removal has exactly paths and why (the reason)")
        for pattern in _strings(path, f"{where}.paths", entry["paths"]):
            if not PRUNE_PATH.fullmatch(pattern):
                raise _fail(path, f"{where}.paths", f"{pattern!r} is not a path under site-packages such as triton/x")
            prune.append(pattern)
    return Layout(tuple(groups), tuple(prune), tuple(_dpkg_rules(path, data.get("dpkg") or [])))


def _dpkg_rules(path: Path, entries: list[Any]) -> list[DpkgRule]:
    rules = []
    flavors = set(flavor.load().flavors)
    for i, entry in enumerate(entries):
        where = f"dpkg[{i}]"
        if not isinstance(entry, dict) or not {"exclude", "why"} <= set(entry) <= {"exclude", "keep", "why", "kept_by"}:
            raise _fail(path, where, "each entry has exclude and why (the reason), and may have keep and kept_by")
        globs: dict[str, tuple[str, ...]] = {}
        for key in ("exclude", "keep"):
            globs[key] = tuple(_strings(path, f"{where}.{key}", entry[key]) if key in entry else [])
            for pattern in globs[key]:
                if not DPKG_PATH.fullmatch(pattern):
                    raise _fail(
                        path, f"{where}.{key}", f"{pattern!r} is not an absolute path glob such as /usr/share/doc/*"
                    )
        kept_by = tuple(_strings(path, f"{where}.kept_by", entry["kept_by"]) if "kept_by" in entry else [])
        for name in kept_by:
            if name not in flavors:
                raise _fail(path, f"{where}.kept_by", f"{name!r} is not a flavor; write one of {sorted(flavors)}")
        rules.append(DpkgRule(globs["exclude"], globs["keep"], kept_by))
    return rules


@cache
def load(path: Path = LAYOUT_FILE) -> Layout:
    data, _ = yamlsource.load(path, "data/layout.yaml ships with the builder")
    return _checked(path, data)
