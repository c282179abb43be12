"""torch's releases on a package index, each with the CUDA line it is built for and the Pythons its
wheels cover, read from the wheels' own file names and METADATA as `compat refresh` reads them:
what `update --releases` compares the matrix with."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from email.message import Message

from packaging.version import InvalidVersion, Version

from builder.config import platform as platforms
from builder.facts import compat, pypi

# A listing with more releases than this is not torch's (PyPI lists about 60); each new one costs
# a metadata read, so a hostile index cannot make the daily job read without end.
MAX_NEW_RELEASES = 40


def release_version(text: str) -> Version | None:
    """A final release's version (2.14.1, or 2.14.1+cu130 on an index of one CUDA line), or None
    for a pre-release or a dev build, or a name that is no version at all."""
    try:
        version = Version(text)
    except InvalidVersion:
        return None
    return None if version.is_prerelease or version.is_devrelease else version


def releases_on(files: Iterable[pypi.WheelFile], platform: str = platforms.DEFAULT) -> dict[str, list[pypi.WheelFile]]:
    """The final releases an index lists with a version-specific CPython wheel for the platform
    (what images install), each with those wheels."""
    wheel_arch = platforms.of(platform).wheel
    found: dict[str, list[pypi.WheelFile]] = defaultdict(list)
    for wheel in files:
        try:
            version, arch, python = wheel.version, wheel.linux_arch, wheel.cpython
        except ValueError:
            continue  # not a wheel file name: nothing an image could install
        if arch == wheel_arch and python is not None and release_version(version) is not None:
            found[version].append(wheel)
    return dict(found)


def read_releases(
    index_url: str,
    known: dict[str, compat.TorchBuild],
    newer_than: str,
    metadata_of: Callable[[pypi.WheelFile], Message] = pypi.wheel_metadata,
) -> list[compat.TorchBuild]:
    """Every final torch release on the index newer than `newer_than` (for the default platform),
    as a TorchBuild. Those in `known` (data/torch_wheels.json) are taken from it; each other one
    costs one METADATA read of one of its wheels, at most MAX_NEW_RELEASES of them."""
    floor = Version(newer_than)
    listed = releases_on(pypi.index_files("torch", index_url))
    newer = sorted((v for v in listed if Version(v) > floor), key=Version)
    unknown = [v for v in newer if v not in known]
    if len(unknown) > MAX_NEW_RELEASES:
        raise OSError(
            f"{index_url}: lists {len(unknown)} torch releases newer than {newer_than} that data/ does not know, "
            f"more than the {MAX_NEW_RELEASES} a check reads; is it torch's index?"
        )
    builds = []
    for version in newer:
        if version in known:
            builds.append(known[version])
            continue
        wheels = listed[version]
        requires = pypi.requirements(metadata_of(wheels[0]))
        builds.append(compat.build_from_metadata(version, wheels, requires))
    return builds
