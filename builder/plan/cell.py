"""A cell: one image of the matrix, with every version resolved."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder import confined
from builder.config import platform as platforms
from builder.config.schema import KeyringSpec
from builder.facts.compat import TorchBuild

# The file in a cell's folder that names the image ID its build is expected to give: written by
# the repro stage (repro/recorded.py), and among the files render keeps or removes with the cell.
RECORDED_IMAGE_ID_FILE = "image-id"

# The fields a `tag:` or `aliases:` template may use, and what each is; docs/custom-images.md's
# table of them, with the flagship's and the CPU cell's values, is written from this.
TAG_FIELDS: dict[str, str] = {
    "torch": "torch's version, without its local part",
    "torch_minor": "torch's major.minor",
    "cuda": "the CUDA version the wheel is built for (`cpu` for a CPU wheel)",
    "cuda_tag": "`cu` and the CUDA version, or `cpu`",
    "cudnn": "the cuDNN version the wheel requires (`none` without one)",
    "cudnn_tag": "`cudnn` and cuDNN's major.minor (`nocudnn` without one)",
    "accel": "`{cuda_tag}-{cudnn_tag}`, or `cpu`",
    "python": "the image's Python, major.minor",
    "glibc": "the base's glibc",
    "base": "the base's name in `bases:`",
    "flavor": "`runtime`, `devel` or `trtllm`",
    "trtllm": "TensorRT-LLM's version in the `trtllm` flavor (empty elsewhere)",
    "arch": "Debian's name for the architecture (`amd64`, `arm64`)",
}


@dataclass(frozen=True)
class BaseImage:
    """A distro release the images are built on, and how to obtain it without a registry."""

    name: str
    distro: str
    suite: str
    glibc: str
    python: str
    image: str | None  # the registry's image, by digest; None: bootstrapped only
    mirror: str
    bootstrap_tool: str
    variant: str
    components: tuple[str, ...]
    include: tuple[str, ...] = ()  # packages the bootstrap adds to the variant's
    extra_suites: tuple[str, ...] = ()  # searched besides `suite` (noble-updates, noble-security)
    hooks: tuple[str, ...] = ()  # mmdebstrap hook folders the bootstrap runs (merged-usr)
    arch: str = "amd64"  # Debian's name for the architecture (amd64, arm64)
    keyring: KeyringSpec | None = None  # the archive's keys, when the host lacks them
    security: tuple[str, str] | None = None  # (mirror, suite) of the security archive, where separate

    def sources(self) -> list[tuple[str, str]]:
        """(mirror, suite) of every suite apt reads: the release, the extra suites on its mirror,
        and the security archive where it is a tree of its own (Debian's debian-security)."""
        found = [(self.mirror, suite) for suite in (self.suite, *self.extra_suites)]
        return found + ([self.security] if self.security and self.security not in found else [])

    def sources_lines(self) -> list[str]:
        """sources.list's line for each of `sources`."""
        return [f"deb {mirror} {suite} {' '.join(self.components)}" for mirror, suite in self.sources()]

    def mirror_of(self, source: str) -> str:
        """The mirror an archive file's `source` names: "" the release's, "security" the security archive's."""
        return self.security[0] if source == "security" and self.security else self.mirror

    @property
    def platform(self) -> platforms.Platform:
        found = platforms.of_debian(self.arch)
        assert found is not None, self.arch  # the plan sets arch from a known platform
        return found

    @property
    def local_tag(self) -> str:
        """The engine tag of the bootstrapped base (no registry involved)."""
        return f"torch-images/base:{self.name}{self.platform.suffix}"

    @property
    def reference(self) -> str:
        """What the Dockerfile names as its base by default (the builder passes the one it used)."""
        return self.image or self.local_tag


@dataclass(frozen=True)
class Cell:
    """One buildable image: torch build x base x flavor, plus its naming."""

    name: str
    torch: TorchBuild
    base: BaseImage
    flavor: str
    python: str
    index: str
    cudnn: str | None  # what the image installs; may be raised above torch's pin
    trtllm: str | None = None
    tag: str = ""
    aliases: tuple[str, ...] = ()
    flagship: bool = False
    origin: str = ""  # "axes" or "include"; where a cell came from decides if a failure is an error
    images_root: Path | None = None  # the matrix's images folder; the cell's files are in images_root/name
    platform: str = platforms.DEFAULT  # cells that differ only in platform share their tags (a multi-arch index)
    # A CUDA cell's tags wait for a passing GPU self-test ("required") unless the matrix's
    # ci.gpu_optional selects it ("optional"); a CPU cell has no GPU gate ("none").
    gpu_gate: str = "none"

    @property
    def arch(self) -> str:
        """Debian's name for the cell's architecture (amd64, arm64)."""
        return platforms.of(self.platform).debian

    @property
    def directory(self) -> Path:
        """Where the cell's locks, Dockerfile, spec.json and recorded image ID live."""
        return (self.images_root or Path("images")) / self.name

    def file(self, name: str) -> Path:
        """A file of the cell's folder, after checking that neither the folder nor the file is a
        symbolic link (images/ itself may be one): see builder/confined.py."""
        root = self.images_root or Path("images")
        return confined.inside(root, f"{self.name}/{name}")

    @property
    def cuda(self) -> str:
        return self.torch.cuda

    @property
    def is_cuda(self) -> bool:
        return self.torch.cuda != "cpu"

    @property
    def cudnn_overridden(self) -> bool:
        return self.cudnn is not None and self.cudnn != self.torch.cudnn

    @property
    def glibc_floor(self) -> str:
        return self.torch.glibc_floor.get(self.python, "")

    def fields(self) -> dict[str, str]:
        """The names a tag template may use, each as TAG_FIELDS says."""
        torch_minor = ".".join(self.torch.public_version.split(".")[:2])
        cuda_tag = f"cu{self.cuda}" if self.is_cuda else "cpu"
        cudnn_tag = "cudnn" + ".".join((self.cudnn or "").split(".")[:2]) if self.cudnn else ""
        values = {
            "torch": self.torch.public_version,
            "torch_minor": torch_minor,
            "cuda": self.cuda,
            "cuda_tag": cuda_tag,
            "cudnn": self.cudnn or "none",
            "cudnn_tag": cudnn_tag or "nocudnn",
            "accel": f"{cuda_tag}-{cudnn_tag}" if cudnn_tag else cuda_tag,
            "python": self.python,
            "glibc": self.base.glibc,
            "base": self.base.name,
            "flavor": self.flavor,
            "trtllm": self.trtllm or "",
            "arch": self.arch,
        }
        assert set(values) == set(TAG_FIELDS)
        return values

    def spec(self) -> dict[str, Any]:
        """The resolved facts of the cell, as written to images/<cell>/spec.json and image labels."""
        return {
            "cell": self.name,
            "torch": self.torch.version,
            "cuda": self.cuda,
            "cudnn": self.cudnn,
            "cudnn_pin": self.torch.cudnn,
            "nccl": self.torch.nccl,
            "triton": self.torch.triton,
            "python": self.python,
            "glibc": self.base.glibc,
            "glibc_floor": self.glibc_floor,
            "base": self.base.name,
            "base_image": self.base.reference,
            "distro": f"{self.base.distro} {self.base.suite}",
            "flavor": self.flavor,
            "trtllm": self.trtllm,
            "index": self.index,
            "platform": self.platform,
            "tag": self.tag,
            "aliases": list(self.aliases),
        }
