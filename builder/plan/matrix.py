"""The plan: matrix.yaml's spec joined with the wheels' facts into cells, each named and tagged.

A combination of the axes that cannot work becomes a rejected cell with its reason (plan shows
it, the rest build); the same combination asked for explicitly by an include is an error. The
reasons themselves are the compatibility rules (builder/facts/rules.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path

from builder.config import flavor as flavors
from builder.config import grammar
from builder.config import platform as platforms
from builder.config.env import expand_env
from builder.config.schema import DEFAULT_MATRIX, BaseSpec, IndexSpec, MatrixSpec, Selector, images_folder, parse
from builder.config.yamlsource import FieldPath, SourceMap, dotted
from builder.errors import UserError
from builder.facts import rules
from builder.facts.compat import TorchWheels, TrtllmRelease, load_trtllm
from builder.plan.cell import BaseImage, Cell

# The longest tag a cell may get: 128, less the longest suffix the builder adds (`-arm64-zstd`).
MAX_OWN_TAG = 128 - len("-arm64-zstd")


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
        """The flagship for this host's platform (the one `nox -s build` builds), else the first."""
        flagships = [cell for cell in self.cells if cell.flagship]
        return next((cell for cell in flagships if cell.platform == platforms.host().name), flagships[0])

    def platforms_of(self, cell: Cell) -> list[Cell]:
        """The cells that share the cell's versioned tag: one per platform (a multi-arch index
        when there are several), in the order of platforms.NAMES."""
        group = [c for c in self.cells if c.tag == cell.tag]
        return sorted(group, key=lambda c: platforms.NAMES.index(c.platform))

    def image_tag(self, cell: Cell, compression: str = "gzip") -> str:
        """Where the cell's own image goes in the registry: its versioned tag when it is the tag's
        only platform, else `<tag>-<arch>` (the versioned tag then names the index); the zstd
        form's is `<tag>-zstd`. Matrix validation leaves room for both suffixes."""
        tag = cell.tag + ("" if compression == "gzip" else f"-{compression}")
        return f"{tag}-{cell.arch}" if len(self.platforms_of(cell)) > 1 else tag

    def sibling(self, cell: Cell, flavor: str) -> Cell | None:
        """The cell that differs from `cell` only in its flavor (the devel of a runtime, say)."""

        def stack(c: Cell) -> tuple[object, ...]:
            return (c.torch.version, c.base.name, c.python, c.index, c.cudnn, c.platform)

        return next((c for c in self.cells if c.flavor == flavor and stack(c) == stack(cell)), None)

    @property
    def quick_cell(self) -> Cell:
        """The cell tests and benchmarks build by default: a CPU runtime whose torch wheel is in
        a local directory that exists here (about 1.5 GB, no download of torch), else the flagship."""
        for cell in self.cells:
            if cell.is_cuda or cell.flavor != "runtime" or cell.platform != platforms.DEFAULT:
                continue
            links = [Path(expand_env(p)) for p in self.index(cell.index).find_links]
            if links and all(p.is_dir() and any(p.glob("torch-*.whl")) for p in links):
                return cell
        return self.flagship

    def index(self, name: str) -> IndexSpec:
        return self.spec.indexes[name]

    @property
    def images_dir(self) -> Path:
        """Where this matrix's generated files live: its `images:` folder beside the matrix file."""
        return images_folder(self.path, self.spec)


# ---------------------------------------------------------------- expansion


def base_image(name: str, spec: BaseSpec) -> BaseImage:
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
        include=tuple(spec.bootstrap.include),
        extra_suites=tuple(spec.bootstrap.extra_suites),
        hooks=tuple(spec.bootstrap.hooks),
        keyring=spec.bootstrap.keyring,
        security=(spec.bootstrap.security.mirror, spec.bootstrap.security.suite) if spec.bootstrap.security else None,
    )


