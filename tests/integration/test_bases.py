"""Bases bootstrapped from a distro's archive: Ubuntu's on a Debian host, with its archive key
taken from a package pinned by sha256; and a cached base that is not the recorded one."""

from __future__ import annotations

import dataclasses
import shutil
import tarfile
from pathlib import Path

import docker
import pytest

from builder import digests
from builder.assemble import build
from builder.engine import bases, ids
from builder.errors import UserError
from builder.plan.matrix import load_matrix
from builder.repro import recorded
from tests.integration.conftest import BuiltCell

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["noble", "jammy"])
def test_an_ubuntu_base_bootstraps_and_apt_in_it_checks_the_archive(client: docker.DockerClient, name: str) -> None:
    grid = load_matrix(REPO / "matrix.yaml")
    base = next(c.base for c in grid.cells if c.base.name == name)
    twin = dataclasses.replace(base, name=f"{name}-test")  # its own tag: the session removes it afterwards
    image_id = bases.bootstrap(client, twin, grid.spec.source_date_epoch, lambda _: None)
    # apt-get update verifies the archive's signatures with the keyring the image was given.
    output = client.containers.run(
        image_id,
        ["sh", "-c", ". /etc/os-release && apt-get update -q >/dev/null && echo $VERSION_CODENAME ok"],
        remove=True,
        network_mode="host",
    ).decode()
    assert output.strip().splitlines()[-1] == f"{name} ok"


def test_a_keyring_package_that_is_not_the_pinned_one_is_refused(client: docker.DockerClient, tmp_path: Path) -> None:
    grid = load_matrix(REPO / "matrix.yaml")
    base = next(c.base for c in grid.cells if c.base.name == "noble")
    assert base.keyring is not None
    wrong = base.keyring.model_copy(update={"sha256": "0" * 64})
    with pytest.raises(UserError, match=r"has sha256 36de43b1.*; the matrix pins 0{64}"):
        bases.keyring_file(wrong, tmp_path)


def test_a_base_rootfs_changed_in_the_cache_with_its_digest_never_reaches_an_image(
    built: BuiltCell, tmp_path: Path
) -> None:
    """Issues 55 and 58: a restored CI cache whose base rootfs someone changed, digest and all (a
    file planted in it), is caught by the cell's record before any step runs: the changed base
    leaves the engine and the cache and is bootstrapped again from the locked packages, and the
    build ID is the recorded one again. (A rootfs changed without its digest is caught earlier, by
    the digest: tests/unit/test_base_cache.py.)"""
    shutil.copytree(built.cell.directory, tmp_path / built.cell.name)  # a record of the test's own
    cell = dataclasses.replace(built.cell, images_root=tmp_path)
    locks = build.preflight(cell, built.grid)
    tag = build.locked_base_tag(locks)
    said: list[str] = []
    if bases.checked_cached_rootfs(tag, said.append) is None:  # the cache holds it as a bootstrap keeps it
        bases.forget_locked(built.client, tag)
    clean_reference, clean_build_id = build.cell_build_id(built.client, built.grid, locks, said.append)
    clean_base = ids.config_digest(built.client, clean_reference)
    recorded.write(cell, built.image_id, clean_build_id, clean_base)
    cached = bases.cached_rootfs(tag)
    planted = tmp_path / "planted"
    planted.write_text("not from any locked package\n")
    with tarfile.open(cached, "a") as rootfs:
        rootfs.add(planted, arcname="usr/local/bin/planted")
    cached.with_name(cached.name + ".sha256").write_text(digests.sha256_file(cached) + "\n")  # digest and all
    built.client.images.remove(tag, force=True)
    said.clear()
    reference, build_id = build.cell_build_id(built.client, built.grid, locks, said.append)
    wrong = [line for line in said if "was recorded on base" in line]
    assert len(wrong) == 1 and f"on base {clean_base[7:19]}" in wrong[0] and "bootstrapping it again" in wrong[0]
    assert (reference, build_id) == (clean_reference, clean_build_id)
    assert ids.config_digest(built.client, reference) == clean_base
    with tarfile.open(cached) as rootfs:  # the cache holds the bootstrapped base again
        assert "usr/local/bin/planted" not in rootfs.getnames()
