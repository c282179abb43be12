"""`verify --rebuild` (builder/publish/rebuild.py): its report of what differs (each path whose
content, mode, owner or kind differs between the published layer and the rebuilt one, with both
sizes), and which image of a multi-arch tag it rebuilds."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from builder.config import platform as platforms
from builder.errors import UserError
from builder.oci.registry import OCI_INDEX, OCI_MANIFEST, Manifest
from builder.publish import rebuild, verify

PUBLISHED = [
    ["opt/venv/bin/python", "file", "0o755", 10, "aa", "0:0"],
    ["opt/torch-images/spec.json", "file", "0o644", 5, "bb", "0:0"],
    ["opt/torch-images/x", "file", "0o644", 1, "cc", "0:0"],
    ["etc/gone", "file", "0o644", 1, "dd", "0:0"],
]


def test_each_differing_path_says_what_differs_and_both_sizes() -> None:
    rebuilt = [
        ["opt/venv/bin/python", "file", "0o755", 10, "aa", "0:0"],
        ["opt/torch-images/spec.json", "file", "0o644", 6, "b2", "0:0"],
        ["opt/torch-images/x", "file", "0o600", 1, "cc", "1000:1000"],
        ["etc/new", "file", "0o644", 1, "ee", "0:0"],
    ]
    assert rebuild.differing(PUBLISHED, rebuilt) == [
        "etc/gone: only in the published layer",
        "etc/new: only in the rebuilt layer",
        "opt/torch-images/spec.json: content differs (published 5 bytes, rebuilt 6 bytes)",
        "opt/torch-images/x: mode, owner differs (published 1 bytes, rebuilt 1 bytes)",
    ]


def test_at_most_twenty_paths_are_named_and_the_rest_counted() -> None:
    many = [[f"f{n:03}", "file", "0o644", 1, "x", "0:0"] for n in range(30)]
    lines = rebuild.differing(many, [])
    assert len(lines) == 21 and lines[-1] == "... and 10 more"


class _Registry:
    """A multi-arch tag: an index of an amd64 and an arm64 image, each with its config."""

    host = "127.0.0.1:5000"

    def __init__(self, platforms: list[str]) -> None:
        self.manifests: dict[str, Manifest] = {}
        self.blobs: dict[str, bytes] = {}
        entries = []
        for name in platforms:
            config = json.dumps({"architecture": name.split("/")[1], "config": {"Labels": {}}}).encode()
            config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
            self.blobs[config_digest] = config
            image = Manifest.of(json.dumps({"config": {"digest": config_digest}, "layers": []}).encode(), OCI_MANIFEST)
            self.manifests[image.digest] = image
            os_name, architecture = name.split("/")
            entries.append({"digest": image.digest, "mediaType": OCI_MANIFEST,
                            "platform": {"os": os_name, "architecture": architecture}})  # fmt: skip
        index = Manifest.of(json.dumps({"manifests": entries}).encode(), OCI_INDEX)
        self.manifests["2.15-runtime"] = index

    def manifest(self, repository: str, reference: str) -> Manifest | None:
        return self.manifests.get(reference)

    def blob(self, repository: str, digest: str) -> bytes:
        return self.blobs[digest]


def test_a_multi_arch_tag_is_rebuilt_for_the_platform_this_host_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    reference = verify.parse_reference("127.0.0.1:5000/torch:2.15-runtime")
    for host in ("linux/amd64", "linux/arm64"):
        monkeypatch.setattr(rebuild.platforms, "host", lambda host=host: platforms.of(host))
        published = rebuild.resolve(_Registry(["linux/amd64", "linux/arm64"]), reference)  # type: ignore[arg-type]
        assert published.platform == host and published.config["architecture"] == host.split("/")[1]
        assert published.index  # the index's digest, which the rebuild names beside the image's
    monkeypatch.setattr(rebuild.platforms, "host", lambda: platforms.of("linux/arm64"))
    with pytest.raises(UserError, match="its index has no linux/arm64 image, this host's platform; rebuild it there"):
        rebuild.resolve(_Registry(["linux/amd64"]), reference)  # type: ignore[arg-type]


class _Engine:
    """The engine's rebuilt image: its layers' diff IDs; layer manifests are not asked for."""

    def __init__(self, layers: list[str]) -> None:
        self.images = self
        self.attrs = {"RootFS": {"Layers": layers}}

    def get(self, reference: str) -> _Engine:
        return self


class _Blobs:
    def __init__(self, blob: bytes) -> None:
        self.blob = blob

    def download_blob(self, repository: str, digest: str, target: object) -> None:
        Path(str(target)).write_bytes(self.blob)


def _appended_layer() -> bytes:
    data, out = b"export TOKEN=x\n", io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as zipped, tarfile.open(fileobj=zipped, mode="w") as tar:
        info = tarfile.TarInfo("etc/profile.d/added.sh")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _published(layers: list[dict[str, str]], diff_ids: list[str]) -> rebuild.Published:
    served = Manifest.of(b"{}", OCI_MANIFEST)
    config = {"rootfs": {"diff_ids": diff_ids}}
    return rebuild.Published(served, "sha256:" + "9" * 64, config, {"layers": layers}, "")


def test_a_layer_appended_to_the_published_image_is_named_with_its_files() -> None:
    """Issue 57: `docker commit` after `docker cp` of one file added a layer, and the rebuild said
    only that the layers agree and the configs differ."""
    gz = "application/vnd.oci.image.layer.v1.tar+gzip"
    published = _published([{"mediaType": gz, "digest": "sha256:a"}, {"mediaType": gz, "digest": "sha256:b"}],
                           ["sha256:1", "sha256:2"])  # fmt: skip
    found = rebuild.Rebuilt(published, "cell", "sha256:" + "8" * 64)
    rebuild.compare_layers(_Engine(["sha256:1"]), _Blobs(_appended_layer()), "torch", published, "local", found)  # type: ignore[arg-type]
    assert found.differing_layer == 1
    assert found.paths == ["etc/profile.d/added.sh: only in the published layer"]
    assert "the published image has 1 layer(s) more than the rebuild" in found.notes


@pytest.mark.parametrize(
    ("layers", "blob", "says"),
    [
        ([], b"", "the published manifest lists no layer 2, which its config names"),
        ([{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": "sha256:b"}] * 2, b"not gzip",
         "is not a application/vnd.oci.image.layer.v1.tar+gzip archive"),
        ([{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": "sha256:b"}] * 2, b"not a tar" * 100,
         "is not a application/vnd.oci.image.layer.v1.tar archive"),
    ],
)  # fmt: skip
def test_a_published_layer_that_is_missing_or_not_an_archive_is_one_note_not_a_traceback(
    layers: list[dict[str, str]], blob: bytes, says: str
) -> None:
    published = _published(layers, ["sha256:1", "sha256:2"])
    found = rebuild.Rebuilt(published, "cell", "sha256:" + "8" * 64)
    rebuild.compare_layers(_Engine(["sha256:1"]), _Blobs(blob), "torch", published, "local", found)  # type: ignore[arg-type]
    assert any(says in note for note in found.notes), found.notes