def _resolve(
    selector: Selector,
    spec: MatrixSpec,
    wheels: TorchWheels,
    trtllm: dict[str, TrtllmRelease],
    origin: str,
    images_root: Path | None = None,
) -> Cell | str:
    """A cell from a complete selector, or the reason it cannot work."""
    platform = platforms.of(selector.platform or platforms.DEFAULT)
    base = dataclasses.replace(base_image(selector.base or "", spec.bases[selector.base or ""]), arch=platform.debian)
    python = selector.python or base.python
    if python != base.python:
        return f"base {base.name} provides Python {base.python}, not {python}"
    index = selector.index or spec.defaults.index or "pypi"
    if index not in spec.indexes:
        return f"index '{index}' is not defined under indexes:"
    picked = rules.pick_build(wheels, index, selector.torch or "", selector.cuda, platform.name)
    if isinstance(picked, str):
        return _for_trtllm(picked, selector, trtllm)
    build, cudnn = picked, selector.cudnn
    flavor = flavors.load().flavors[selector.flavor or ""]
    reasons = [
        rules.wheel_for_base(build, python, base.name, base.glibc),
        rules.cudnn_override(build, cudnn),
    ]
    if flavor.name == "trtllm":
        version = selector.trtllm
        reasons.append(
            rules.trtllm_on_build(trtllm.get(version), version, build, python, base.name)
            if version
            else "the trtllm flavor needs trtllm: <TensorRT-LLM version>"
        )
    reasons.append(rules.flavor_on_build(build, flavor))  # after TensorRT-LLM's own: it names the build to use
    reason = next((r for r in reasons if r), "")
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
        platform=platform.name,
    )
    return _named(cell, spec)


def _for_trtllm(reason: str, selector: Selector, trtllm: dict[str, TrtllmRelease]) -> str:
    """No torch build for a TensorRT-LLM cell: say first which build the release needs."""
    release = trtllm.get(selector.trtllm or "") if selector.flavor == "trtllm" else None
    if release is None:
        return reason
    cuda = f" built for CUDA {release.cuda_major}" if release.cuda_major else ""
    return type(reason)(f"TensorRT-LLM {release.version} needs torch {release.torch}{cuda}: {reason}")


def _named(cell: Cell, spec: MatrixSpec) -> Cell:
    fields = cell.fields()
    name = f"{fields['torch']}-{fields['cuda_tag']}"
    if cell.cudnn_overridden:
        name += f"-cudnn{cell.cudnn}"
    name += f"-{cell.base.name}-{cell.flavor}"
    if cell.trtllm:
        name += f"{cell.trtllm}"
    name += platforms.of(cell.platform).suffix
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
            "gpu_gate": _gpu_gate(cell, spec),
        }
    )


def _gpu_gate(cell: Cell, spec: MatrixSpec) -> str:
    if not cell.is_cuda:
        return "none"
    return "optional" if selected(spec.ci.gpu_optional, cell) else "required"


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
        "platform": cell.platform,
    }


def selected(selectors: list[Selector], cell: Cell) -> bool:
    """Whether any of the selectors (each a set of field values, as `where:` writes them) picks the cell."""
    return any(_matches(selector, cell) for selector in selectors)


def _matches(selector: Selector, values: Cell | dict[str, str | None]) -> bool:
    known = _cell_values(values) if isinstance(values, Cell) else values
    return all(known.get(key) == wanted for key, wanted in selector.model_dump(exclude_none=True).items())


# Combinations a matrix may ask for (its axes' product plus its includes), refused before any is
# made: a few kilobytes of axes can multiply into millions of cells (the review saw 1.9 million:
# 79 s and 3.4 GB before anything said no). This project's matrix.yaml asks for 32.
MAX_COMBINATIONS = 1000
AXIS_NAMES = ("torch", "cuda", "cudnn", "python", "base", "flavor", "platform")


def check_expansion(spec: MatrixSpec, source: SourceMap) -> int:
    """The number of combinations the matrix asks for, refused past MAX_COMBINATIONS with the product."""
    sizes = {name: len(getattr(spec.axes, name) or [None]) for name in AXIS_NAMES} if spec.axes else {}
    product = math.prod(sizes.values()) if sizes else 0
    total = product + len(spec.include)
    if total > MAX_COMBINATIONS:
        factors = " x ".join(f"{size} {name}" for name, size in sizes.items() if size > 1) or "no axes"
        raise UserError(
            f"the matrix asks for {total} combinations ({factors} = {product}, plus {len(spec.include)} includes), "
            f"more than the {MAX_COMBINATIONS} a matrix may expand to; narrow the axes, or split the matrix into files",
            source.location(("axes",) if spec.axes else ("include",)),
            "axes" if spec.axes else "include",
        )
    return total


