"""The committed compatibility data agrees with what the indexes publish today."""

from __future__ import annotations

import urllib.request

import pytest

from builder.facts import compat, pypi

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def pypi_reachable() -> None:
    try:
        urllib.request.urlopen("https://pypi.org/simple/", timeout=10)
    except OSError as error:
        pytest.skip(f"PyPI is not reachable from here ({error}); the data cannot be checked")


def test_torch_builds_on_pypi_match_their_wheels_metadata(pypi_reachable: None) -> None:
    table = compat.TorchWheels.load().table["pypi"]
    newest = sorted({b.version for b in table.values()}, key=compat.version_key)[-2:]
    for version in newest:  # each platform's wheel: one METADATA read each
        fresh = compat.read_torch_builds([version], ["https://pypi.org/simple"], [], {})
        assert {b.platform for b in fresh} == {"linux/amd64", "linux/arm64"}, version
        for build in fresh:
            assert build == table[build.key], build.key


def test_trtllm_releases_match_their_published_metadata(pypi_reachable: None) -> None:
    releases = compat.load_trtllm()
    assert releases, "data/trtllm.json is empty"
    stubs = compat.trtllm_stub_versions("https://pypi.org/simple")
    for version in ("1.0.0", compat.load_trtllm_table().newest(prerelease=False).version):  # one read each
        assert compat.read_trtllm_stub(version, stubs[version]) == releases[version], version


def test_every_trtllm_stub_on_pypi_is_a_source_distribution_not_a_wheel(pypi_reachable: None) -> None:
    # Why the builder never takes tensorrt-llm from PyPI: there is nothing there to install.
    for version in compat.load_trtllm():
        wheels = [f for f in pypi.index_files("tensorrt-llm", "https://pypi.org/simple") if f.version == version]
        assert wheels == [], f"PyPI now has real wheels of tensorrt-llm {version}: {wheels}"
