"""matrix.yaml's schema: typed fields, each value against its grammar, and file:line errors.

What the file says, checked; what can be built from it is the plan's job (builder/plan/).
"""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from builder.config import flavor as flavors
from builder.config.validated import (
    Cuda,
    DebianPackage,
    Digest,
    FindLinks,
    HttpUrl,
    Loopback,
    Name,
    PlatformName,
    RegistryHost,
    RelativeDir,
    Repository,
    RunnerLabel,
    Sha256,
    Size,
    Strict,
    Version,
    validate,
)
from builder.config.yamlsource import FieldPath, SourceMap, dotted, load
from builder.errors import UserError

DEFAULT_MATRIX = Path("matrix.yaml")


class KeyringSpec(Strict):
    """The archive's signing keys for a bootstrap on a host that lacks them (Ubuntu's on a Debian
    host): one file from a .deb pinned by sha256, so the key that checks the mirror is itself
    checked."""

    deb: HttpUrl
    sha256: Sha256
    file: RelativeDir  # inside the package, e.g. usr/share/keyrings/ubuntu-archive-keyring.gpg


class SecuritySource(Strict):
    mirror: HttpUrl
    suite: Name


class BootstrapSpec(Strict):
    tool: Literal["mmdebstrap", "debootstrap"] = "mmdebstrap"
    mirror: HttpUrl
    variant: Literal["minbase"] = "minbase"
    components: list[Name] = ["main"]
    # Packages beyond the variant's: Ubuntu's minbase lacks ubuntu-keyring, without which apt in
    # the image cannot check the archive.
    include: list[DebianPackage] = []
    keyring: KeyringSpec | None = None
    # Suites searched besides the base's own (mmdebstrap only): Ubuntu's release pocket never
    # changes after release, its fixes come in <suite>-updates and <suite>-security.
    extra_suites: list[Name] = []
    # mmdebstrap's own hook folders (mmdebstrap only). merged-usr: the merged /usr is set up by
    # the hook, so bookworm's init-system-helpers takes usr-is-merged instead of usrmerge, which
    # would pull perl (about 45 MB) into the base; debian:bookworm-slim is made the same way.
    hooks: list[Literal["merged-usr"]] = []
    # Where the distro publishes its security fixes, when not among the suites above (Debian's
    # security archive is another tree: debian-security, <suite>-security). `audit` reads it.
    security: SecuritySource | None = None


class BaseSpec(Strict):
    distro: Literal["debian", "ubuntu"]
    suite: Name
    glibc: Version
    python: Version
    image: Digest | None = None  # pulled where a registry is reachable; without it, always bootstrapped
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
    platform: PlatformName | None = None


class Axes(Strict):
    torch: Annotated[list[Version], Field(min_length=1)]
    cuda: list[Cuda] | None = None
    cudnn: list[Version] | None = None
    python: list[Version] | None = None
    base: Annotated[list[Name], Field(min_length=1)]
    flavor: Annotated[list[Name], Field(min_length=1)]
    platform: list[PlatformName] | None = None  # linux/amd64 when unset


class AliasSpec(Strict):
    template: str
    where: Selector = Selector()


class BudgetSpec(Strict):
    """Most an image of a flavor may take, uncompressed: in all (base included), and per layer."""

    total: Size | None = None
    layer: Size | None = None


class WheelhouseSpec(Strict):
    listen: Loopback = "127.0.0.1:8741"


Arch = Literal["amd64", "arm64"]


