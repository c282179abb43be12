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
    """The URL of the .deb that carries the archive's keyring."""
    sha256: Sha256
    """The .deb's sha256: the key that checks the mirror is itself checked."""
    file: RelativeDir
    """The keyring's path inside the package, such as `usr/share/keyrings/ubuntu-archive-keyring.gpg`."""


class SecuritySource(Strict):
    mirror: HttpUrl
    """The security archive's mirror (Debian's is another tree: debian-security)."""
    suite: Name
    """Its suite, such as `bookworm-security`: `lock` pins from it and `audit` reads it."""


class BootstrapSpec(Strict):
    tool: Literal["mmdebstrap", "debootstrap"] = "mmdebstrap"
    """What bootstraps the base: mmdebstrap or debootstrap."""
    mirror: HttpUrl
    """The distribution's mirror the bootstrap reads."""
    variant: Literal["minbase"] = "minbase"
    """The bootstrap's variant: minbase only."""
    components: list[Name] = ["main"]
    """The archive's components."""
    include: list[DebianPackage] = []
    """Packages beyond minbase's: Ubuntu's minbase lacks ubuntu-keyring, without which apt in the
    image cannot check the archive."""
    keyring: KeyringSpec | None = None
    """The archive's keyring for a host that lacks it (Ubuntu's on a Debian host)."""
    extra_suites: list[Name] = []
    """Suites searched besides the base's own (mmdebstrap only), such as Ubuntu's `-updates` and
    `-security`: its release pocket never changes after release."""
    hooks: list[Literal["merged-usr"]] = []
    """mmdebstrap's own hook folders, only `merged-usr`: the merged /usr set up by the hook, so
    bookworm's init-system-helpers takes usr-is-merged, not usrmerge (which pulls in perl)."""
    security: SecuritySource | None = None
    """Where the distribution publishes its security fixes, when not among the suites above."""


class BaseSpec(Strict):
    distro: Literal["debian", "ubuntu"]
    """debian or ubuntu."""
    suite: Name
    """The release, such as `bookworm` or `noble`."""
    glibc: Version
    """Its glibc: a wheel needs a manylinux tag at or below it."""
    python: Version
    """The distribution's own Python, which the image's venv is made from."""
    image: Digest | None = None
    """The registry's image pinned by digest, which `lock` starts from where a registry is
    reachable; without it, the base is always bootstrapped."""
    bootstrap: BootstrapSpec
    """How the base is bootstrapped from the distribution's archive."""


class IndexSpec(Strict):
    url: HttpUrl | None = None
    """A PEP 691 simple index. A cell resolves against its index only: a CPU or wrong-CUDA torch
    can never pass as the one asked for."""
    extra_urls: list[HttpUrl] = []
    """Searched after `url`, for packages it does not have."""
    find_links: list[FindLinks] = []
    """Local wheel folders; `${TORCH_WHEEL_DIR}` and `${TRTLLM_WHEEL_DIR}`, with `:-default`, expand."""

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
    """Every combination of the axes is a candidate cell."""

    torch: Annotated[list[Version], Field(min_length=1)]
    """torch versions."""
    cuda: list[Cuda] | None = None
    """CUDA versions (default: the one each torch's wheels name)."""
    cudnn: list[Version] | None = None
    """cuDNN versions (default: the one each torch's wheels name)."""
    python: list[Version] | None = None
    """Python versions (default: each base's own)."""
    base: Annotated[list[Name], Field(min_length=1)]
    """Bases, by their name under `bases`."""
    flavor: Annotated[list[Name], Field(min_length=1)]
    """Flavors (runtime, devel, ...)."""
    platform: list[PlatformName] | None = None
    """`linux/amd64` (the default) and `linux/arm64`."""


class AliasSpec(Strict):
    template: str
    """A moving tag, with the fields `tag` takes."""
    where: Selector = Selector()
    """The cells it applies to: no two cells of one platform may share an alias."""


class BudgetSpec(Strict):
    """Most an image of a flavor may take, uncompressed: in all (base included), and per layer."""

    total: Size | None = None
    """The whole image, base included, such as `"6 GB"`; a build over it fails (size.md)."""
    layer: Size | None = None
    """Each layer; a build over it fails, naming the layer."""


class WheelhouseSpec(Strict):
    listen: Loopback = "127.0.0.1:8741"
    """The loopback address builds fetch wheels from (part of the rendered Dockerfiles)."""


Arch = Literal["amd64", "arm64"]


