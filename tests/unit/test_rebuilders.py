"""The rebuild quorum is counted in keys: publish.rebuilders names each rebuilder's own public key.
A quorum no listed set of keys could meet is refused where it is written; the team's key, or one
key under two names, is refused where the keys are read (trust.rebuilders)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from securesystemslib.signer import CryptoSigner

from builder.errors import UserError
from builder.facts.compat import TorchWheels
from builder.oci.registry import OCI_MANIFEST, Manifest, Registry
from builder.plan.matrix import load_matrix
from builder.publish import provenance, rebuilds, trust
from builder.publish.publisher import Publisher


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


def _image_manifest(image_id: str) -> bytes:
    return json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "layers": [],
                       "config": {"mediaType": "x", "digest": image_id, "size": 2}}).encode()  # fmt: skip


class _TwoTags:
    """A registry holding the staged tag and the run's rebuild tag, each as the test says."""

    host = "127.0.0.1:5000"

    def __init__(self, staged: str, rebuilt: str) -> None:
        self.images = {"staged": staged, "rebuild": rebuilt}

    def manifest(self, repository: str, reference: str) -> object:
        image_id = self.images["rebuild" if reference.endswith(".rebuild") else "staged"]
        return Manifest.of(_image_manifest(image_id), OCI_MANIFEST)

    @staticmethod
    def is_digest(text: str) -> bool:
        return Registry.is_digest(text)


def test_sign_rebuild_signs_nothing_where_the_rebuild_in_the_registry_is_another_image(tmp_path: Path) -> None:
    """The rebuild job holds no key: what sign-rebuild signs is decided by the two config digests
    the registry serves, never by the rebuild job's record; the team's key is refused."""
    grid = load_matrix(Path(__file__).resolve().parents[2] / "matrix.yaml")
    cell = grid.cell("2.13.0-cpu-bookworm-runtime")
    signer = CryptoSigner.generate_ed25519()
    registry = _TwoTags("sha256:" + "1" * 64, "sha256:" + "2" * 64)
    publisher = Publisher(registry, grid, lambda _: None, signer=signer)  # type: ignore[arg-type]
    with pytest.raises(UserError, match=r"is image 222222222222, the staged one 111111111111: they disagree"):
        rebuilds.sign_rebuilds(publisher, [cell], "7", tmp_path)
    team = Publisher(registry, grid, lambda _: None, signer=signer, key=signer.public_key)  # type: ignore[arg-type]
    with pytest.raises(UserError, match="the signing key is the team's"):
        rebuilds.sign_rebuilds(team, [cell], "7", tmp_path)
    unsigned = Publisher(registry, grid, lambda _: None)  # type: ignore[arg-type]
    with pytest.raises(UserError, match="TORCH_IMAGES_REBUILD_KEY"):
        rebuilds.sign_rebuilds(unsigned, [cell], "7", tmp_path)
    assert rebuilds.rebuild_tag(publisher, cell, "7") == f"{cell.tag}.staging-7.rebuild"


@pytest.mark.parametrize(
    "record",
    [None, {"tag": "other", "builder": "Docker 29"}, {"builder": "Docker 29"}, {"tag": "T", "builder": "x\x1b[2J"},
     {"tag": "T", "builder": "x" * 201}, {"tag": "T", "builder": 7}],
)  # fmt: skip
def test_the_engine_a_rebuild_record_names_is_refused_unless_it_is_the_rebuild_jobs_record(
    tmp_path: Path, record: object
) -> None:
    if record is not None:
        (tmp_path / "T.json").write_text(json.dumps(record))
    with pytest.raises(UserError, match=r"not a rebuild record of T|no T\.json"):
        rebuilds.reported_builder(tmp_path, "T")
    (tmp_path / "T.json").write_text(json.dumps({"tag": "T", "builder": "Docker 29.0.1 (overlayfs)"}))
    assert rebuilds.reported_builder(tmp_path, "T") == "Docker 29.0.1 (overlayfs)"
