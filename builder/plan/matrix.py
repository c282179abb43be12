"""matrix.yaml: schema, validation with file:line errors, and expansion into cells.

Input problems are UserErrors naming file:line and field. A combination of the axes that
cannot work becomes a rejected cell with its reason (plan shows it, the rest build); the
same combination asked for explicitly by an include is an error.
"""

from __future__ import annotations

import itertools
import os
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from builder.errors import Location, UserError
from builder.facts.compat import TorchBuild, TorchWheels, TrtllmRelease, load_trtllm, version_key
from builder.plan.cell import BaseImage, Cell
from builder.spec import flavor as flavors
from builder.spec import grammar
from builder.spec.grammar import Grammar
from builder.spec.yamlsource import FieldPath, SourceMap, dotted, load

DEFAULT_MATRIX = Path("matrix.yaml")


def _field(grammar: Grammar) -> Any:
    return Field(pattern=f"^(?:{grammar.pattern})$")


# Pattern (as pydantic reports it) -> what to write instead, for error messages.
HINTS = {
    f"^(?:{g.pattern})$": g.hint
    for g in (
        grammar.VERSION, grammar.CUDA, grammar.NAME, grammar.DIGEST, grammar.URL, grammar.LOOPBACK,
        grammar.REGISTRY, grammar.REPOSITORY, grammar.RELATIVE_DIR, grammar.FIND_LINKS,
    )
}  # fmt: skip
Version = Annotated[str, _field(grammar.VERSION)]
Cuda = Annotated[str, _field(grammar.CUDA)]
Name = Annotated[str, _field(grammar.NAME)]
Digest = Annotated[str, _field(grammar.DIGEST)]
HttpUrl = Annotated[str, _field(grammar.URL)]
Loopback = Annotated[str, _field(grammar.LOOPBACK)]
RegistryHost = Annotated[str, _field(grammar.REGISTRY)]
Repository = Annotated[str, _field(grammar.REPOSITORY)]
RelativeDir = Annotated[str, _field(grammar.RELATIVE_DIR)]
FindLinks = Annotated[str, _field(grammar.FIND_LINKS)]


class Strict(BaseModel):
    # Python's re: the grammars use lookaheads, which pydantic's default (Rust) engine lacks.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, regex_engine="python-re")


class BootstrapSpec(Strict):
    tool: Literal["mmdebstrap", "debootstrap"] = "mmdebstrap"
    mirror: HttpUrl
    variant: Literal["minbase"] = "minbase"
    components: list[Name] = ["main"]


class BaseSpec(Strict):
    distro: Literal["debian", "ubuntu"]
    suite: Name
    glibc: Version
    python: Version
    image: Digest
    bootstrap: BootstrapSpec


class IndexSpec(Strict):
    url: HttpUrl | None = None
    extra_urls: list[HttpUrl] = []  # searched after url, for packages url does not have
    find_links: list[FindLinks] = []

    @property
    def urls(self) -> list[str]:
        return [*([self.url] if self.url else []), *self.extra_urls]


class Selector(Strict):
    torch: Version | None = None
    cuda: Cuda | None = None
    cudnn: Version | None = None
    python: Version | None = None
    base: Name | None = None
    flavor: Name | None = None
    index: Name | None = None
    trtllm: Version | None = None


class Axes(Strict):
    torch: Annotated[list[Version], Field(min_length=1)]
    cuda: list[Cuda] | None = None
    cudnn: list[Version] | None = None
    python: list[Version] | None = None
    base: Annotated[list[Name], Field(min_length=1)]
    flavor: Annotated[list[Name], Field(min_length=1)]


class AliasSpec(Strict):
    template: str
    where: Selector = Selector()


class WheelhouseSpec(Strict):
    listen: Loopback = "127.0.0.1:8741"


class MatrixSpec(Strict):
    registry: RegistryHost
    repository: Repository
    images: RelativeDir = "images"  # where render writes, relative to the matrix file
    tag: str
    aliases: list[AliasSpec] = []
    flagship: Selector
    source_date_epoch: Annotated[int, Field(ge=0, lt=2**32)]
    wheelhouse: WheelhouseSpec = WheelhouseSpec()
    bases: dict[Name, BaseSpec]
    indexes: dict[Name, IndexSpec]
    defaults: Selector = Selector()
    axes: Axes | None = None
    include: list[Selector] = []
    exclude: list[Selector] = []


