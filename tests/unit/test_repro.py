"""The canonical image: the same files give the same layer and config, whatever engine wrote them."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3

from builder import paths
from builder.assemble import backends
from builder.engine import archive, canonical, ids
from builder.errors import UserError
from builder.plan import matrix
from builder.repro import layers, manifests, normalize

EPOCH = 1733097600
Spec = tuple[str, str, "bytes | str", int]


def engine_tar(entries: list[Spec], go_style: bool = True) -> bytes:
    """A layer as an engine writes it, from (name, kind, data-or-link-target, mtime) in the order
    given: Docker 20.10's Go encoding (type bits in the mode field, user and group names) or the
    containerd store's (plain modes, no names), each in its own header format."""
    buffer = io.BytesIO()
    form = tarfile.GNU_FORMAT if go_style else tarfile.PAX_FORMAT
    with tarfile.open(fileobj=buffer, mode="w", format=form) as out:
        for name, kind, payload, mtime in entries:
            info = tarfile.TarInfo(name)
            info.mtime = mtime
            info.uname, info.gname = ("root", "root") if go_style else ("", "")
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, (0o40755 if go_style else 0o755)
                out.addfile(info)
            elif kind in ("link", "symlink"):
                info.type = tarfile.LNKTYPE if kind == "link" else tarfile.SYMTYPE
                info.linkname, info.mode = str(payload), 0o777 if kind == "symlink" else 0o644
                out.addfile(info)
            else:
                data = payload if isinstance(payload, bytes) else payload.encode()
                info.size, info.mode = len(data), (0o100644 if go_style else 0o644)
                out.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def rewrite(data: bytes, lower: canonical.LowerTree | None = None) -> tuple[canonical.CanonicalLayer, bytes]:
    sink = io.BytesIO()
    result = canonical.canonical_stream(io.BytesIO(data), sink, lower or canonical.LowerTree(), EPOCH)
    return result, sink.getvalue()


def names(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data)) as opened:
        return opened.getnames()


BASE: list[Spec] = [
    ("etc", "dir", "", 1),
    ("etc/debian_version", "file", b"12", 1),
    ("var", "dir", "", 1),
    ("var/lib", "dir", "", 1),
    ("var/lib/dpkg", "dir", "", 1),
    ("var/lib/dpkg/lock", "file", b"", 1),
]


def test_docker_20_and_the_containerd_store_give_the_same_layer_for_the_same_change() -> None:
    """overlay2's differ writes the unchanged parents of a change, an opaque marker for a directory
    made afresh and files a step only opened (copied up); containerd's writes none of them."""
    overlay2 = engine_tar(
        [
            ("var", "dir", "", 1),  # unchanged parent
            ("var/lib", "dir", "", 1),
            ("var/lib/dpkg", "dir", "", 1),
            ("var/lib/dpkg/lock", "file", b"", 1),  # opened by apt, unchanged
            ("var/lib/dpkg/status", "file", b"Package: gcc", EPOCH),
            ("var/lib/python3", "dir", "", EPOCH),
            ("var/lib/python3/.wh..wh..opq", "file", b"", EPOCH),  # a new directory: nothing below
            ("var/lib/python3/x.pth", "file", b"x", EPOCH),
        ]
    )
    containerd = engine_tar(
        [
            ("var/lib/dpkg/status", "file", b"Package: gcc", EPOCH),
            ("var/lib/python3", "dir", "", EPOCH),
            ("var/lib/python3/x.pth", "file", b"x", EPOCH),
        ],
        go_style=False,
    )
    results = []
    for upper in (overlay2, containerd):
        lower = canonical.LowerTree()
        rewrite(engine_tar(BASE), lower)
        results.append(rewrite(upper, lower))
    (first, first_bytes), (second, second_bytes) = results
    assert first.diff_id == second.diff_id and first_bytes == second_bytes
    assert names(first_bytes) == ["var/lib/dpkg/status", "var/lib/python3", "var/lib/python3/x.pth"]
    assert first.dropped == 5 and second.dropped == 0


def test_a_changed_file_or_directory_stays_in_the_layer() -> None:
    lower = canonical.LowerTree()
    rewrite(engine_tar(BASE), lower)
    _, data = rewrite(engine_tar([("etc", "dir", "", EPOCH), ("var/lib/dpkg/lock", "file", b"held", 1)]), lower)
    assert names(data) == ["etc", "var/lib/dpkg/lock"]


