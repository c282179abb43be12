"""publish.soci: the SOCI index `soci create` made is pushed only once it is shown to index this
image, a machine without what it needs is told so before anything is sent, and the soci CLI
comes from PATH or from the Debian package data/tools.yaml pins. The integration
test (tests/integration/test_publish.py) makes a real index and lazily pulls by it."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from securesystemslib.signer import CryptoSigner

from builder.config import platform
from builder.errors import UserError
from builder.oci.registry import OCI_MANIFEST, Manifest
from builder.publish import attachments, provenance, soci
from builder.wheelhouse import tools
from builder.wheelhouse.fileref import FileRef

LAYERS = ["sha256:" + "a" * 64, "sha256:" + "b" * 64]
IMAGE = Manifest.of(
    json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": "sha256:" + "c" * 64,
                "size": 9,
            },
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest, "size": 99}
                for digest in LAYERS
            ],
        }
    ).encode(),
    OCI_MANIFEST,
)


def made_by_soci() -> dict[str, Any]:
    """An index in the shape soci 0.4.1's `soci create` writes it (seen running Debian's package)."""
    return {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": soci.INDEX_TYPE, "digest": soci.EMPTY_CONFIG_DIGEST, "size": 2},
        "layers": [
            {
                "mediaType": "application/octet-stream",
                "digest": "sha256:" + "3" * 64,
                "size": 164976,
                "annotations": {
                    "com.amazon.soci.image-layer-digest": LAYERS[1],
                    "com.amazon.soci.image-layer-mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                },
            }
        ],
        "subject": {"mediaType": OCI_MANIFEST, "digest": IMAGE.digest, "size": len(IMAGE.body)},
        "annotations": {"com.amazon.soci.build-tool-identifier": "AWS SOCI CLI v0.1"},
    }


def test_an_index_of_this_image_gives_its_ztocs() -> None:
    assert soci.check_index(made_by_soci(), IMAGE) == ["sha256:" + "3" * 64]


def _edited(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    index = copy.deepcopy(made_by_soci())
    where: Any = index
    for key in path[:-1]:
        where = where[key]
    where[path[-1]] = value
    return index


@pytest.mark.parametrize(
    ("index", "needle"),
    [
        ([], "not an OCI image manifest"),
        (_edited(("config", "mediaType"), "application/vnd.oci.image.config.v1+json"), "its config is not"),
        (_edited(("config", "digest"), "sha256:" + "4" * 64), "its config is not"),
        (_edited(("subject", "digest"), "sha256:" + "9" * 64), "its subject is not the image"),
        (_edited(("subject",), None), "its subject is not the image"),
        (_edited(("layers",), []), "it indexes no layer"),
        (
            _edited(("layers", 0, "annotations", "com.amazon.soci.image-layer-digest"), "sha256:" + "e" * 64),
            "a layer the image does not have",
        ),
        (_edited(("layers", 0, "digest"), "sha256:../../etc/passwd"), "not a sha256 blob"),
        (_edited(("layers", 0, "annotations"), "x"), "a layer the image does not have"),
    ],
)
def test_an_index_that_is_not_one_of_this_image_is_one_line_and_nothing_is_pushed(index: Any, needle: str) -> None:
    with pytest.raises(UserError) as refused:
        soci.check_index(index, IMAGE)
    assert needle in refused.value.line() and "\n" not in refused.value.line()


def test_without_soci_on_path_the_pinned_package_for_this_machine_is_fetched_and_unpacked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    package = tmp_path / "package"
    (package / "DEBIAN").mkdir(parents=True)
    (package / "DEBIAN" / "control").write_text(
        "Package: soci-snapshotter\nVersion: 0.4.1-6\nArchitecture: all\nMaintainer: x <x@x>\nDescription: x\n"
    )
    (package / "usr" / "bin").mkdir(parents=True)
    (package / "usr" / "bin" / "soci").write_text("#!/bin/sh\necho soci\n")
    deb = tmp_path / "soci.deb"
    subprocess.run(["dpkg-deb", "--build", str(package), str(deb)], check=True, capture_output=True)
    asked: list[FileRef] = []

    class Cache:  # the wheelhouse: its sha256 check is tested with the wheelhouse
        def fetch(self, ref: FileRef) -> Path:
            asked.append(ref)
            return deb

    real_which = shutil.which
    monkeypatch.setattr(tools.shutil, "which", lambda name: None if name == "soci" else real_which(name))
    monkeypatch.setenv("TORCH_IMAGES_CACHE", str(tmp_path / "cache"))
    found = Path(tools.binary("soci", "soci-snapshotter", Cache()))  # type: ignore[arg-type]
    assert found.is_file() and found.read_text() == "#!/bin/sh\necho soci\n"
    pinned = tools.load()["soci-snapshotter"].deb_for(platform.host().debian)
    assert asked == [pinned] and pinned.url.startswith("http://deb.debian.org/debian/pool/")
    with pytest.raises(UserError) as refused:
        tools.pinned("soci-not-there", "soci-snapshotter", Cache())  # type: ignore[arg-type]
    assert "lists no binary 'soci-not-there'" in refused.value.line()


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (("pool/main/g/golang-github-awslabs-soci-snapshotter/", "pool/../../etc/"), "tools.yaml"),
        (("pool/main/g/golang-github-awslabs-soci-snapshotter/", "pool/%2e%2e/%2E%2E/etc/"), "tools.yaml"),
        (("sha256: 987a1c", "sha256: 987A1C"), "64 lower-case hex digits"),
        (("      arm64:", "      s390x:"), "amd64"),
    ],
)
def test_a_tools_file_that_is_off_is_one_line_naming_it(edit: tuple[str, str], needle: str, tmp_path: Path) -> None:
    text = tools.TOOLS_FILE.read_text()
    assert edit[0] in text
    (tmp_path / "tools.yaml").write_text(text.replace(edit[0], edit[1], 1))
    with pytest.raises(UserError) as refused:
        tools.load.__wrapped__(tmp_path / "tools.yaml")
    assert needle in refused.value.line() and "tools.yaml" in refused.value.line()


def test_without_root_publish_is_told_how_to_run_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(soci.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(soci.privilege, "root_prefix", lambda: None)
    with pytest.raises(UserError) as refused:
        soci.tools(engine=None)  # type: ignore[arg-type]
    assert "as root" in refused.value.line() and "publish.soci: false" in refused.value.line()


class _Registry:
    """An image and what is listed as attached to it: the listing is anyone's to write."""

    def __init__(self, indexes: list[dict[str, Any]], blobs: set[str]) -> None:
        self.manifests = {IMAGE.digest: IMAGE}
        for index in indexes:
            made = Manifest.of(json.dumps(index).encode(), OCI_MANIFEST)
            self.manifests[made.digest] = made
        self.listed = [{"digest": digest} for digest in self.manifests if digest != IMAGE.digest]
        self.blobs = blobs

    def manifest(self, repository: str, reference: str) -> Manifest | None:
        return self.manifests.get(reference)

    def referrers(self, repository: str, subject: str, artifact_type: str | None = None) -> list[dict[str, Any]]:
        return self.listed

    def has_blob(self, repository: str, digest: str) -> bool:
        return digest in self.blobs