@dataclass
class Rejected:
    """A combination of the axes that cannot work, and why."""

    name: str
    selector: dict[str, str]
    reason: str


@dataclass
class Matrix:
    """The validated, expanded matrix."""

    path: Path
    spec: MatrixSpec
    cells: list[Cell]
    rejected: list[Rejected] = field(default_factory=list)

    def cell(self, name: str) -> Cell:
        for cell in self.cells:
            if cell.name == name:
                return cell
        known = next((r for r in self.rejected if r.name == name), None)
        if known:
            raise UserError(f"cell {name} is rejected: {known.reason}")
        raise UserError(f"no cell named {name}; `python -m builder plan` lists them")

    def select(self, names: list[str]) -> list[Cell]:
        return [self.cell(name) for name in names]

    @property
    def flagship(self) -> Cell:
        return next(cell for cell in self.cells if cell.flagship)

    def index(self, name: str) -> IndexSpec:
        return self.spec.indexes[name]

    @property
    def images_dir(self) -> Path:
        """Where this matrix's generated files live: its `images:` folder beside the matrix file."""
        return images_folder(self.path, self.spec)


def images_folder(path: Path, spec: MatrixSpec) -> Path:
    return path.resolve().parent / spec.images


# ---------------------------------------------------------------- schema errors


def _schema_error(error: dict[str, Any], source: SourceMap) -> UserError:
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


def parse(path: Path) -> tuple[MatrixSpec, SourceMap]:
    data, source = load(path)
    if not isinstance(data, dict):
        raise UserError("the top level must be a mapping of keys (registry, bases, axes, ...)", Location(path, 1))
    try:
        spec = MatrixSpec.model_validate(data)
    except ValidationError as error:
        raise _schema_error(error.errors()[0], source) from None  # type: ignore[arg-type]
    _check_references(spec, source)
    return spec, source


def _check_references(spec: MatrixSpec, source: SourceMap) -> None:
    """Names used in axes, includes and defaults must be defined elsewhere in the file."""
    known_flavors = flavors.names()

    def check(where: FieldPath, kind: str, value: str | None, known: list[str]) -> None:
        if value is not None and value not in known:
            raise UserError(
                f"unknown {kind} '{value}'; use one of: {', '.join(known)}",
                source.location(where),
                dotted(where),
            )

    groups: list[tuple[FieldPath, Selector]] = [
        (("defaults",), spec.defaults),
        (("flagship",), spec.flagship),
    ]
    groups += [(("include", i), s) for i, s in enumerate(spec.include)]
    groups += [(("exclude", i), s) for i, s in enumerate(spec.exclude)]
    groups += [(("aliases", i, "where"), a.where) for i, a in enumerate(spec.aliases)]
    for where, selector in groups:
        check((*where, "base"), "base", selector.base, list(spec.bases))
        check((*where, "flavor"), "flavor", selector.flavor, known_flavors)
        check((*where, "index"), "index", selector.index, list(spec.indexes))
    if spec.axes:
        for i, base in enumerate(spec.axes.base):
            check(("axes", "base", i), "base", base, list(spec.bases))
        for i, name in enumerate(spec.axes.flavor):
            check(("axes", "flavor", i), "flavor", name, known_flavors)
    for i, entry in enumerate(spec.include):
        for required in ("torch", "base", "flavor"):
            if getattr(entry, required) is None:
                raise UserError(
                    f"an include names a whole cell; add {required}: ...",
                    source.location(("include", i)),
                    f"include[{i}]",
                )
    _check_template(("tag",), spec.tag, source)
    for i, alias in enumerate(spec.aliases):
        _check_template(("aliases", i, "template"), alias.template, source)