class CiSpec(Strict):
    """What `ci` writes beyond the build jobs: the GPU stage. Every CUDA cell's tags wait for a
    passing self-test on a GPU, run on a runner with these labels, unless `gpu_optional` selects
    the cell (its record and the README then say `GPU: not tested`)."""

    gpu_runner: list[RunnerLabel] | dict[Arch, list[RunnerLabel]] = {}
    """Labels of the runners with NVIDIA GPUs: a list for x86-64 ones, or one list per architecture."""
    gpu_optional: list[Selector] = []
    """Cells whose GPU gate is optional: their tags move without a GPU run, and say `GPU: not tested`."""
    exclude: list[Selector] = []
    """Cells that are jobs only when `ci` names them: their inputs are on no CI runner (ci.md)."""
    github_attestations: bool = False
    """GitHub's own keyless SLSA provenance beside the team key's, on each staged manifest
    (provenance.md)."""
    rebuild_check: bool = False
    """A `rebuild` job builds each staged image again with BuildKit and signs the rebuild where the
    image IDs agree; promote waits for it (publish.require_rebuilds counts at least 1 then)."""

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
    """`zstd` also pushes each image with zstd layers under `<tag>-zstd` and `<alias>-zstd` (the same
    image ID; using-images.md says which clients read it)."""
    zstd_level: Annotated[int, Field(ge=1, le=19)] = ZSTD_LEVEL
    """1-19; the default is the bench's choice (benchmarks.md)."""
    soci: bool = False
    """Also make a SOCI index of each gzip image, so nodes with AWS's SOCI snapshotter start it
    lazily; needs containerd and root where `publish` runs (using-images.md)."""
    soci_index: Literal["v2", "v1", "both"] = "v2"
    """v2: a SOCI-enabled image under `<tag>-soci` (snapshotter v0.10 and later load it by default);
    v1: an index attached to the image's own digest (snapshotters before v0.10, or later with
    `[pull_modes.soci_v1]`); both."""
    require_rebuilds: Annotated[int, Field(ge=0, le=8)] = 0
    """Promote with the team's key moves a tag only when this many of `rebuilders`, each with its own
    key, signed a rebuild that gave the staged image's ID (`verify --rebuild --sign-key`). The team's
    key never counts, nor one key twice, whatever engines it names."""
    rebuilders: dict[Name, RelativeDir] = {}
    """Who rebuilds staged images: a name and the path of its PEM public key, relative to the matrix
    file (`rebuilders/alice.pub`). Each keeps its private key on its own machine (reproducible-builds.md)."""


TorchPolicy = Literal["newest", "newest-per-cuda"]


class FollowSpec(Strict):
    """What `update --releases` proposes when upstream releases (keeping-current.md). A matrix
    without this key is proposed nothing: its torch versions and bases move only by hand."""

    torch: list[TorchPolicy] = []
    """`newest`: the index's newest torch release joins axes.torch; `newest-per-cuda`: for each CUDA
    line of the axes' torch versions, the newest release built for that line replaces its older ones."""
    index: Name | None = None
    """The index whose torch releases are read (default: defaults.index)."""
    distros: list[Literal["debian", "ubuntu"]] = []
    """Notice a Debian stable or Ubuntu LTS release that no base names, from its archive's signed index,
    and propose a base for it in the pull request's text (never added unasked)."""


class MatrixSpec(Strict):
    registry: RegistryHost
    """Where `publish` pushes: `registry/repository:tag`."""
    repository: Repository
    """The image's name under the registry."""
    images: RelativeDir = "images"
    """The folder of generated files (locks, Dockerfiles), relative to the matrix file."""
    tag: str
    """Each cell's versioned tag, a template of the fields {torch} {torch_minor} {cuda} {cuda_tag}
    {cudnn} {cudnn_tag} {accel} {python} {glibc} {base} {flavor} {trtllm} {arch}. Cells on
    different platforms that get the same tag are one multi-arch tag."""
    aliases: list[AliasSpec] = []
    """Moving tags; two cells of one platform never share one, and an alias (or `latest`) names only
    one multi-arch tag's images."""
    flagship: Selector
    """The cell `nox -s build` builds by default, one per platform (this host's is built); it also
    gets `latest`."""
    source_date_epoch: Annotated[int, Field(ge=0, lt=2**32)]
    """The fixed time of bootstraps, layers and labels."""
    wheelhouse: WheelhouseSpec = WheelhouseSpec()
    """The host-side wheel server builds install from."""
    budgets: dict[Name, BudgetSpec] = {}
    """The most an image of a flavor may take, uncompressed."""
    bases: dict[Name, BaseSpec]
    """The base images, by name."""
    indexes: dict[Name, IndexSpec]
    """Where wheels come from, by name."""
    defaults: Selector = Selector()
    """Values every cell takes unless it says otherwise (such as its `index`)."""
    axes: Axes | None = None
    """Every combination of these lists is a candidate cell."""
    include: list[Selector] = []
    """Extra cells, each a whole cell (torch, base, flavor at least); one that cannot work is an error."""
    ci: CiSpec = CiSpec()
    """What `ci` writes beyond the build jobs (ci.md)."""
    publish: PublishSpec = PublishSpec()
    """How `publish` writes the images' layers and what promote waits for."""
    follow: FollowSpec | None = None
    """Which upstream releases `update --releases` proposes (none without this key)."""

    def uses_flavor(self, name: str) -> bool:
        return name in (self.axes.flavor if self.axes else []) or any(s.flavor == name for s in self.include)

    exclude: list[Selector] = []
    """Combinations of the axes that are not cells."""


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
    if spec.follow is not None:
        check(("follow", "index"), "index", spec.follow.index, list(spec.indexes))
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
    _check_quorum(spec, source)
    _check_template(("tag",), spec.tag, source)
    for i, alias in enumerate(spec.aliases):
        _check_template(("aliases", i, "template"), alias.template, source)


def _check_quorum(spec: MatrixSpec, source: SourceMap) -> None:
    """A quorum that no set of rebuilder keys could meet is refused here, not at promote: a tag
    would never move. ci.rebuild_check's job counts as a rebuilder too, so it needs one listed."""
    wanted = max(spec.publish.require_rebuilds, 1 if spec.ci.rebuild_check else 0)
    listed = len(spec.publish.rebuilders)
    if wanted > listed:
        where = ("publish", "require_rebuilds") if spec.publish.require_rebuilds else ("ci", "rebuild_check")
        raise UserError(
            f"{dotted(where)} needs {wanted} rebuilder key(s) but publish.rebuilders lists {listed}; add "
            "`rebuilders: {NAME: PATH}`, each rebuilder's own PEM public key (the team's key never counts)",
            source.location(where),
            dotted(where),
        )


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