class _Item:
    digest = IMAGE.digest
    image_id = "sha256:" + "9" * 64


def test_only_an_index_the_teams_key_named_that_proves_to_be_this_images_counts_as_attached(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 47: anyone who could push attached an index first, and publish then made none.
    Issue 57: a third party's well-formed index of the image still stood in for the team's: an
    index is kept only where a statement the team's key verified names it."""
    ours_digest = Manifest.of(json.dumps(made_by_soci()).encode(), OCI_MANIFEST).digest
    statements: list[attachments.Signed] = []
    monkeypatch.setattr(attachments.Door, "signed", lambda self, *args: statements)
    key = CryptoSigner.generate_ed25519().public_key
    other_image = copy.deepcopy(made_by_soci())
    other_image["subject"]["digest"] = "sha256:" + "e" * 64
    ztoc = made_by_soci()["layers"][0]["digest"]
    ours = _Registry([other_image, made_by_soci()], {ztoc})
    assert soci.attached(attachments.Door(ours, "torch"), _Item(), key) is None  # well formed, and no one's word
    assert soci.attached(attachments.Door(ours, "torch"), _Item(), None) is None  # no key: publish makes its own
    statement = {"predicateType": provenance.SOCI_INDEX, "predicate": {"index": {"digest": ours_digest}}}
    statements.append(attachments.Signed(None, {}, statement, True))  # type: ignore[arg-type]
    for listed, blobs in (([other_image], {ztoc}), ([made_by_soci()], set()), ([{"junk": 1}], {ztoc})):
        assert soci.attached(attachments.Door(_Registry(listed, blobs), "torch"), _Item(), key) is None  # type: ignore[arg-type]
    found = soci.attached(attachments.Door(ours, "torch"), _Item(), key)  # type: ignore[arg-type]
    assert found == ours_digest


def test_the_statement_publish_signs_names_the_index_it_made() -> None:
    about = provenance.Subject("r/torch", IMAGE.digest, "sha256:" + "9" * 64, "b" * 32)
    statement = provenance.soci_index_statement(about, "sha256:" + "5" * 64)
    assert statement["predicateType"] == provenance.SOCI_INDEX
    assert provenance.soci_index_named(statement["predicate"]) == "sha256:" + "5" * 64
    assert provenance.is_about(statement, IMAGE.digest, about.image_id)
    assert provenance.soci_index_named({"index": "x"}) is None


# ---------------------------------------------------------------- v2: the SOCI-enabled image (issue 59)


def _v1() -> Manifest:
    return Manifest.of(json.dumps(made_by_soci()).encode(), OCI_MANIFEST)


def test_the_v2_index_has_v1s_ztocs_v2s_config_and_no_subject_as_soci_writes_it() -> None:
    index = json.loads(soci.v2_index(_v1(), IMAGE).body)
    assert index["config"] == {"mediaType": "application/vnd.amazon.soci.index.v2+json",
                               "digest": soci.EMPTY_CONFIG_DIGEST, "size": 2}  # fmt: skip
    assert "subject" not in index and index["mediaType"] == OCI_MANIFEST
    [ztoc] = index["layers"]
    assert ztoc["digest"] == "sha256:" + "3" * 64 and ztoc["mediaType"] == "application/octet-stream"
    assert ztoc["annotations"] == {
        "com.amazon.soci.image-layer-digest": LAYERS[1],
        "com.amazon.soci.image-layer-mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
    }
    assert index["annotations"] == {"com.amazon.soci.build-tool-identifier": "AWS SOCI CLI v0.1"}


def test_the_enabled_image_is_the_same_config_and_layers_bound_both_ways_to_its_index() -> None:
    docker_image = Manifest.of(
        json.dumps({**json.loads(IMAGE.body), "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                    "config": {**json.loads(IMAGE.body)["config"],
                               "mediaType": "application/vnd.docker.container.image.v1+json"}}).encode(),
        "application/vnd.docker.distribution.manifest.v2+json",
    )  # fmt: skip
    index = soci.v2_index(_v1(), docker_image)
    manifest = soci.enabled_manifest(docker_image, index)
    document = json.loads(manifest.body)
    # what soci convert writes: OCI types, the same config bytes (so the same image ID) and layers
    assert document["mediaType"] == OCI_MANIFEST and document["config"]["mediaType"] == soci.OCI_CONFIG
    assert document["config"]["digest"] == "sha256:" + "c" * 64
    assert [layer["digest"] for layer in document["layers"]] == LAYERS
    assert document["annotations"] == {"com.amazon.soci.index-digest": index.digest}
    amd64 = platform.of("linux/amd64").descriptor()
    enabled = json.loads(soci.enabled_image(manifest, index, amd64).body)
    assert enabled["mediaType"] == "application/vnd.oci.image.index.v1+json"
    image_entry, index_entry = enabled["manifests"]
    named = {"com.amazon.soci.index-digest": index.digest}
    assert image_entry == {"mediaType": OCI_MANIFEST, "digest": manifest.digest, "size": len(manifest.body),
                           "annotations": named, "platform": amd64}  # fmt: skip
    assert index_entry["artifactType"] == "application/vnd.amazon.soci.index.v2+json"
    assert index_entry["annotations"] == {"com.amazon.soci.image-manifest-digest": manifest.digest}
    assert index_entry["platform"] == amd64 and index_entry["digest"] == index.digest
    assert soci.check_enabled(document, json.loads(index.body), docker_image, index) == ["sha256:" + "3" * 64]
    assert soci.enabled_tag("2.15.0-cu13.2-cudnn9.26-py3.11-bookworm-runtime").endswith("-runtime-soci")