def _check_template(where: FieldPath, template: str, source: SourceMap) -> None:
    """A tag template is literal tag characters and named fields, nothing else."""

    def fail(message: str) -> UserError:
        return UserError(message, source.location(where), dotted(where))

    fields = ", ".join("{" + f + "}" for f in TEMPLATE_FIELDS)
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as error:
        raise fail(f"malformed template ({error}); write fields as {{torch}}, braces only around a field") from None
    for literal, field_name, format_spec, conversion in parts:
        bad = next((c for c in literal if not re.fullmatch(r"[A-Za-z0-9._-]", c)), None)
        if bad is not None:
            raise fail(f"{bad!r} cannot be part of a tag; use letters, digits, '.', '_', '-' and fields ({fields})")
        if field_name is None:
            continue
        if field_name == "" or field_name.isdigit():
            raise fail(f"a field needs a name, such as {{torch}}; use: {fields}")
        if field_name not in TEMPLATE_FIELDS:
            raise fail(f"unknown field {{{field_name}}}; use: {fields}")
        if format_spec or conversion:
            raise fail(f"{{{field_name}}} takes no format spec or conversion; write {{{field_name}}} alone")


TEMPLATE_FIELDS = (
    "torch", "torch_minor", "cuda", "cuda_tag", "cudnn", "cudnn_tag", "accel",
    "python", "glibc", "base", "flavor", "trtllm",
)  # fmt: skip


# ---------------------------------------------------------------- expansion


def _base_image(name: str, spec: BaseSpec) -> BaseImage:
    return BaseImage(
        name=name,
        distro=spec.distro,
        suite=spec.suite,
        glibc=spec.glibc,
        python=spec.python,
        image=spec.image,
        mirror=spec.bootstrap.mirror,
        bootstrap_tool=spec.bootstrap.tool,
        variant=spec.bootstrap.variant,
        components=tuple(spec.bootstrap.components),
    )


def _pick_build(selector: Selector, index: str, wheels: TorchWheels) -> TorchBuild | str:
    torch = selector.torch or ""
    builds = wheels.builds(index, torch)
    if not builds:
        return f"no torch {torch} on index '{index}' in data/torch_wheels.json; run `python -m builder compat refresh`"
    if selector.cuda is None:
        return next((b for b in builds if b.cuda != "cpu"), builds[0])
    matching = [b for b in builds if b.cuda == selector.cuda]
    if matching:
        return matching[0]
    actual = ", ".join(sorted({b.cuda for b in builds}))
    elsewhere = wheels.indexes_with(torch, selector.cuda)
    hint = (
        f"set index: {elsewhere[0]}"
        if elsewhere
        else f"add an index serving that variant (PyTorch's wheel index for cu{selector.cuda.replace('.', '')}) "
        "and set index:"
    )
    return f"torch {torch} on index '{index}' is built for CUDA {actual}, not {selector.cuda}; {hint}"


def _trtllm_reason(release: TrtllmRelease | None, version: str, build: TorchBuild, python: str, base: str) -> str:
    """Why TensorRT-LLM `version` cannot go on this torch build and Python ("" when it can)."""
    if release is None:
        return f"no data for TensorRT-LLM {version} in data/trtllm.json; run `python -m builder compat refresh`"
    if not release.supports_torch(build.version):
        return f"TensorRT-LLM {version} needs torch {release.torch}, the cell has {build.version}"
    if python not in release.pythons:
        return f"TensorRT-LLM {version} supports Python {', '.join(release.pythons)}; base {base} has {python}"
    if release.cuda_major and build.cuda_major != release.cuda_major:
        return (
            f"TensorRT-LLM {version} is built for CUDA {release.cuda_major}, torch {build.version} here is "
            f"CUDA {build.cuda}; use an index serving torch {build.public_version} for CUDA {release.cuda_major}"
        )
    return ""


