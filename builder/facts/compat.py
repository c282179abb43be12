"""Compatibility facts about torch builds, derived from the wheels' own metadata.

`python -m builder compat refresh` reads every torch version the matrix names from each
index the matrix names and writes data/torch_wheels.json. Planning reads only that file,
so `plan` and `render` work offline and fast; `lock` later cross-checks the same facts
against what the resolver actually picked.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from builder import confined, paths
from builder.config import platform as platforms
from builder.facts import pypi

TORCH_WHEELS = paths.DATA / "torch_wheels.json"
TRTLLM = paths.DATA / "trtllm.json"


@dataclass(frozen=True)
class TorchBuild:
    """One build of torch (a version plus its local variant) as one index serves it."""

    version: str
    cuda: str
    requires_python: str | None
    glibc_floor: dict[str, str]  # Python version -> lowest glibc of that Python's wheel
    cuda_toolkit: str | None = None  # the cuda-toolkit metapackage pin, torch 2.11 and later
    cuda_runtime: str | None = None  # nvidia-cuda-runtime-cuXX pin, torch 2.10 and earlier
    cudnn: str | None = None
    nccl: str | None = None
    triton: str | None = None
    pins: dict[str, str] = field(default_factory=dict)  # every == pin of Requires-Dist
    # The same version may be a different build on another architecture: PyPI's torch 2.9.1 is
    # a CUDA 12.8 build for x86_64 and a CPU build for aarch64.
    platform: str = platforms.DEFAULT

    @property
    def key(self) -> str:
        """Its key in data/torch_wheels.json: the version, and the platform where not the default."""
        return self.version if self.platform == platforms.DEFAULT else f"{self.version}@{self.platform}"

    @property
    def public_version(self) -> str:
        return self.version.split("+")[0]

    @property
    def pythons(self) -> list[str]:
        return sorted(self.glibc_floor, key=version_key)

    @property
    def cuda_major(self) -> str | None:
        return None if self.cuda == "cpu" else self.cuda.split(".")[0]


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def _exact_pin(requirement: Requirement) -> str | None:
    for spec in requirement.specifier:
        if spec.operator == "==":
            return spec.version.rstrip(".*")
    return None


def cuda_of(version: str, pins: dict[str, str]) -> str:
    """The CUDA a torch build targets: its local tag (+cu126), else its CUDA runtime pin."""
    local = version.partition("+")[2]
    if local == "cpu":
        return "cpu"
    if match := re.fullmatch(r"cu(\d+)(\d)", local):
        return f"{match.group(1)}.{match.group(2)}"
    runtime = pins.get("cuda-toolkit") or next(
        (pin for name, pin in pins.items() if re.fullmatch(r"nvidia-cuda-runtime(-cu\d+)?", name)), None
    )
    if runtime is None:
        return "cpu"
    return ".".join(runtime.split(".")[:2])


def build_from_metadata(
    version: str, wheels: Iterable[pypi.WheelFile], requires: Iterable[str], platform: str = platforms.DEFAULT
) -> TorchBuild:
    """Fold the wheel tags and Requires-Dist of one torch build into its facts."""
    floors: dict[str, str] = {}
    requires_python = None
    for wheel in wheels:
        python, floor = wheel.cpython, wheel.glibc_floor
        if python is None or floor is None:
            continue  # free-threaded (cp313t), abi3 or non-manylinux wheels are not what images use
        floors[python] = floor
        requires_python = requires_python or wheel.requires_python
    pins: dict[str, str] = {}
    specifiers: dict[str, str] = {}
    # Requires-Dist is the same text in every wheel of a version; its markers say which
    # requirements apply where (2.9.1 pins the CUDA libraries for x86_64 only).
    environment = {
        "platform_machine": platforms.of(platform).wheel, "platform_system": "Linux", "sys_platform": "linux",
        "python_version": min(floors, key=version_key, default="3"), "extra": "",
    }  # fmt: skip
    for text in requires:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        name = requirement.name.lower()
        specifiers[name] = str(requirement.specifier)
        if pin := _exact_pin(requirement):
            pins[name] = pin
    cudnn = next((pin for name, pin in pins.items() if name.startswith("nvidia-cudnn")), None)
    nccl = next((pin for name, pin in pins.items() if name.startswith("nvidia-nccl")), None)
    runtime = next((pin for name, pin in pins.items() if name.startswith("nvidia-cuda-runtime")), None)
    return TorchBuild(
        version=version,
        cuda=cuda_of(version, pins),
        requires_python=requires_python,
        glibc_floor=floors,
        cuda_toolkit=pins.get("cuda-toolkit"),
        cuda_runtime=runtime,
        cudnn=cudnn,
        nccl=nccl,
        triton=specifiers.get("triton") or None,
        pins=pins,
        platform=platform,
    )


def read_torch_builds(
    versions: Iterable[str], index_urls: Iterable[str], find_links: Iterable[Path], unreachable: dict[str, str]
) -> list[TorchBuild]:
    """Every build of the given torch versions that one index (its URLs and find-links) serves,
    for each platform images are built for (each platform's wheel has its own METADATA).

    URLs that cannot be read are added to `unreachable` (URL -> why) and skipped.
    """
    wanted = set(versions)
    files: list[pypi.WheelFile] = []
    for directory in find_links:
        files += pypi.find_links_files("torch", directory)
    for url in index_urls:
        try:
            files += pypi.index_files("torch", url)
        except OSError as error:
            unreachable[url] = str(getattr(error, "reason", error))
    by_build: dict[tuple[str, str], list[pypi.WheelFile]] = defaultdict(list)
    for wheel in files:
        platform = platforms.of_wheel(wheel.linux_arch or "")
        if platform is not None and wheel.version.split("+")[0] in wanted:
            by_build[(wheel.version, platform.name)].append(wheel)
    builds = []
    for (version, platform_name), wheels in sorted(by_build.items()):
        requires = pypi.requirements(pypi.wheel_metadata(wheels[0]))
        builds.append(build_from_metadata(version, wheels, requires, platform_name))
    return builds


class TorchWheels:
    """The committed table of torch builds, by index name and full version."""

    def __init__(self, table: dict[str, dict[str, TorchBuild]], unread: dict[str, list[str]] | None = None) -> None:
        self.table = table
        # index -> its URLs the last refresh could not read: its builds there are not known,
        # so a variant missing from the table may still exist.
        self.unread = unread or {}

    @classmethod
    def load(cls, path: Path = TORCH_WHEELS) -> TorchWheels:
        if not path.exists():
            return cls({})
        document = json.loads(path.read_text())
        table = {
            index: {v: TorchBuild(**entry) for v, entry in builds.items()}
            for index, builds in document["indexes"].items()
        }
        return cls(table, document.get("unread", {}))

    def save(self, path: Path = TORCH_WHEELS) -> None:
        document = {
            "comment": "Generated by `python -m builder compat refresh` from the wheels' own metadata.",
            "indexes": {
                index: {version: asdict(build) for version, build in sorted(builds.items())}
                for index, builds in sorted(self.table.items())
            },
            "unread": {index: urls for index, urls in sorted(self.unread.items()) if urls},
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        confined.write_text(path, json.dumps(document, indent=1, sort_keys=False) + "\n")

    def builds(self, index: str, public_version: str, platform: str = platforms.DEFAULT) -> list[TorchBuild]:
        return [
            b
            for b in self.table.get(index, {}).values()
            if b.public_version == public_version and b.platform == platform
        ]

    def indexes_with(self, public_version: str, cuda: str, platform: str = platforms.DEFAULT) -> list[str]:
        return sorted(
            index
            for index, builds in self.table.items()
            if any(
                b.public_version == public_version and b.cuda == cuda and b.platform == platform
                for b in builds.values()
            )
        )


@dataclass(frozen=True)
class TrtllmRelease:
    """What one TensorRT-LLM release requires, from its own metadata."""

    version: str
    torch: str  # specifier, e.g. ">=2.7.1,<=2.8.0a0"
    tensorrt: str
    pythons: list[str]  # from its "Programming Language :: Python :: 3.x" classifiers
    cuda_major: str | None  # from its nvidia-*-cuNN or cuda-python pins
    prerelease: bool = False  # 1.4.0rc1: offered by `plan` only as a pre-release

    def summary(self) -> str:
        cuda = f", CUDA {self.cuda_major}" if self.cuda_major else ""
        tensorrt = f", TensorRT {self.tensorrt}" if self.tensorrt else ""
        return f"{self.version} (torch {self.torch}{tensorrt}{cuda}, Python {', '.join(self.pythons)})"

    def supports_torch(self, version: str) -> bool:
        from packaging.specifiers import SpecifierSet

        return SpecifierSet(self.torch, prereleases=True).contains(version.split("+")[0], prereleases=True)


def trtllm_from_metadata(version: str, requires: Iterable[str], classifiers: Iterable[str]) -> TrtllmRelease:
    specifiers: dict[str, str] = {}
    cuda_major = None
    for text in requires:
        requirement = Requirement(text)
        name = requirement.name.lower()
        specifiers[name] = str(requirement.specifier)
        if match := re.fullmatch(r"nvidia-[a-z-]+-cu(\d+)", name):
            cuda_major = match.group(1)
    if cuda_major is None and (match := re.search(r">=\s*(\d+)", specifiers.get("cuda-python", ""))):
        cuda_major = match.group(1)
    python_classifier = re.compile(r"Programming Language :: Python :: 3\.\d+")
    pythons = sorted(
        {c.rsplit("::", 1)[1].strip() for c in classifiers if python_classifier.fullmatch(c)}, key=version_key
    )
    return TrtllmRelease(
        version,
        specifiers.get("torch", ""),
        specifiers.get("tensorrt", ""),
        pythons,
        cuda_major,
        prerelease=Version(version).is_prerelease,
    )


@dataclass
class TrtllmTable:
    """Every TensorRT-LLM release read so far: those whose metadata pins torch, and the versions
    whose stubs pin nothing (the 0.x stubs only fail at install), kept so they are not read again."""

    releases: dict[str, TrtllmRelease] = field(default_factory=dict)
    without_pins: set[str] = field(default_factory=set)

    def known(self) -> set[str]:
        return set(self.releases) | self.without_pins

    def newest(self, prerelease: bool) -> TrtllmRelease | None:
        candidates = [r for r in self.releases.values() if r.prerelease == prerelease]
        return max(candidates, key=lambda r: Version(r.version), default=None)


def trtllm_stub_versions(index_url: str) -> dict[str, str]:
    """Version -> URL of every tensorrt-llm stub sdist an index lists."""
    prefix, suffix = "tensorrt_llm-", ".tar.gz"
    return {
        f.filename[len(prefix) : -len(suffix)]: f.url
        for f in pypi.index_files("tensorrt-llm", index_url, suffix)
        if f.filename.startswith(prefix)
    }


def read_trtllm_stub(version: str, url: str) -> TrtllmRelease | None:
    """A release's pins from its stub sdist (which carries them but is never installed), or
    None when the stub pins no torch."""
    metadata = pypi.sdist_metadata(url)
    if metadata is None:
        return None
    release = trtllm_from_metadata(version, pypi.requirements(metadata), metadata.get_all("Classifier") or [])
    return release if release.torch else None


def read_trtllm_releases(index_url: str, table: TrtllmTable, workers: int = 8) -> list[str]:
    """Add every release the index lists and the table lacks (a release never changes, so the
    table is the cache). Returns the versions added."""
    known = table.known()
    stubs = {v: url for v, url in trtllm_stub_versions(index_url).items() if v not in known}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        read = dict(zip(stubs, pool.map(lambda item: read_trtllm_stub(*item), stubs.items()), strict=True))
    for version, release in read.items():
        if release is None:
            table.without_pins.add(version)
        else:
            table.releases[version] = release
    return sorted(read, key=Version)


def load_trtllm_table(path: Path = TRTLLM) -> TrtllmTable:
    if not path.exists():
        return TrtllmTable()
    document = json.loads(path.read_text())
    releases = {v: TrtllmRelease(**entry) for v, entry in document["releases"].items()}
    return TrtllmTable(releases, set(document.get("without_pins", [])))


def load_trtllm(path: Path = TRTLLM) -> dict[str, TrtllmRelease]:
    return load_trtllm_table(path).releases


def save_trtllm(table: TrtllmTable, path: Path = TRTLLM) -> None:
    document = {
        "comment": "Generated by `python -m builder compat refresh` from the PKG-INFO of PyPI's tensorrt-llm stubs.",
        "releases": {v: asdict(table.releases[v]) for v in sorted(table.releases, key=Version)},
        "without_pins": sorted(table.without_pins, key=Version),
    }
    confined.write_text(path, json.dumps(document, indent=1) + "\n")
