"""The platforms images are built for, and each one's names in the places that name it: OCI
(linux/arm64, architecture and variant), Debian (arm64) and wheel tags (aarch64)."""

from __future__ import annotations

import platform as system
from dataclasses import dataclass


@dataclass(frozen=True)
class Platform:
    name: str  # OCI's os/architecture, as matrix.yaml and `docker pull --platform` write it
    debian: str  # dpkg's architecture: mmdebstrap --architectures, the base's tag suffix
    wheel: str  # the architecture in a wheel's platform tag (manylinux_2_28_aarch64)
    variant: str | None = None  # OCI's variant (arm64 images say v8)

    @property
    def architecture(self) -> str:
        return self.name.split("/")[1]

    def descriptor(self) -> dict[str, str]:
        """The `platform` of an OCI index's entry for an image of this platform."""
        described = {"architecture": self.architecture, "os": "linux"}
        return {**described, "variant": self.variant} if self.variant else described

    @property
    def suffix(self) -> str:
        """What names of this platform's things add to the default platform's: "" or "-arm64"."""
        return "" if self.name == DEFAULT else f"-{self.debian}"

    @property
    def qemu(self) -> str:
        """qemu's program for this architecture (qemu-aarch64), as binfmt_misc runs it."""
        return f"qemu-{self.wheel}"


PLATFORMS = {
    p.name: p
    for p in (
        Platform("linux/amd64", debian="amd64", wheel="x86_64"),
        Platform("linux/arm64", debian="arm64", wheel="aarch64", variant="v8"),
    )
}
DEFAULT = "linux/amd64"
NAMES = tuple(PLATFORMS)


def of(name: str) -> Platform:
    return PLATFORMS[name]


def of_debian(arch: str) -> Platform | None:
    return next((p for p in PLATFORMS.values() if p.debian == arch), None)


def of_wheel(wheel_arch: str) -> Platform | None:
    return next((p for p in PLATFORMS.values() if p.wheel == wheel_arch), None)


def host() -> Platform:
    """This machine's platform (x86_64 -> linux/amd64, aarch64 -> linux/arm64)."""
    found = of_wheel(system.machine())
    if found is None:
        raise ValueError(f"no platform known for this machine's architecture {system.machine()!r}")
    return found