def test_an_opaque_marker_over_what_the_layers_below_hold_stays() -> None:
    lower = canonical.LowerTree()
    rewrite(engine_tar(BASE), lower)
    _, data = rewrite(engine_tar([("etc", "dir", "", EPOCH), ("etc/.wh..wh..opq", "file", b"", EPOCH)]), lower)
    assert names(data) == ["etc", "etc/.wh..wh..opq"]
    assert not lower.holds_anything_under("etc")  # applied: nothing of the base is left under etc


def test_headers_are_canonical_and_contents_untouched() -> None:
    _, data = rewrite(engine_tar([("opt", "dir", "", EPOCH + 500), ("opt/a.py", "file", b"print(1)", 7)]))
    with tarfile.open(fileobj=io.BytesIO(data)) as opened:
        members = opened.getmembers()
        assert [(m.name, m.mode, m.uname, m.gname, m.mtime) for m in members] == [
            ("opt", 0o755, "", "", EPOCH),  # clamped
            ("opt/a.py", 0o644, "", "", 7),  # older times kept
        ]
        assert opened.extractfile("opt/a.py").read() == b"print(1)"  # type: ignore[union-attr]
    assert len(data) == 5 * 512  # two headers, one data block, two end blocks: no record padding


def test_the_encoding_is_pinned_byte_for_byte() -> None:
    """A change to the encoding changes every recorded image ID: this test makes it deliberate."""
    long_name = "opt/" + "n" * 120
    _, data = rewrite(
        engine_tar([("opt", "dir", "", 5), ("opt/l", "symlink", "/usr/bin/x", 5), (long_name, "file", b"x", 5)])
    )
    assert names(data) == ["opt", "opt/l", long_name]
    assert hashlib.sha256(data).hexdigest() == "d1ff7b2c8d44b0b665f4fb76b0639262fcd8400c4fca44b30657e0cb6617a1bf"


def test_gzip_and_engine_header_formats_read_the_same() -> None:
    entries: list[Spec] = [("a", "dir", "", 1), ("a/b", "file", b"data" * 300, 1)]
    plain = rewrite(engine_tar(entries))[0].diff_id
    assert rewrite(gzip.compress(engine_tar(entries)))[0].diff_id == plain
    assert rewrite(engine_tar(entries, go_style=False))[0].diff_id == plain


def test_content_still_decides_the_layer() -> None:
    assert rewrite(engine_tar([("a", "file", b"1", 1)]))[0] != rewrite(engine_tar([("a", "file", b"2", 1)]))[0]


def test_rewriting_is_idempotent() -> None:
    _, once = rewrite(engine_tar([("opt", "dir", "", 1), ("opt/x", "file", b"x", 1)]))
    _, twice = rewrite(once)
    assert once == twice


def test_a_layer_out_of_walk_order_is_refused_by_the_stream_and_sorted_through_a_spool(tmp_path: Path) -> None:
    shuffled = engine_tar(
        [("z/lib.so.1", "file", b"library", 1), ("a/lib.so", "link", "z/lib.so.1", 1), ("a", "dir", "", 1)]
    )
    with pytest.raises(canonical.OutOfOrder):
        rewrite(shuffled)
    canonical.rewrite_layer(
        lambda: io.BufferedReader(io.BytesIO(shuffled)), tmp_path / "sorted.tar", canonical.LowerTree(), EPOCH
    )
    with tarfile.open(tmp_path / "sorted.tar") as opened:
        first, second, third = opened.getmembers()
        assert (first.name, second.name, second.isreg()) == ("a", "a/lib.so", True)  # the link carries the data
        assert (third.name, third.islnk(), third.linkname) == ("z/lib.so.1", True, "a/lib.so")
        opened.extractall(tmp_path / "root", filter="tar")
    assert (tmp_path / "root" / "z" / "lib.so.1").read_bytes() == b"library"


# A step ran `ln /usr/bin/python3 /usr/local/bin/py`: overlayfs copied the lower file up, unchanged,
# and the engine's layer holds it with the new name linked to it.
LINKED_LOWER_FILE: list[Spec] = [
    ("usr", "dir", "", 1),
    ("usr/bin", "dir", "", 1),
    ("usr/bin/python3", "file", b"interpreter", 1),
    ("usr/local", "dir", "", 1),
    ("usr/local/bin", "dir", "", EPOCH),
    ("usr/local/bin/py", "link", "usr/bin/python3", EPOCH),
]


