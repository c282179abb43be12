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
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.requirements import Requirement

from builder import paths
from builder.facts import pypi

TORCH_WHEELS = paths.DATA / "torch_wheels.json"
TRTLLM = paths.DATA / "trtllm.json"
CPYTHON_TAG = re.compile(r"^cp(\d)(\d+)$")


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


def build_from_metadata(version: str, wheels: Iterable[pypi.WheelFile], requires: Iterable[str]) -> TorchBuild:
    """Fold the wheel tags and Requires-Dist of one torch build into its facts."""
    floors: dict[str, str] = {}
    requires_python = None
    for wheel in wheels:
        tags = wheel.tags
        match = CPYTHON_TAG.match(tags["python"])
        if not match or tags["abi"] != tags["python"] or wheel.glibc_floor is None:
            continue  # free-threaded (cp313t), abi3 or non-manylinux wheels are not what images use
        floors[f"{match.group(1)}.{match.group(2)}"] = wheel.glibc_floor
        requires_python = requires_python or wheel.requires_python
    pins: dict[str, str] = {}
    specifiers: dict[str, str] = {}
    for text in requires:
        requirement = Requirement(text)
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
    )


def read_torch_builds(
    versions: Iterable[str], index_urls: Iterable[str], find_links: Iterable[Path], unreachable: list[str]
) -> list[TorchBuild]:
    """Every build of the given torch versions that one index (its URLs and find-links) serves.

    URLs that cannot be read are appended to `unreachable` and skipped.
    """
    wanted = set(versions)
    files: list[pypi.WheelFile] = []
    for directory in find_links:
        files += pypi.find_links_files("torch", directory)
    for url in index_urls:
        try:
            files += pypi.index_files("torch", url)
        except OSError as error:
            unreachable.append(f"{url} ({getattr(error, 'reason', error)})")
    by_version: dict[str, list[pypi.WheelFile]] = defaultdict(list)
    for wheel in files:
        if wheel.is_linux_x86_64() and wheel.version.split("+")[0] in wanted:
            by_version[wheel.version].append(wheel)
    builds = []
    for version, wheels in sorted(by_version.items()):
        requires = pypi.requirements(pypi.wheel_metadata(wheels[0]))
        builds.append(build_from_metadata(version, wheels, requires))
    return builds


class TorchWheels:
    """The committed table of torch builds, by index name and full version."""

    def __init__(self, table: dict[str, dict[str, TorchBuild]]) -> None:
        self.table = table

    @classmethod
    def load(cls, path: Path = TORCH_WHEELS) -> TorchWheels:
        if not path.exists():
            return cls({})
        raw = json.loads(path.read_text())["indexes"]
        return cls({index: {v: TorchBuild(**entry) for v, entry in builds.items()} for index, builds in raw.items()})

    def save(self, path: Path = TORCH_WHEELS) -> None:
        document = {
            "comment": "Generated by `python -m builder compat refresh` from the wheels' own metadata.",
            "indexes": {
                index: {version: asdict(build) for version, build in sorted(builds.items())}
                for index, builds in sorted(self.table.items())
            },
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, indent=1, sort_keys=False) + "\n")

    def builds(self, index: str, public_version: str) -> list[TorchBuild]:
        return [b for b in self.table.get(index, {}).values() if b.public_version == public_version]

    def indexes_with(self, public_version: str, cuda: str) -> list[str]:
        return sorted(
            index
            for index, builds in self.table.items()
            if any(b.public_version == public_version and b.cuda == cuda for b in builds.values())
        )


@dataclass(frozen=True)
class TrtllmRelease:
    """What one TensorRT-LLM release requires, from its own metadata."""

    version: str
    torch: str  # specifier, e.g. ">=2.7.1,<=2.8.0a0"
    tensorrt: str
    pythons: list[str]  # from its "Programming Language :: Python :: 3.x" classifiers
    cuda_major: str | None  # from its nvidia-*-cuNN or cuda-python pins

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
    return TrtllmRelease(version, specifiers.get("torch", ""), specifiers.get("tensorrt", ""), pythons, cuda_major)


def read_trtllm_release(version: str, index_url: str) -> TrtllmRelease:
    """Read a release's pins from PyPI's stub sdist, which carries them but is never installed."""
    sdists = pypi.index_files("tensorrt-llm", index_url, ".tar.gz")
    stub = next((f for f in sdists if f.filename == f"tensorrt_llm-{version}.tar.gz"), None)
    if stub is None:
        raise OSError(f"no tensorrt-llm {version} on {index_url}")
    metadata = pypi.sdist_metadata(stub.url)
    return trtllm_from_metadata(version, pypi.requirements(metadata), metadata.get_all("Classifier") or [])


def load_trtllm(path: Path = TRTLLM) -> dict[str, TrtllmRelease]:
    if not path.exists():
        return {}
    return {v: TrtllmRelease(**entry) for v, entry in json.loads(path.read_text())["releases"].items()}


def save_trtllm(table: dict[str, TrtllmRelease], path: Path = TRTLLM) -> None:
    document = {
        "comment": "Generated by `python -m builder compat refresh` from the PKG-INFO of PyPI's tensorrt-llm stubs.",
        "releases": {v: asdict(table[v]) for v in sorted(table, key=version_key)},
    }
    path.write_text(json.dumps(document, indent=1) + "\n")
