"""Bases bootstrapped from a distro's archive: Ubuntu's on a Debian host, with its archive key
taken from a package pinned by sha256."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import docker
import pytest

from builder.engine import bases
from builder.errors import UserError
from builder.plan.matrix import load_matrix

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