def _lower_with_python(tmp_path: Path) -> canonical.LowerTree:
    lower = canonical.LowerTree()
    base = engine_tar([(n, k, d, t) for n, k, d, t in LINKED_LOWER_FILE if n != "usr/local/bin/py"])
    canonical.rewrite_layer(lambda: io.BufferedReader(io.BytesIO(base)), tmp_path / "base.tar", lower, EPOCH)
    return lower


def _extracted(layers: list[Path], root: Path) -> Path:
    for layer in layers:  # as an engine applies them: a link's target must be in the same layer
        with tarfile.open(layer) as opened:
            opened.extractall(root, filter="tar")
    return root


def test_a_link_to_a_lower_layers_file_keeps_its_unchanged_target_in_the_layer(tmp_path: Path) -> None:
    """The engine accepts a step that hard-links a lower layer's file: so does the canonical writer."""
    lower = _lower_with_python(tmp_path)
    layer = engine_tar(LINKED_LOWER_FILE)
    canonical.rewrite_layer(lambda: io.BufferedReader(io.BytesIO(layer)), tmp_path / "step.tar", lower, EPOCH)
    with tarfile.open(tmp_path / "step.tar") as opened:
        kept = {m.name: m for m in opened.getmembers()}
    assert kept["usr/bin/python3"].isreg() and kept["usr/local/bin/py"].linkname == "usr/bin/python3"
    assert "usr/bin" not in kept  # unchanged directories still go
    step_alone = _extracted([tmp_path / "step.tar"], tmp_path / "step-alone")
    assert (step_alone / "usr/local/bin/py").read_bytes() == b"interpreter"
    assert (step_alone / "usr/bin/python3").stat().st_ino == (step_alone / "usr/local/bin/py").stat().st_ino


def test_a_link_to_a_lower_layers_file_is_the_same_layer_from_a_folder_and_from_a_tar(tmp_path: Path) -> None:
    from_tar = canonical.rewrite_layer(
        lambda: io.BufferedReader(io.BytesIO(engine_tar(LINKED_LOWER_FILE))),
        tmp_path / "tar.tar",
        _lower_with_python(tmp_path),
        EPOCH,
    )
    found: list[tuple[canonical.Entry, canonical.Opener | None]] = []
    for entry, data in canonical.entries(io.BytesIO(engine_tar(LINKED_LOWER_FILE)), EPOCH):
        content = data.read(1 << 20) if data is not None else None
        opener = (lambda c=content: canonical.DataReader(io.BytesIO(c), len(c))) if content is not None else None
        found.append((entry, opener))
    from_folder = canonical.rewrite_gathered(found, tmp_path / "folder.tar", _lower_with_python(tmp_path))
    assert from_folder.diff_id == from_tar.diff_id
    assert (tmp_path / "folder.tar").read_bytes() == (tmp_path / "tar.tar").read_bytes()


def test_walk_order_is_component_by_component() -> None:
    """`a/b` (a's child) comes before `a-b`, though '-' sorts before '/' as a byte."""
    _, data = rewrite(engine_tar([("a", "dir", "", 1), ("a/b", "file", b"", 1), ("a-b", "file", b"", 1)]))
    assert names(data) == ["a", "a/b", "a-b"]


