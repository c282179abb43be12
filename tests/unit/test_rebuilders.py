"""The rebuild quorum is counted in keys: publish.rebuilders names each rebuilder's own public key.
A quorum no listed set of keys could meet is refused where it is written; the team's key, or one
key under two names, is refused where the keys are read (trust.rebuilders)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from builder.errors import UserError
from builder.facts.compat import TorchWheels
from builder.plan.matrix import load_matrix
from builder.publish import provenance, trust


def public_key_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    path.write_bytes(key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return path


def with_publish(matrix_file: Path, block: str) -> Path:
    matrix_file.write_text(matrix_file.read_text() + block)
    return matrix_file


def test_a_quorum_larger_than_the_listed_rebuilders_is_refused_at_its_line(
    matrix_file: Path, wheels: TorchWheels
) -> None:
    with_publish(matrix_file, "publish:\n  require_rebuilds: 2\n  rebuilders:\n    alice: keys/alice.pub\n")
    with pytest.raises(UserError) as refused:
        load_matrix(matrix_file, wheels)
    line = refused.value.line()
    assert "publish.require_rebuilds needs 2 rebuilder key(s) but publish.rebuilders lists 1" in line
    assert line.startswith(f"{matrix_file}:") and "the team's key never counts" in line


def test_the_ci_rebuild_job_needs_a_rebuilder_key_listed(matrix_file: Path, wheels: TorchWheels) -> None:
    with_publish(matrix_file, "")
    text = matrix_file.read_text()
    matrix_file.write_text(text.replace("\nci:\n", "\nci:\n  rebuild_check: true\n", 1) if "\nci:\n" in text
                           else text + "ci:\n  rebuild_check: true\n")  # fmt: skip
    with pytest.raises(UserError, match=re.escape("ci.rebuild_check needs 1 rebuilder key(s)")):
        load_matrix(matrix_file, wheels)


def test_each_rebuilder_key_is_read_beside_the_matrix(matrix_file: Path, wheels: TorchWheels) -> None:
    for name in ("alice", "bob"):
        public_key_file(matrix_file.parent / "keys" / f"{name}.pub")
    block = "publish:\n  require_rebuilds: 2\n  rebuilders:\n    alice: keys/alice.pub\n    bob: keys/bob.pub\n"
    grid = load_matrix(with_publish(matrix_file, block), wheels)
    found = trust.rebuilders(grid, None)
    assert [r.name for r in found] == ["alice", "bob"] and found[0].key.keyid != found[1].key.keyid


@pytest.mark.parametrize(
    ("listed", "refusal"),
    [
        ("    team: keys/team.pub\n", "publish.rebuilders.team is the team's own key"),
        ("    alice: keys/alice.pub\n    mallory: keys/mallory.pub\n", "the same key as publish.rebuilders.alice"),
        ("    linked: keys/linked.pub\n", "is a symbolic link"),
        ("    broken: keys/broken.pub\n", "publish.rebuilders.broken (keys/broken.pub): not a PEM public key"),
    ],
)
def test_the_teams_key_one_key_twice_a_link_or_no_key_is_refused_in_one_line(
    matrix_file: Path, wheels: TorchWheels, listed: str, refusal: str
) -> None:
    keys = matrix_file.parent / "keys"
    team = public_key_file(keys / "team.pub")
    alice = public_key_file(keys / "alice.pub")
    (keys / "mallory.pub").write_bytes(alice.read_bytes())
    (keys / "linked.pub").symlink_to(alice)
    (keys / "broken.pub").write_text("not a key\n")
    grid = load_matrix(with_publish(matrix_file, f"publish:\n  rebuilders:\n{listed}"), wheels)
    with pytest.raises(UserError, match=re.escape(refusal)):
        trust.rebuilders(grid, provenance.load_public_key(team))