class CiSpec(Strict):
    """What `ci` writes beyond the build jobs: the GPU stage. Every CUDA cell's tags wait for a
    passing self-test on a GPU, run on a runner with these labels, unless `gpu_optional` selects
    the cell (its record and the README then say `GPU: not tested`)."""

    # labels of runners with NVIDIA GPUs: a list for x86-64 ones, or one list per architecture
    gpu_runner: list[RunnerLabel] | dict[Arch, list[RunnerLabel]] = {}
    gpu_optional: list[Selector] = []
    # cells that are not jobs unless `ci` names them: their inputs are on no CI runner (wheels
    # from a folder of the build machine, say)
    exclude: list[Selector] = []
    # GitHub's own artifact attestations beside the team key's: each staged manifest also gets
    # SLSA provenance signed keyless by GitHub (actions/attest, Sigstore), pushed beside it as
    # a referrer (docs/security.md: what each path proves, and the SLSA build level it gives)
    github_attestations: bool = False
    # A second build of each cell in a job of its own, with BuildKit beside the cell job's classic
    # builder: it signs a rebuild statement when it gives the staged image's ID, and promote waits
    # for one (publish.require_rebuilds counts at least 1 then).
    rebuild_check: bool = False

    def gpu_runner_for(self, arch: str) -> list[str]:
        if isinstance(self.gpu_runner, list):
            return list(self.gpu_runner) if arch == "amd64" else []
        return list(self.gpu_runner.get(arch, []))  # type: ignore[call-overload]


# The zstd level `nox -s bench` chose (its zstd rows): on this project's layers, levels above it
# take two to ten times as long for 1-2% less, and lower levels leave 15% more to pull.
ZSTD_LEVEL = 9


class PublishSpec(Strict):
    """How `publish` writes the images' layers. gzip under the plain tags always (every client
    reads it); `zstd` adds the same images with zstd layers under `<tag>-zstd` and
    `<alias>-zstd` (containerd >= 1.5, Docker >= 23: docs/using-images.md)."""

    compression: Literal["gzip", "zstd"] = "gzip"
    zstd_level: Annotated[int, Field(ge=1, le=19)] = ZSTD_LEVEL
    # A SOCI index beside each gzip image, for nodes that start images lazily (soci-snapshotter);
    # needs the soci CLI, containerd and root where publish runs (builder/publish/soci.py).
    soci: bool = False
    # Promote with the team's key moves a tag only when this many signed rebuilds, each on an
    # engine of its own, gave the staged image's ID (`verify --rebuild --sign-key`; ci.rebuild_check).
    require_rebuilds: Annotated[int, Field(ge=0, le=8)] = 0


class MatrixSpec(Strict):
    registry: RegistryHost
    repository: Repository
    images: RelativeDir = "images"  # where render writes, relative to the matrix file
    tag: str
    aliases: list[AliasSpec] = []
    flagship: Selector
    source_date_epoch: Annotated[int, Field(ge=0, lt=2**32)]
    wheelhouse: WheelhouseSpec = WheelhouseSpec()
    budgets: dict[Name, BudgetSpec] = {}  # flavor -> its size budget
    bases: dict[Name, BaseSpec]
    indexes: dict[Name, IndexSpec]
    defaults: Selector = Selector()
    axes: Axes | None = None
    include: list[Selector] = []
    ci: CiSpec = CiSpec()
    publish: PublishSpec = PublishSpec()

    def uses_flavor(self, name: str) -> bool:
        return name in (self.axes.flavor if self.axes else []) or any(s.flavor == name for s in self.include)

    exclude: list[Selector] = []


def images_folder(path: Path, spec: MatrixSpec) -> Path:
    return path.resolve().parent / spec.images


def parse(path: Path) -> tuple[MatrixSpec, SourceMap]:
    data, source = load(path)
    spec = validate(MatrixSpec, data, source, "registry, bases, axes, ...")
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
    groups += [(("ci", "gpu_optional", i), s) for i, s in enumerate(spec.ci.gpu_optional)]
    groups += [(("ci", "exclude", i), s) for i, s in enumerate(spec.ci.exclude)]
    for where, selector in groups:
        check((*where, "base"), "base", selector.base, list(spec.bases))
        check((*where, "flavor"), "flavor", selector.flavor, known_flavors)
        check((*where, "index"), "index", selector.index, list(spec.indexes))
    for name in spec.budgets:
        check(("budgets", name), "flavor", name, known_flavors)
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
    "python", "glibc", "base", "flavor", "trtllm", "arch",
)  # fmt: skip