def test_a_bottom_layer_file_is_rewritten_in_place(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs.tar"
    rootfs.write_bytes(engine_tar([("./", "dir", "", 1), ("./etc", "dir", "", 1), ("./etc/x", "file", b"x", 1)]))
    result = canonical.rewrite_file(rootfs, EPOCH)
    assert names(rootfs.read_bytes()) == ["etc", "etc/x"]  # no root entry, no "./"
    assert result.diff_id == "sha256:" + hashlib.sha256(rootfs.read_bytes()).hexdigest()
    assert canonical.rewrite_file(rootfs, EPOCH).diff_id == result.diff_id


# ---- docker save, in both formats


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as out:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _blob(data: bytes) -> tuple[str, bytes]:
    return "blobs/sha256/" + hashlib.sha256(data).hexdigest(), data


class SavingEngine:
    """An engine whose `docker save` answers with the given archive and whose load keeps what it gets."""

    def __init__(self, saved: bytes, history: list[str] | None = None, containerd: bool = False) -> None:
        self.saved, self.loaded = saved, b""
        self.history_lines = history or []
        self.containerd = containerd
        self.images, self.api = self, self

    def get_image(self, image_id: str, chunk_size: int) -> list[bytes]:
        return [self.saved]

    def info(self) -> dict[str, Any]:
        # No containerd content store to read: the pass saves the image, as on a remote engine.
        return {"DriverStatus": [["driver-type", "io.containerd.snapshotter.v1"]] if self.containerd else []}

    def history(self, reference: str) -> list[dict[str, str]]:
        return [{"CreatedBy": line} for line in reversed(self.history_lines)]

    def get(self, reference: str) -> Any:
        engine = self

        class Image:
            id = "sha256:raw"

            def tag(self, repository: str, tag: str) -> None:
                engine.tagged = f"{repository}:{tag}"

        return Image()

    def inspect_image(self, reference: str) -> dict[str, Any]:
        return {"Id": "sha256:manifest", "Descriptor": {}} if self.containerd else {"Id": "sha256:config"}

    def load(self, chunks: Any) -> list[Any]:
        self.loaded = b"".join(chunks)
        outer = self

        class Loaded:
            id = "sha256:manifest-of-loaded" if outer.containerd else "sha256:" + "0" * 64

        return [Loaded()]


def oci_save(config: dict[str, Any], layer_tars: list[bytes], compress: bool) -> bytes:
    """`docker save` as Docker 29 writes it: an OCI layout, blobs in digest order, gzip on containerd."""
    blobs = [gzip.compress(t, mtime=0) if compress else t for t in layer_tars]
    config_bytes = json.dumps(config).encode()
    layer_names = [_blob(b)[0] for b in blobs]
    manifest = json.dumps([{"Config": _blob(config_bytes)[0], "RepoTags": ["x:1"], "Layers": layer_names}]).encode()
    members = sorted([_blob(b) for b in [*blobs, config_bytes]])
    return _tar([*members, ("index.json", b"{}"), ("manifest.json", manifest), ("oci-layout", b"{}")])


def legacy_save(config: dict[str, Any], layer_tars: list[bytes]) -> bytes:
    names = [f"{i:064x}/layer.tar" for i in range(len(layer_tars))]
    manifest = json.dumps([{"Config": "c.json", "Layers": names}]).encode()
    return _tar(
        [*zip(names, layer_tars, strict=True), ("c.json", json.dumps(config).encode()), ("manifest.json", manifest)]
    )


def test_scan_saved_reads_the_oci_layout_in_the_images_order_and_decompresses_its_blobs() -> None:
    tars = [engine_tar([("b", "file", b"second", 1)]), engine_tar([("a", "file", b"first", 1)])]
    for saved in (oci_save({"os": "linux"}, tars, compress=True), legacy_save({"os": "linux"}, tars)):
        config, scanned = archive.scan_saved(SavingEngine(saved), "sha256:x", lambda _, __, h: h.read())  # type: ignore[arg-type]
        assert config == {"os": "linux"} and scanned == tars


def test_a_save_without_manifest_is_one_line_not_a_traceback() -> None:
    from builder.errors import UserError

    with pytest.raises(UserError, match="no manifest"):
        archive.scan_saved(SavingEngine(_tar([("index.json", b"{}")])), "sha256:x", lambda *_: None)  # type: ignore[arg-type]


DOCKERFILE = """# comment
ARG BASE_IMAGE=debian
FROM ${BASE_IMAGE}
ENV A=1 \\
    B=2
# inside
RUN apt-get install x \\
 # a comment line inside a continued RUN
 && sh /opt/torch-images/settle-layer.sh
LABEL x="y"
CMD ["python3"]
"""


def test_the_history_comes_from_the_dockerfile_whichever_builder_ran_it() -> None:
    steps = normalize.dockerfile_steps(DOCKERFILE)
    assert steps == ["ENV A=1 B=2", "RUN apt-get install x && sh /opt/torch-images/settle-layer.sh", 'LABEL x="y"',
                     'CMD ["python3"]']  # fmt: skip
    history = normalize.canonical_history([{"created_by": "bootstrap bookworm"}], steps, EPOCH)
    assert [bool(h.get("empty_layer")) for h in history] == [False, True, False, True, True]
    assert {h["created"] for h in history} == {"2024-12-02T00:00:00Z"}


def test_the_config_keeps_what_an_image_carries_and_drops_what_names_the_engine() -> None:
    engine_config = {
        "architecture": "amd64", "os": "linux", "created": "2026-12-02T18:00:00.1Z", "container": "abc",
        "docker_version": "29.1.3", "config": {"Hostname": "abc", "Image": "sha256:parent", "Env": ["A=1"],
        "Cmd": ["python3"], "Labels": {"x": "y"}, "WorkingDir": "", "OnBuild": None, "ArgsEscaped": True},
    }  # fmt: skip
    config = json.loads(normalize.canonical_config(engine_config, ["sha256:1"], [{"created_by": "x"}], EPOCH))
    assert config == {
        "architecture": "amd64", "os": "linux", "created": "2024-12-02T00:00:00Z",
        "config": {"Env": ["A=1"], "Cmd": ["python3"], "Labels": {"x": "y"}},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:1"]}, "history": [{"created_by": "x"}],
    }  # fmt: skip


@pytest.mark.parametrize("containerd", [False, True], ids=["docker-20.10", "containerd-store"])
def test_normalizing_loads_a_complete_archive_of_canonical_layers_keyed_by_the_config_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, containerd: bool
) -> None:
    monkeypatch.setenv("TORCH_IMAGES_CACHE", str(tmp_path / "cache"))
    base = engine_tar(BASE)
    step = engine_tar([("var", "dir", "", 1), ("var/new", "file", b"n", EPOCH)], go_style=not containerd)
    config = {"architecture": "amd64", "os": "linux", "config": {"Env": ["A=1"]}}
    saved = oci_save(config, [base, step], compress=True) if containerd else legacy_save(config, [base, step])
    engine = SavingEngine(saved, history=["bootstrap bookworm"], containerd=containerd)

    done = normalize.normalize_image(engine, "torch:test", EPOCH, ["ENV A=1", "RUN x"], "base", lambda _: None)  # type: ignore[arg-type]

    with tarfile.open(fileobj=io.BytesIO(engine.loaded)) as loaded:
        manifest = json.loads(loaded.extractfile("manifest.json").read())  # type: ignore[union-attr]
        config_bytes = loaded.extractfile(manifest[0]["Config"]).read()  # type: ignore[union-attr]
        layer_files = [loaded.extractfile(name).read() for name in manifest[0]["Layers"]]  # type: ignore[union-attr]
    assert done.image_id == "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    assert names(layer_files[1]) == ["var/new"]  # canonical: the unchanged parent left out
    assert json.loads(config_bytes)["rootfs"]["diff_ids"] == [
        "sha256:" + hashlib.sha256(layer).hexdigest() for layer in layer_files
    ]
    assert [h["created_by"] for h in json.loads(config_bytes)["history"]] == ["bootstrap bookworm", "ENV A=1", "RUN x"]
    # The engine's own ID of what was loaded leads back to the config digest.
    loaded_id = "sha256:manifest-of-loaded" if containerd else "sha256:" + "0" * 64
    assert ids.engine_id(engine, done.image_id) in (done.image_id, loaded_id)  # type: ignore[arg-type]


