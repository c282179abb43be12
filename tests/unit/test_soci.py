"""publish.soci: the SOCI index `soci create` made is pushed only once it is shown to index this
image, and a machine without what it needs is told so before anything is sent. The integration
test (tests/integration/test_publish.py) makes a real index and lazily pulls by it."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from builder.errors import UserError
from builder.oci.registry import OCI_MANIFEST, Manifest
from builder.publish import soci

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
        "config": {"mediaType": soci.INDEX_TYPE, "digest": soci.EMPTY_CONFIG, "size": 2},
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


def test_without_the_soci_cli_publish_is_told_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(soci.shutil, "which", lambda name: None if name == "soci" else f"/usr/bin/{name}")
    with pytest.raises(UserError) as refused:
        soci.tools(engine=None)  # type: ignore[arg-type]  # refused before the engine is asked
    assert "publish.soci: true needs the `soci` CLI" in refused.value.line()


def test_without_root_publish_is_told_how_to_run_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(soci.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(soci.privilege, "root_prefix", lambda: None)
    with pytest.raises(UserError) as refused:
        soci.tools(engine=None)  # type: ignore[arg-type]
    assert "as root" in refused.value.line() and "publish.soci: false" in refused.value.line()