def _axis_selectors(spec: MatrixSpec) -> list[Selector]:
    if spec.axes is None:
        return []
    axes = spec.axes
    unset: list[str | None] = [None]
    combos = itertools.product(
        axes.torch, axes.cuda or unset, axes.cudnn or unset, axes.python or unset, axes.base, axes.flavor,
        axes.platform or unset,
    )  # fmt: skip
    defaults = spec.defaults.model_dump(exclude_none=True)
    return [
        Selector(
            **{
                **defaults,
                **{
                    k: v
                    for k, v in zip(
                        ("torch", "cuda", "cudnn", "python", "base", "flavor", "platform"), combo, strict=True
                    )
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
    parts += [selector.base, selector.flavor and selector.flavor + (selector.trtllm or "")]
    return "-".join(p for p in parts if p) + platforms.of(selector.platform or platforms.DEFAULT).suffix


def expand(
    spec: MatrixSpec, source: SourceMap, wheels: TorchWheels, trtllm: dict[str, TrtllmRelease]
) -> tuple[list[Cell], list[Rejected]]:
    check_expansion(spec, source)  # before a single combination is made
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
            if origin == "include" and not isinstance(result, rules.MissingFacts):
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
    if not flagships or len({c.platform for c in flagships}) != len(flagships):
        found = ", ".join(c.name for c in flagships) or "none"
        raise UserError(
            f"must match exactly one buildable cell per platform, matches {found}; name torch, cuda, base and flavor",
            source.location(("flagship",)),
            "flagship",
        )
    # A tag names one image per platform: cells on different platforms may share one (it
    # becomes a multi-arch index), two cells on the same platform may not.
    owners: dict[tuple[str, str], str] = {}
    for cell in cells:
        for tag in (cell.tag, *cell.aliases):
            where = ("tag",) if tag == cell.tag else ("aliases",)
            if not grammar.TAG.matches(tag):
                raise UserError(
                    f"cell {cell.name} gets the tag {tag!r}, which is not a valid tag: {grammar.TAG.hint}",
                    source.location(where),
                    dotted(where),
                )
            if len(tag) > MAX_OWN_TAG:  # the builder adds -arm64 and -zstd, and never cuts a tag
                raise UserError(
                    f"cell {cell.name} gets the tag {tag!r} ({len(tag)} characters), which leaves no room for the "
                    f"suffixes the builder adds (-arm64, -zstd) within the registries' 128; shorten it to at most "
                    f"{MAX_OWN_TAG}",
                    source.location(where),
                    dotted(where),
                )
            owner = owners.get((tag, cell.platform))
            if owner is not None and owner != cell.name:
                where = ("aliases",) if tag != cell.tag else ("tag",)
                raise UserError(
                    f"cells {owner} and {cell.name} both get the tag '{tag}'; "
                    "add a field that tells them apart or narrow the alias with where:",
                    source.location(where),
                    dotted(where),
                )
            owners[(tag, cell.platform)] = cell.name
    _check_platform_groups(cells, source)


def _check_platform_groups(cells: list[Cell], source: SourceMap) -> None:
    """The platforms of a multi-arch tag are pushed as one index and its aliases move with
    it: cells that share their versioned tag must share all their aliases too."""
    by_tag: dict[str, list[Cell]] = {}
    images_of: dict[str, dict[str, Cell]] = {}  # a tag or alias -> versioned tag -> a cell under it
    for cell in cells:
        by_tag.setdefault(cell.tag, []).append(cell)
        for name in (cell.tag, *cell.aliases):
            images_of.setdefault(name, {}).setdefault(cell.tag, cell)
    for name, under in images_of.items():
        if len(under) > 1:  # on different platforms, else the owner check above refused it
            first, other = list(under.values())[:2]
            where: FieldPath = ("flagship",) if name == "latest" else ("aliases",)
            narrow = "the flagship" if name == "latest" else "it with where:"
            raise UserError(
                f"cells {first.name} ({first.platform}) and {other.name} ({other.platform}) both get '{name}' but "
                f"are different images ({first.tag}, {other.tag}); a tag names one image per platform: narrow "
                f"{narrow} (platform: linux/amd64, say)",
                source.location(where),
                dotted(where),
            )
    for group in by_tag.values():
        first = group[0]
        for other in group[1:]:
            if set(other.aliases) != set(first.aliases):
                raise UserError(
                    f"cells {first.name} and {other.name} share the tag '{first.tag}' (one image per platform) "
                    f"but not their aliases ({', '.join(first.aliases) or 'none'} against "
                    f"{', '.join(other.aliases) or 'none'}); give them the same aliases, or a field such as "
                    "{arch} in the tag",
                    source.location(("aliases",)),
                    "aliases",
                )


def load_matrix(
    path: Path = DEFAULT_MATRIX, wheels: TorchWheels | None = None, trtllm: dict[str, TrtllmRelease] | None = None
) -> Matrix:
    spec, source = parse(path)
    cells, rejected = expand(spec, source, wheels or TorchWheels.load(), load_trtllm() if trtllm is None else trtllm)
    _check_cells(cells, rejected, spec, source)
    return Matrix(path=path, spec=spec, cells=cells, rejected=rejected)