@pytest.mark.parametrize(
    ("part", "edit", "needle"),
    [
        ("manifest", lambda m: m["config"].update(digest="sha256:" + "d" * 64), "another config"),
        ("manifest", lambda m: m["layers"].pop(), "other layers"),
        ("manifest", lambda m: m.pop("annotations"), "does not name its SOCI index"),
        ("index", lambda i: i.update(subject={"digest": IMAGE.digest}), "has a subject"),
        ("index", lambda i: i["config"].update(mediaType=soci.INDEX_TYPE), "config is not"),
        (
            "index",
            lambda i: i["layers"][0]["annotations"].update({soci.LAYER_ANNOTATION: "sha256:" + "e" * 64}),
            "a layer the image does not have",
        ),
        (
            "index",
            lambda i: i["layers"][0]["annotations"].update({soci.LAYER_TYPE_ANNOTATION: "x"}),
            "another media type",
        ),
    ],
)
def test_an_enabled_image_that_is_not_this_images_is_refused(part: str, edit: Any, needle: str) -> None:
    index = soci.v2_index(_v1(), IMAGE)
    manifest, index_document = json.loads(soci.enabled_manifest(IMAGE, index).body), json.loads(index.body)
    edit(manifest if part == "manifest" else index_document)
    with pytest.raises(UserError, match=needle):
        soci.check_enabled(manifest, index_document, IMAGE, index)