def _resolve(
    selector: Selector,
    spec: MatrixSpec,
    wheels: TorchWheels,
    trtllm: dict[str, TrtllmRelease],
    origin: str,
    images_root: Path | None = None,
) -> Cell | str:
    """A cell from a complete selector, or the reason it cannot work."""
    base = _base_image(selector.base or "", spec.bases[selector.base or ""])
    python = selector.python or base.python
    if python != base.python:
        return f"base {base.name} provides Python {base.python}, not {python}"
    index = selector.index or spec.defaults.index or "pypi"
    if index not in spec.indexes:
        return f"index '{index}' is not defined under indexes:"
    picked = _pick_build(selector, index, wheels)
    if isinstance(picked, str):
        return picked
    build = picked
    if python not in build.glibc_floor:
        pythons = build.pythons
        span = f"{pythons[0]}-{pythons[-1]}" if pythons else "none"
        return f"torch {build.version} has no wheel for Python {python} (has {span})"
    floor = build.glibc_floor[python]
    if version_key(floor) > version_key(base.glibc):
        tag = f"manylinux_{floor.replace('.', '_')}"
        return f"torch {build.version}'s wheel needs glibc {floor} ({tag}), base {base.name} has {base.glibc}"
    cudnn = selector.cudnn
    if cudnn and build.cudnn is None:
        return f"torch {build.version} is a CPU build; it has no cuDNN to set"
    if cudnn and build.cudnn and version_key(cudnn) < version_key(build.cudnn):
        return f"cuDNN {cudnn} is below torch {build.version}'s pin {build.cudnn}; cuDNN may only be raised"
    flavor = flavors.load().flavors[selector.flavor or ""]
    if flavor.requires_cuda and build.cuda == "cpu":
        return f"the {flavor.name} flavor needs a CUDA build of torch, not {build.version}"
    if flavor.name == "trtllm":
        if not selector.trtllm:
            return "the trtllm flavor needs trtllm: <TensorRT-LLM version>"
        reason = _trtllm_reason(trtllm.get(selector.trtllm), selector.trtllm, build, python, base.name)
        if reason:
            return reason
    cell = Cell(
        name="",
        torch=build,
        base=base,
        flavor=flavor.name,
        python=python,
        index=index,
        cudnn=cudnn or build.cudnn,
        trtllm=selector.trtllm if flavor.name == "trtllm" else None,
        origin=origin,
        images_root=images_root,
    )
    return _named(cell, spec)


def _named(cell: Cell, spec: MatrixSpec) -> Cell:
    fields = cell.fields()
    name = f"{fields['torch']}-{fields['cuda_tag']}"
    if cell.cudnn_overridden:
        name += f"-cudnn{cell.cudnn}"
    name += f"-{cell.base.name}-{cell.flavor}"
    if cell.trtllm:
        name += f"{cell.trtllm}"
    flagship = _matches(spec.flagship, cell)
    aliases = [a.template.format(**fields) for a in spec.aliases if _matches(a.where, cell)]
    if flagship:
        aliases.append("latest")
    return Cell(
        **{
            **cell.__dict__,
            "name": name,
            "tag": spec.tag.format(**fields),
            "aliases": tuple(aliases),
            "flagship": flagship,
        }
    )


def _cell_values(cell: Cell) -> dict[str, str | None]:
    return {
        "torch": cell.torch.public_version,
        "cuda": cell.cuda,
        "cudnn": cell.cudnn,
        "python": cell.python,
        "base": cell.base.name,
        "flavor": cell.flavor,
        "index": cell.index,
        "trtllm": cell.trtllm,
    }


def _matches(selector: Selector, values: Cell | dict[str, str | None]) -> bool:
    known = _cell_values(values) if isinstance(values, Cell) else values
    return all(known.get(key) == wanted for key, wanted in selector.model_dump(exclude_none=True).items())


def _axis_selectors(spec: MatrixSpec) -> list[Selector]:
    if spec.axes is None:
        return []
    axes = spec.axes
    unset: list[str | None] = [None]
    combos = itertools.product(
        axes.torch, axes.cuda or unset, axes.cudnn or unset, axes.python or unset, axes.base, axes.flavor
    )
    defaults = spec.defaults.model_dump(exclude_none=True)
    return [
        Selector(
            **{
                **defaults,
                **{
                    k: v
                    for k, v in zip(("torch", "cuda", "cudnn", "python", "base", "flavor"), combo, strict=True)
                    if v
                },
            }
        )
        for combo in combos
    ]


def _provisional_name(selector: Selector) -> str:
    parts = [
        selector.torch,
        selector.cuda and (selector.cuda if selector.cuda == "cpu" else f"cu{selector.cuda}"),
    ]
    parts += [selector.cudnn and f"cudnn{selector.cudnn}", selector.python and f"py{selector.python}"]
    parts += [selector.base, selector.flavor]
    return "-".join(p for p in parts if p)