def test_a_step_count_that_does_not_add_up_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from builder.errors import UserError

    monkeypatch.setenv("TORCH_IMAGES_CACHE", str(tmp_path / "cache"))
    saved = legacy_save({"os": "linux"}, [engine_tar(BASE)])
    engine = SavingEngine(saved, history=["bootstrap bookworm"])
    with pytest.raises(UserError, match="make 2 layers"):
        normalize.normalize_image(engine, "t:1", EPOCH, ["RUN x"], "base", lambda _: None)  # type: ignore[arg-type]


def test_the_config_digest_is_the_engines_id_on_docker_20_and_remembered_on_the_containerd_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_IMAGES_CACHE", str(tmp_path / "cache"))
    assert ids.config_digest(SavingEngine(b""), "x") == "sha256:config"  # type: ignore[arg-type]
    config = b'{"os":"linux"}'
    digest = ids.remember("sha256:manifest", config)
    assert digest == "sha256:" + hashlib.sha256(config).hexdigest()
    assert ids.config_digest(SavingEngine(b"", containerd=True), "x") == digest  # type: ignore[arg-type]


def test_an_unknown_image_on_the_containerd_store_is_read_back_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_IMAGES_CACHE", str(tmp_path / "cache"))
    config = {"os": "linux", "rootfs": {"diff_ids": []}}
    engine = SavingEngine(oci_save(config, [engine_tar(BASE)], compress=True), containerd=True)
    expected = "sha256:" + hashlib.sha256(json.dumps(config).encode()).hexdigest()
    assert ids.config_digest(engine, "x") == expected  # type: ignore[arg-type]
    engine.saved = b""  # from now on from the cache
    assert ids.config_digest(engine, "x") == expected  # type: ignore[arg-type]


