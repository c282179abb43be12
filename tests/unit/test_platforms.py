"""The platform axis: facts per architecture from the wheels' own metadata, arm64 cells, tags
shared across platforms (one multi-arch index), and what each platform's lock and wheels target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.errors import UserError
from builder.facts.compat import TorchWheels
from builder.lock import requirements as lock
from builder.oci.registry import OCI_INDEX, Manifest
from builder.plan.matrix import load_matrix
from builder.publish import multiarch
from builder.wheelhouse import wheelchoice
from tests.conftest import CU128, torch_build

REPO = Path(__file__).resolve().parents[2]
# torch 2.9.1's Requires-Dist, as both its x86_64 and aarch64 wheels carry it: the CUDA
# libraries are for x86_64 only, so PyPI's aarch64 wheel is a CPU build.
X86_ONLY = [
    r.replace('platform_system == "Linux"', 'platform_system == "Linux" and platform_machine == "x86_64"')
    for r in CU128
]
PLATFORM_AXIS = "  flavor: [runtime, devel]\n  platform: [linux/amd64, linux/arm64]\n"
# Edits of tests/fixtures/matrix.yaml, as (old, new):
AXIS = ("  flavor: [runtime, devel]\n", PLATFORM_AXIS)
NO_ACCEL_TAG = ('tag: "{torch}-{accel}-py{python}-{base}-{flavor}"', 'tag: "{torch}-py{python}-{base}-{flavor}"')
MINOR_ALIAS = ('  - template: "{torch_minor}-{cuda_tag}-{flavor}"', '  - template: "{torch_minor}-{flavor}"')
AMD64_ALIAS = ("    where: {base: bookworm}\n", "    where: {base: bookworm, platform: linux/amd64}\n")


@pytest.fixture
def arm_wheels(wheels: TorchWheels) -> TorchWheels:
    pythons = ["3.10", "3.11", "3.12", "3.13", "3.14"]
    wheels.table["pypi"]["2.9.1"] = torch_build("2.9.1", pythons, "2.28", [*X86_ONLY, "filelock"])
    arm = torch_build("2.9.1", pythons, "2.28", [*X86_ONLY, "filelock"], "linux/arm64")
    wheels.table["pypi"][arm.key] = arm
    return wheels


def refusal(matrix_file: Path, wheels: TorchWheels, *edits: tuple[str, str]) -> str:
    """The one line load_matrix refuses the edited matrix with."""
    for old, new in edits:
        edit(matrix_file, old, new)
    with pytest.raises(UserError) as caught:
        load_matrix(matrix_file, wheels)
    return caught.value.line()


def line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def edit(path: Path, old: str, new: str) -> Path:
    text = path.read_text()
    assert old in text, f"fixture does not contain {old!r}"
    path.write_text(text.replace(old, new, 1))
    return path


def test_requirement_markers_are_read_for_each_wheels_architecture(arm_wheels: TorchWheels) -> None:
    x86, arm = arm_wheels.table["pypi"]["2.9.1"], arm_wheels.table["pypi"]["2.9.1@linux/arm64"]
    assert (x86.cuda, x86.cudnn, x86.platform) == ("12.8", "9.10.2.21", "linux/amd64")
    assert (arm.cuda, arm.cudnn, arm.pins, arm.platform) == ("cpu", None, {}, "linux/arm64")


def test_the_committed_facts_know_pypis_aarch64_wheels() -> None:
    # Read by `compat refresh` from PyPI: 2.9.1's aarch64 wheel is a CPU build, 2.15.0's a CUDA 13.2 one.
    pypi = TorchWheels.load().table["pypi"]
    assert pypi["2.9.1@linux/arm64"].cuda == "cpu" and pypi["2.9.1"].cuda == "12.8"
    assert pypi["2.15.0@linux/arm64"].cuda == "13.2"
    assert pypi["2.15.0@linux/arm64"].cudnn == pypi["2.15.0"].cudnn


def test_a_platform_axis_makes_an_arm64_cell_of_each_combination(matrix_file: Path, arm_wheels: TorchWheels) -> None:
    edit(matrix_file, *AXIS)
    edit(matrix_file, *AMD64_ALIAS)
    edit(matrix_file, "flavor: runtime}", "flavor: runtime, platform: linux/amd64}")  # the flagship
    grid = load_matrix(matrix_file, arm_wheels)
    arm = grid.cell("2.9.1-cpu-bookworm-runtime-arm64")
    assert (arm.platform, arm.arch, arm.base.arch, arm.torch.cuda) == ("linux/arm64", "arm64", "arm64", "cpu")
    assert arm.base.local_tag == "torch-images/base:bookworm-arm64"
    assert arm.tag == "2.9.1-cpu-py3.11-bookworm-runtime"  # a CPU build: not the x86 cell's tag
    assert grid.platforms_of(arm) == [arm]
    assert grid.cell("2.9.1-cu12.8-bookworm-runtime").platform == "linux/amd64"
    # 2.6.0 on arm64 is missing from these facts: rejected with its reason, the rest build
    reasons = {r.name: r.reason for r in grid.rejected}
    assert reasons["2.6.0-bookworm-runtime-arm64"] == (
        "index 'pypi' has no linux/arm64 wheel of torch 2.6.0; remove linux/arm64 for it or set index:"
    )


def test_cells_on_two_platforms_may_share_a_tag_and_become_one_index(
    matrix_file: Path, arm_wheels: TorchWheels
) -> None:
    edit(matrix_file, *AXIS)
    edit(matrix_file, *NO_ACCEL_TAG)
    edit(matrix_file, *MINOR_ALIAS)
    grid = load_matrix(matrix_file, arm_wheels)
    x86 = grid.cell("2.9.1-cu12.8-bookworm-runtime")
    group = grid.platforms_of(x86)
    assert [c.name for c in group] == ["2.9.1-cu12.8-bookworm-runtime", "2.9.1-cpu-bookworm-runtime-arm64"]
    assert {c.aliases for c in group} == {("2.9-runtime", "latest")}  # the flagship is both platforms
    assert grid.flagship is x86  # this host's platform
    assert multiarch.image_tag(grid, group[1]) == "2.9.1-py3.11-bookworm-runtime-arm64"


def test_a_tag_shared_on_one_platform_is_still_refused(matrix_file: Path, arm_wheels: TorchWheels) -> None:
    edit(matrix_file, 'tag: "{torch}-{accel}-py{python}-{base}-{flavor}"', 'tag: "{torch}-{base}"')
    with pytest.raises(UserError, match=r"both get the tag '2\.13\.0-bookworm'"):
        load_matrix(matrix_file, arm_wheels)


def test_platforms_of_one_tag_must_share_their_aliases(matrix_file: Path, arm_wheels: TorchWheels) -> None:
    line = refusal(matrix_file, arm_wheels, AXIS, NO_ACCEL_TAG)
    assert "share the tag '2.9.1-py3.11-bookworm-runtime' (one image per platform) but not their aliases" in line
    assert "give them the same aliases" in line


def test_an_unknown_platform_is_one_line_naming_the_known_ones(matrix_file: Path, arm_wheels: TorchWheels) -> None:
    unknown = ("  flavor: [runtime, devel]\n", "  flavor: [runtime, devel]\n  platform: [linux/s390x]\n")
    assert refusal(matrix_file, arm_wheels, unknown) == (
        f"{matrix_file}:30: axes.platform[0]: 'linux/s390x' is not valid; "
        'write a platform: "linux/amd64" or "linux/arm64"'
    )


def test_arm64_cells_lock_and_choose_aarch64_wheels(matrix_file: Path, arm_wheels: TorchWheels) -> None:
    edit(matrix_file, *AXIS)
    edit(matrix_file, *AMD64_ALIAS)
    edit(matrix_file, "flavor: runtime}", "flavor: runtime, platform: linux/amd64}")  # the flagship
    grid = load_matrix(matrix_file, arm_wheels)
    arm, x86 = grid.cell("2.9.1-cpu-bookworm-runtime-arm64"), grid.cell("2.9.1-cu12.8-bookworm-runtime")
    assert lock.manylinux_target(arm.base.glibc, arm.platform) == "aarch64-manylinux_2_36"
    assert lock.stack_fingerprint(arm, grid) != lock.stack_fingerprint(grid.cell("2.9.1-cu12.8-bookworm-runtime"), grid)
    arm_tags = {str(t) for t in wheelchoice.target_tags(arm)}
    assert "cp311-cp311-manylinux_2_28_aarch64" in arm_tags and not any("x86_64" in t for t in arm_tags)
    assert "cp311-cp311-manylinux_2_28_x86_64" in {str(t) for t in wheelchoice.target_tags(x86)}


def test_the_shipped_flagship_is_one_tag_for_amd64_and_arm64() -> None:
    grid = load_matrix(REPO / "matrix.yaml")
    group = grid.platforms_of(grid.flagship)
    assert [c.platform for c in group] == ["linux/amd64", "linux/arm64"]
    assert group[1].name == grid.flagship.name + "-arm64" and group[1].is_cuda
    assert group[0].aliases == group[1].aliases and "latest" in group[1].aliases
    spec = json.loads((group[1].directory / "spec.json").read_text())
    assert spec["platform"] == "linux/arm64"


def _manifest(n: int) -> Manifest:
    return Manifest.of(json.dumps({"schemaVersion": 2, "n": n}).encode(), "application/vnd.oci.image.manifest.v1+json")


def test_the_index_lists_each_platform_by_digest_and_is_the_same_bytes_each_time() -> None:
    grid = load_matrix(REPO / "tests/fixtures/multiarch.yaml")
    x86, arm = grid.platforms_of(grid.flagship)
    index = multiarch.index_of(x86.tag, [(x86, _manifest(1)), (arm, _manifest(2))])
    document = json.loads(index.body)
    assert index.media_type == OCI_INDEX and document["mediaType"] == OCI_INDEX
    assert [m["platform"] for m in document["manifests"]] == [
        {"architecture": "amd64", "os": "linux"},
        {"architecture": "arm64", "os": "linux", "variant": "v8"},
    ]
    assert [m["digest"] for m in document["manifests"]] == [_manifest(1).digest, _manifest(2).digest]
    assert multiarch.index_of(x86.tag, [(x86, _manifest(1)), (arm, _manifest(2))]).digest == index.digest
    assert multiarch.index_of(x86.tag, [(x86, _manifest(1)), (arm, _manifest(3))]).digest != index.digest


def test_publishing_some_platforms_of_a_tag_is_refused_before_anything_is_pushed() -> None:
    grid = load_matrix(REPO / "tests/fixtures/multiarch.yaml")
    x86, arm = grid.platforms_of(grid.flagship)
    with pytest.raises(UserError) as caught:
        multiarch.check_complete(grid, [arm])
    assert caught.value.message == (
        f"{arm.tag} is one tag for linux/amd64, linux/arm64: publish {arm.name} together with {x86.name}; "
        "nothing pushed"
    )
    multiarch.check_complete(grid, [x86, arm])


def test_an_alias_over_different_images_on_two_platforms_is_refused(matrix_file: Path, arm_wheels: TorchWheels) -> None:
    # 2.9-runtime would name the x86 CUDA image and the arm64 CPU image: which one moves it?
    line = refusal(matrix_file, arm_wheels, AXIS, MINOR_ALIAS)
    cells = "2.9.1-cu12.8-bookworm-runtime (linux/amd64) and 2.9.1-cpu-bookworm-runtime-arm64 (linux/arm64)"
    assert f"cells {cells}" in line
    assert "both get '2.9-runtime' but are different images" in line and "narrow it with where:" in line


def test_latest_over_different_images_on_two_platforms_names_the_flagship(
    matrix_file: Path, arm_wheels: TorchWheels
) -> None:
    line = refusal(matrix_file, arm_wheels, AXIS, AMD64_ALIAS)
    assert line.startswith(f"{matrix_file}:{line_of(matrix_file, 'flagship:')}: flagship: cells ")
    assert "both get 'latest' but are different images" in line
    assert "narrow the flagship (platform: linux/amd64, say)" in line
