"""Offline rebuilds: a cell's bundle rebuilds it, bit for bit, with no index, mirror or registry."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from builder.assemble import build, bundle
from builder.repro import recorded
from tests.integration.conftest import REPO, BuiltCell

pytestmark = pytest.mark.integration

# Every proxy variable at a port nothing listens on: an attempt by the builder to reach the
# index, the mirror or a registry is refused. Loopback (the wheelhouse server) is exempt.
REFUSED = "http://127.0.0.1:9"
NO_NETWORK = {
    **{name: REFUSED for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy")},
    "no_proxy": "127.0.0.1,localhost",
    "NO_PROXY": "127.0.0.1,localhost",
}


def _builder(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "builder", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )


@pytest.fixture(scope="module")
def cell_bundle(built: BuiltCell, tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("bundle") / built.cell.name
    made = _builder("bundle", built.cell.name, "--output", str(output))
    assert made.returncode == 0, made.stderr
    return output


def test_the_dockerfile_reaches_nothing_but_the_wheelhouse_server(built: BuiltCell) -> None:
    # What RUN steps may fetch is what the Dockerfile names: apt's repository and pip's pages,
    # and the helper scripts, all on the loopback server. No mirror, no index.
    text = (built.cell.directory / "Dockerfile").read_text()
    urls = set(re.findall(r"https?://[^\s'\"]+", text))
    listen = built.grid.spec.wheelhouse.listen
    assert urls and all(url.startswith(f"http://{listen}/") for url in urls), urls


def test_a_bundle_rebuilds_the_same_image_offline_with_an_empty_cache(
    built: BuiltCell, cell_bundle: Path, tmp_path: Path
) -> None:
    manifest = bundle.open_bundle(cell_bundle, lambda _: None)
    assert any(name.endswith(".whl") for name in manifest.files)
    assert any(name.endswith(".deb") for name in manifest.files)
    # Nothing of the first build may serve the second: its tag, and the base's, are taken off
    # (the images stay under their IDs for the rest of the session), and the rebuild is without
    # cache, from an empty wheelhouse, with every address but loopback refused.
    base = build.cell_base(built.client, built.grid, build.preflight(built.cell, built.grid), print)
    for tag in (built.reference, base):
        built.client.api.remove_image(tag, noprune=True)
    empty_cache = tmp_path / "cache"
    rebuilt = _builder(
        "build", "--offline", "--bundle", str(cell_bundle), "--no-cache", "--no-smoke",
        env={**NO_NETWORK, "TORCH_IMAGES_CACHE": str(empty_cache), "TORCH_IMAGES_NO_PULL": "1"},
    )  # fmt: skip
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    assert f"bootstrapping {built.cell.base.distro} {built.cell.base.suite}" in rebuilt.stderr  # from its .debs
    assert built.client.images.get(built.reference).id == built.image_id
    assert built.image_id[7:19] in rebuilt.stdout
    assert any(empty_cache.rglob("*.deb")) and any(empty_cache.rglob("*.whl"))  # it came from the bundle


def test_a_bundle_with_one_file_altered_is_refused_naming_the_file(built: BuiltCell, cell_bundle: Path) -> None:
    deb = next(cell_bundle.rglob("*.deb"))
    original = deb.read_bytes()
    try:
        deb.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
        before = {image.id for image in built.client.images.list(all=True)}
        refused = _builder("build", "--offline", "--bundle", str(cell_bundle), "--no-cache", env=NO_NETWORK)
        # Progress ("checking N files against manifest.json") may precede it; the refusal is one
        # line, the last, and no traceback.
        errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
        assert refused.returncode == 2, refused.stderr
        assert len(errors) == 1 and refused.stderr.rstrip().endswith(errors[0]), refused.stderr
        assert str(deb) in errors[0] and "does not match its sha256" in errors[0], errors
        assert "Traceback" not in refused.stderr
        assert {image.id for image in built.client.images.list(all=True)} == before  # nothing built
    finally:
        deb.write_bytes(original)


def test_a_bundle_whose_file_and_manifest_line_were_changed_together_is_refused(
    built: BuiltCell, cell_bundle: Path
) -> None:
    # The review's case: a bundle that checks itself clean. The repository's own lock says no.
    lock = next(cell_bundle.rglob(f"{built.cell.name}/requirements.lock"))
    manifest_path = cell_bundle / bundle.MANIFEST
    original_lock, original_manifest = lock.read_bytes(), manifest_path.read_text()
    try:
        lock.write_bytes(original_lock.replace(b"# via torch", b"# via numpy", 1))
        name = lock.relative_to(cell_bundle).as_posix()
        manifest = json.loads(original_manifest)
        manifest["files"][name] = digests_of(lock.read_bytes())  # that one line, as the review did
        manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        assert bundle.open_bundle(cell_bundle, lambda _: None).files[name] == digests_of(lock.read_bytes())
        before = {image.id for image in built.client.images.list(all=True)}
        refused = _builder("build", "--offline", "--bundle", str(cell_bundle), "--no-cache", env=NO_NETWORK)
        errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
        assert refused.returncode == 2 and len(errors) == 1, refused.stderr
        assert "requirements.lock differs from this repository's" in errors[0] and "Traceback" not in refused.stderr
        assert {image.id for image in built.client.images.list(all=True)} == before  # nothing built
    finally:
        lock.write_bytes(original_lock)
        manifest_path.write_text(original_manifest)


def digests_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("image", ["built", "built_devel"])
def test_this_machines_build_is_the_recorded_image(image: str, request: pytest.FixtureRequest) -> None:
    # images/<cell>/image-id was recorded on another machine: this build is evidence too. A
    # change to the cell's inputs must come with a new record (`verify-repro --record`).
    built: BuiltCell = request.getfixturevalue(image)
    record = recorded.read(built.cell)
    if record is None:
        pytest.skip(f"{built.cell.name} has no recorded image ID (the shipped CPU cells have)")
    assert record.build_id == built.build_id, (
        f"{built.cell.name}'s inputs changed since its image ID was recorded: "
        f"python -m builder verify-repro --record {built.cell.name}"
    )
    assert built.image_id == record.image_id