# ---- the file manifests verify-repro names differing paths with


def test_a_file_manifest_lists_paths_kinds_and_content_digests() -> None:
    data = engine_tar([("d", "dir", "", 1), ("d/f", "file", b"x", 1), ("d/g", "link", "d/f", 1)], go_style=False)
    rows = layers.file_manifest(io.BytesIO(data))
    assert rows == [
        ["d", "dir", "0o755", 0, "", "0:0"],
        ["d/f", "file", "0o644", 1, "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881", "0:0"],
        ["d/g", "hardlink", "0o644", 0, "d/f", "0:0"],
    ]


def test_differing_paths_names_what_changed_between_two_layers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_IMAGES_CACHE", str(tmp_path / "cache"))
    one = layers.file_manifest(io.BytesIO(engine_tar([("a", "file", b"1", 1), ("b", "file", b"same", 1)])))
    two = layers.file_manifest(io.BytesIO(engine_tar([("a", "file", b"2", 1), ("b", "file", b"same", 1)])))
    manifests.save_manifest("sha256:one", one)
    manifests.save_manifest("sha256:two", two)
    assert manifests.differing_paths("sha256:one", "sha256:two") == ["a"]


# ---- BuildKit through a docker CLI the daemon accepts


def _fake_cli(folder: Path, name: str, version: str, api: str, buildx: bool) -> str:
    script = folder / name
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = version ]; then echo "{version} {api}"; exit 0; fi\n'
        f'if [ "$1" = buildx ]; then exit {0 if buildx else 1}; fi\n'
        "exit 1\n"
    )
    script.chmod(0o755)
    return str(script)


class _Daemon:
    def __init__(self, minimum: str) -> None:
        self.minimum = minimum

    def version(self) -> dict[str, str]:
        return {"MinAPIVersion": self.minimum}


def test_buildkit_uses_only_a_cli_the_daemon_accepts_and_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from builder.assemble import backends

    old = _fake_cli(tmp_path, "docker-20", "20.10.24", "1.41", buildx=False)
    new_without_buildx = _fake_cli(tmp_path, "docker-29", "29.1.3", "1.52", buildx=False)
    new_with_buildx = _fake_cli(tmp_path, "docker-29-buildx", "29.1.3", "1.52", buildx=True)
    docker29 = _Daemon("1.44")

    monkeypatch.setattr(backends, "cli_candidates", lambda: [old])
    assert backends.buildkit_command(docker29) == (  # type: ignore[arg-type]
        "BuildKit needs a docker CLI this engine accepts (API 1.44 or newer) and none is installed "
        "(apt-get install docker.io docker-buildx); or build with --backend sdk"
    )
    assert backends.buildkit_command(_Daemon("1.12")) == ([old, "build"], {"DOCKER_BUILDKIT": "1"})  # type: ignore[arg-type]
    monkeypatch.setattr(backends, "cli_candidates", lambda: [old, new_without_buildx])
    message = backends.buildkit_command(docker29)  # type: ignore[arg-type]
    assert isinstance(message, str) and "buildx plugin" in message and "apt-get install docker-buildx" in message
    monkeypatch.setattr(backends, "cli_candidates", lambda: [old, new_without_buildx, new_with_buildx])
    assert backends.buildkit_command(docker29) == ([new_with_buildx, "buildx", "build", "--load"], {})  # type: ignore[arg-type]


class _Response:
    closed = False

    def close(self) -> None:
        self.closed = True


class _BuildApi:
    """The engine's build endpoint as the SDK gives it: the response passes the session's hooks,
    then its chunks are read one by one."""

    def __init__(
        self, chunks: list[dict[str, str]], interrupt_after: int | None = None, raised: BaseException | None = None
    ) -> None:
        self.hooks: dict[str, list[object]] = {"response": []}
        self.response = _Response()
        self.chunks, self.interrupt_after = chunks, interrupt_after
        self.raised = raised or KeyboardInterrupt()  # what SIGTERM and Ctrl-C raise in the builder

    def build(self, **_: object) -> Iterator[dict[str, str]]:
        for hook in self.hooks["response"]:
            hook(self.response)  # type: ignore[operator]
        return self._read()

    def _read(self) -> Iterator[dict[str, str]]:
        for index, chunk in enumerate(self.chunks):
            if index == self.interrupt_after:
                raise self.raised
            yield chunk


