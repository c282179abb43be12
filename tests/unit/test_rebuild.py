"""`verify --rebuild` (builder/publish/rebuild.py): its report of what differs (each path whose
content, mode, owner or kind differs between the published layer and the rebuilt one, with both
sizes), and which image of a multi-arch tag it rebuilds."""

from __future__ import annotations

import hashlib
import json

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
