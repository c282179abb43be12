"""Compatibility rules: why a torch build, a base, a Python, cuDNN, a flavor and TensorRT-LLM
cannot go together. Each returns "" when they can, or the reason and what to change.

The facts the rules read (which wheels exist, what they pin, their glibc floor) are data in
data/torch_wheels.json and data/trtllm.json, derived from the wheels' own metadata.
"""

from __future__ import annotations

from builder.config import platform as platforms
from builder.config.flavor import Flavor
from builder.facts.compat import TorchBuild, TorchWheels, TrtllmRelease, version_key


class MissingFacts(str):
    """A reason that is a gap in data/, not a conflict: an index the last `compat refresh`
    could not read. A cell the matrix includes is then listed as rejected, not refused."""


def pick_build(
    wheels: TorchWheels, index: str, torch: str, cuda: str | None, platform: str = platforms.DEFAULT
) -> TorchBuild | str:
    """The torch build an index serves for this version, CUDA (a CUDA one when cuda is unset)
    and platform, or why there is none."""
    builds = wheels.builds(index, torch, platform)
    on = "" if platform == platforms.DEFAULT else f" on {platform}"
    wanted = f"torch {torch}" + (f" for CUDA {cuda}" if cuda else "") + on
    unread = wheels.unread.get(index, [])
    if unread and (not builds or (cuda and all(b.cuda != cuda for b in builds))):
        return MissingFacts(
            f"{wanted} is not among what was read of index '{index}'; {', '.join(unread)} could not be read: "
            "run `python -m builder compat refresh` where it is reachable"
        )
    if not builds:
        if platform != platforms.DEFAULT and wheels.builds(index, torch):
            return f"index '{index}' has no {platform} wheel of torch {torch}; remove {platform} for it or set index:"
        return (
            f"no torch {torch}{on} on index '{index}' in data/torch_wheels.json; run `python -m builder compat refresh`"
        )
    if cuda is None:
        return next((b for b in builds if b.cuda != "cpu"), builds[0])
    matching = [b for b in builds if b.cuda == cuda]
    if matching:
        return matching[0]
    actual = ", ".join(sorted({b.cuda for b in builds}))
    elsewhere = wheels.indexes_with(torch, cuda, platform)
    hint = (
        f"set index: {elsewhere[0]}"
        if elsewhere
        else f"add an index serving that variant (PyTorch's wheel index for cu{cuda.replace('.', '')}) and set index:"
    )
    return f"torch {torch}{on} on index '{index}' is built for CUDA {actual}, not {cuda}; {hint}"


def wheel_for_base(build: TorchBuild, python: str, base: str, glibc: str) -> str:
    """A wheel for this Python must exist, and its manylinux floor must not be above the base's glibc."""
    if python not in build.glibc_floor:
        pythons = build.pythons
        span = f"{pythons[0]}-{pythons[-1]}" if pythons else "none"
        return f"torch {build.version} has no wheel for Python {python} (has {span})"
    floor = build.glibc_floor[python]
    if version_key(floor) > version_key(glibc):
        tag = f"manylinux_{floor.replace('.', '_')}"
        return f"torch {build.version}'s wheel needs glibc {floor} ({tag}), base {base} has {glibc}"
    return ""


def cudnn_override(build: TorchBuild, cudnn: str | None) -> str:
    """cuDNN may be set on a CUDA build, and only raised above torch's own pin."""
    if cudnn and build.cudnn is None:
        return f"torch {build.version} is a CPU build; it has no cuDNN to set"
    if cudnn and build.cudnn and version_key(cudnn) < version_key(build.cudnn):
        return f"cuDNN {cudnn} is below torch {build.version}'s pin {build.cudnn}; cuDNN may only be raised"
    return ""


def flavor_on_build(build: TorchBuild, flavor: Flavor) -> str:
    """A flavor that needs CUDA needs a CUDA build; one that needs CUDA's compiler needs a build
    whose pins leave a wheel that holds nvcc (data/flavors.yaml says which)."""
    if flavor.requires_cuda and build.cuda == "cpu":
        return f"the {flavor.name} flavor needs a CUDA build of torch, not {build.version}"
    if build.cuda != "cpu" and flavor.cuda_requirements(build.cuda_toolkit, build.cuda_major) is None:
        return (
            f"the {flavor.name} flavor needs nvcc: torch {build.version} pins CUDA {build.cuda}'s per-library "
            f"wheels, and nvidia-cuda-nvcc-cu{build.cuda_major} holds no nvcc; use torch 2.11 or later, or runtime"
        )
    return ""


def trtllm_on_build(release: TrtllmRelease | None, version: str, build: TorchBuild, python: str, base: str) -> str:
    """Why TensorRT-LLM `version` cannot go on this torch build and Python."""
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