def _classic_build(api: _BuildApi, steps: list[str]) -> str:
    class Engine:
        pass

    engine = Engine()
    engine.api = api  # type: ignore[attr-defined]
    grid = matrix.load_matrix(paths.PACKAGE.parent / "matrix.yaml")
    request = backends.BuildRequest(grid.quick_cell, "torch-images/test:x", "base", EPOCH, True, {})
    return backends.classic_build(engine, request, lambda _: None, steps)  # type: ignore[arg-type]


STEPS_THEN_FAILURE = [
    {"stream": "Step 1/6 : ARG BASE_IMAGE=base\n"},
    {"stream": "Step 2/6 : FROM ${BASE_IMAGE}\n"},
    {"stream": " ---> 0b0b0b0b0b0b\n"},
    {"stream": "Step 3/6 : WORKDIR /\n"},
    {"stream": " ---> Running in 88bb77cc66dd\n"},
    {"stream": "Removing intermediate container 88bb77cc66dd\n"},
    {"stream": " ---> 1a2b3c4d5e6f\n"},
    {"stream": "Step 4/6 : ENV A=1\n"},
    {"stream": " ---> Using cache\n"},
    {"stream": " ---> 0c0c0c0c0c0c\n"},
    {"stream": "Step 5/6 : RUN true\n"},
    {"stream": " ---> Running in 99aa88bb77cc\n"},
    {"stream": " ---> 2b3c4d5e6f70\n"},
    {"stream": "Step 6/6 : RUN false\n"},
    {"error": "The command '/bin/sh -c false' returned a non-zero code: 1"},
]


def test_the_classic_builder_hands_back_each_step_image_it_made_and_not_one_from_the_cache() -> None:
    """After a failed step, the steps this build made are the run's to remove; the base a FROM
    names and a step the engine took from its cache are others' (removing the base's image with
    the steps deleted the team's tagged base)."""
    steps: list[str] = []
    api = _BuildApi(STEPS_THEN_FAILURE)
    assert "non-zero code" in _classic_build(api, steps)
    assert steps == ["1a2b3c4d5e6f", "2b3c4d5e6f70"]
    assert api.response.closed and api.hooks["response"] == []


def test_an_interrupted_classic_build_closes_its_connection_so_the_engine_cancels_the_step_in_flight() -> None:
    steps: list[str] = []
    api = _BuildApi(STEPS_THEN_FAILURE, interrupt_after=10)
    with pytest.raises(KeyboardInterrupt):
        _classic_build(api, steps)
    assert api.response.closed, "the engine would go on running the step while the traceback holds the stream"
    assert steps == ["1a2b3c4d5e6f"] and api.hooks["response"] == []


def _pax_tar(name: str, records: dict[str, str], kind: bytes = tarfile.REGTYPE, link: str = "") -> bytes:
    """One entry with raw pax records, as a hostile or odd writer may make it."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as out:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, link
        info.pax_headers = records
        out.addfile(info, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("layer", "says"),
    [
        (_pax_tar("a", {"mtime": "nan"}), "pax mtime 'nan'"),
        (_pax_tar("a", {"mtime": "inf"}), "pax mtime 'inf'"),
        (_pax_tar("a", {"uid": "root"}), "pax uid 'root' is not a number"),
        (_pax_tar("a", {"uid": "-1"}), "pax uid '-1'"),
        (_pax_tar("../etc/passwd", {}), "leaves the layer's tree"),
        (_pax_tar("usr/../../etc", {}), "leaves the layer's tree"),
        (_pax_tar("x", {}, tarfile.LNKTYPE, "../../etc/shadow"), "hard link's target leaves"),
    ],
)
def test_an_entry_no_engine_writes_is_one_line_not_a_traceback_nor_root(layer: bytes, says: str) -> None:
    with pytest.raises(UserError) as refused:
        rewrite(layer)
    assert says in refused.value.line() and "\n" not in refused.value.line()


def test_a_hard_link_to_a_directory_is_refused() -> None:
    with pytest.raises(UserError, match="which is no file"):
        rewrite(engine_tar([("etc", "dir", "", 1), ("etc-link", "link", "etc", 1)]))


def test_only_file_capabilities_are_kept_of_a_tars_extended_attributes() -> None:
    """The overlay2 folders' reader keeps security.capability alone; the tar readers must agree."""
    layer = _pax_tar(
        "ping",
        {"SCHILY.xattr.security.capability": "cap", "SCHILY.xattr.trusted.overlay.origin": "x",
         "SCHILY.xattr.user.note": "y"},
    )  # fmt: skip
    _, data = rewrite(layer)
    with tarfile.open(fileobj=io.BytesIO(data)) as opened:
        [member] = opened.getmembers()
    assert {k for k in member.pax_headers if k.startswith("SCHILY.xattr.")} == {"SCHILY.xattr.security.capability"}