def expand(
    spec: MatrixSpec, source: SourceMap, wheels: TorchWheels, trtllm: dict[str, TrtllmRelease]
) -> tuple[list[Cell], list[Rejected]]:
    root = images_folder(source.path, spec)
    cells: list[Cell] = []
    rejected: list[Rejected] = []
    defaults = spec.defaults.model_dump(exclude_none=True)
    candidates: list[tuple[Selector, str, FieldPath]] = [(s, "axes", ("axes",)) for s in _axis_selectors(spec)]
    candidates += [
        (Selector(**{**defaults, **s.model_dump(exclude_none=True)}), "include", ("include", i))
        for i, s in enumerate(spec.include)
    ]
    seen: dict[str, FieldPath] = {}
    for selector, origin, where in candidates:
        result = _resolve(selector, spec, wheels, trtllm, origin, root)
        values = _cell_values(result) if isinstance(result, Cell) else selector.model_dump()
        if origin == "axes" and any(_matches(rule, values) for rule in spec.exclude):
            continue
        if isinstance(result, str):
            if origin == "include":
                raise UserError(f"this cell cannot work: {result}", source.location(where), dotted(where))
            rejected.append(Rejected(_provisional_name(selector), selector.model_dump(exclude_none=True), result))
            continue
        if result.name in seen:
            first = source.line(seen[result.name])
            raise UserError(
                f"cell {result.name} is already made by {dotted(seen[result.name])} (line {first}); remove one",
                source.location(where),
                dotted(where),
            )
        seen[result.name] = where
        cells.append(result)
    return cells, rejected


def _check_cells(cells: list[Cell], rejected: list[Rejected], spec: MatrixSpec, source: SourceMap) -> None:
    if not cells:
        reasons = "; ".join(f"{r.name}: {r.reason}" for r in rejected)
        raise UserError(
            "the matrix makes no buildable cell; add axes or include entries"
            + (f" that can work. Rejected: {reasons}" if reasons else ""),
            source.location(()),
        )
    flagships = [cell for cell in cells if cell.flagship]
    if len(flagships) != 1:
        found = ", ".join(c.name for c in flagships) or "none"
        raise UserError(
            f"must match exactly one buildable cell, matches {found}; name torch, cuda, base and flavor",
            source.location(("flagship",)),
            "flagship",
        )
    owners: dict[str, str] = {}
    for cell in cells:
        for tag in (cell.tag, *cell.aliases):
            if not grammar.TAG.matches(tag):
                where = ("tag",) if tag == cell.tag else ("aliases",)
                raise UserError(
                    f"cell {cell.name} gets the tag {tag!r}, which is not a valid tag: {grammar.TAG.hint}",
                    source.location(where),
                    dotted(where),
                )
            if tag in owners and owners[tag] != cell.name:
                where = ("aliases",) if tag != cell.tag else ("tag",)
                raise UserError(
                    f"cells {owners[tag]} and {cell.name} both get the tag '{tag}'; "
                    "add a field that tells them apart or narrow the alias with where:",
                    source.location(where),
                    dotted(where),
                )
            owners[tag] = cell.name


def expand_env(text: str) -> str:
    """${VAR} and ${VAR:-default} in find_links, so a matrix can point at a site's wheel directory.

    Only the variables the README names (grammar.ENV_VARIABLES) expand; the schema refuses any
    other, so a matrix cannot read the environment. Messages print the text as written, never
    the expanded value.
    """

    def value(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2) or ""
        return (os.environ.get(name) or default) if name in grammar.ENV_VARIABLES else match.group(0)

    return grammar.ENV_REFERENCE.sub(value, text)


def load_matrix(
    path: Path = DEFAULT_MATRIX, wheels: TorchWheels | None = None, trtllm: dict[str, TrtllmRelease] | None = None
) -> Matrix:
    spec, source = parse(path)
    cells, rejected = expand(spec, source, wheels or TorchWheels.load(), load_trtllm() if trtllm is None else trtllm)
    _check_cells(cells, rejected, spec, source)
    return Matrix(path=path, spec=spec, cells=cells, rejected=rejected)