DATA = b"data"


def test_a_chain_of_hard_links_gathered_out_of_order_keeps_every_names_content(tmp_path: Path) -> None:
    found: list[tuple[canonical.Entry, canonical.Opener | None]] = [
        (canonical.Entry("a", canonical.HARDLINK, 0o644, 0, 0, 1, linkname="b"), None),  # a -> b -> c
        (canonical.Entry("b", canonical.HARDLINK, 0o644, 0, 0, 1, linkname="c"), None),
        (canonical.Entry("c", canonical.REGULAR, 0o644, 0, 0, 1, 4), lambda: canonical.DataReader(io.BytesIO(DATA), 4)),
    ]  # fmt: skip
    canonical.rewrite_gathered(found, tmp_path / "layer.tar", canonical.LowerTree())
    with tarfile.open(tmp_path / "layer.tar") as opened:
        opened.extractall(tmp_path / "root", filter="tar")
    assert [(tmp_path / "root" / n).read_bytes() for n in "abc"] == [b"data"] * 3


class _Image:
    def __init__(self, image_id: str, labels: dict[str, str]) -> None:
        self.id, self.attrs = image_id, {"Config": {"Labels": labels}}


def test_a_remembered_normalized_image_is_taken_only_when_it_carries_the_raw_builds_labels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 58: the raw -> normalized mapping is a cache entry. Pointed at another image in the
    engine (another cell's, with another build ID), or made a link or not JSON, it is not taken,
    and the canonical pass runs."""
    monkeypatch.setenv("TORCH_IMAGES_CACHE", str(tmp_path / "cache"))
    raw = _Image("sha256:" + "1" * 64, {"io.torch-images.build-id": "aaaa"})
    own = _Image("sha256:" + "2" * 64, {"io.torch-images.build-id": "aaaa"})
    other = _Image("sha256:" + "3" * 64, {"io.torch-images.build-id": "bbbb"})

    class Images:
        def get(self, name: str) -> _Image:
            return {image.id: image for image in (raw, own, other)}[name]

    class Engine:
        images = Images()

    engine = Engine()
    normalize._remember(raw.id, own.id)
    assert normalize._known_normalized(engine, raw) == own.id  # type: ignore[arg-type]
    normalize._remember(raw.id, other.id)
    assert normalize._known_normalized(engine, raw) is None  # type: ignore[arg-type]
    mapping = normalize._mapping_file()
    mapping.write_text("[not a mapping")
    assert normalize._known_normalized(engine, raw) is None  # type: ignore[arg-type]
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({raw.id: own.id}))
    mapping.unlink()
    mapping.symlink_to(elsewhere)
    assert normalize._known_normalized(engine, raw) is None  # type: ignore[arg-type]


def test_an_engine_that_goes_away_in_the_middle_of_a_build_is_one_line_after_the_connection_is_closed() -> None:
    """Issue 58: dockerd stopped or restarted under a build breaks the stream (urllib3 says so
    mid-chunk): one line naming the cell, never a traceback."""
    steps: list[str] = []
    broken = urllib3.exceptions.ProtocolError("Connection broken: IncompleteRead(0 bytes read)")
    api = _BuildApi(STEPS_THEN_FAILURE, interrupt_after=10, raised=broken)
    with pytest.raises(UserError, match=r"the engine's connection broke in the middle of the build") as said:
        _classic_build(api, steps)
    assert "\n" not in said.value.line() and api.response.closed and steps == ["1a2b3c4d5e6f"]
