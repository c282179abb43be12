"""Layer normalization: the same files give the same layer, whatever the build's times and order."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.engine import archive
from builder.repro import layers, manifests, normalize

EPOCH = 1733097600


def layer(entries: list[tuple[str, str, bytes | str, int]]) -> io.BytesIO:
    """A layer tar from (name, kind, data-or-link-target, mtime), in the order given."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as out:
        for name, kind, payload, mtime in entries:
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = mtime, 0, 0, "builder", "builder"
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                out.addfile(info)
            elif kind == "link":
                info.type, info.linkname = tarfile.LNKTYPE, str(payload)
                out.addfile(info)
            else:
                data = payload if isinstance(payload, bytes) else payload.encode()
                info.size, info.mode = len(data), 0o644
                out.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer


def normalized(tmp_path: Path, entries: list[tuple[str, str, bytes | str, int]]) -> tuple[str, Path, list]:  # type: ignore[type-arg]
    return layers.normalize_layer(layer(entries), EPOCH, tmp_path)


def test_order_build_times_and_owner_names_do_not_change_the_layer(tmp_path: Path) -> None:
    first = [("opt", "dir", "", EPOCH + 500), ("opt/b.py", "file", b"b", EPOCH + 10), ("opt/a.py", "file", b"a", 1)]
    second = [("opt/a.py", "file", b"a", 1), ("opt", "dir", "", EPOCH + 9999), ("opt/b.py", "file", b"b", EPOCH + 77)]
    digest_one, path_one, _ = normalized(tmp_path, first)
    digest_two, _, _ = normalized(tmp_path, second)
    assert digest_one == digest_two
    with tarfile.open(path_one) as out:
        members = out.getmembers()
    assert [m.name for m in members] == ["opt", "opt/a.py", "opt/b.py"]
    assert [m.mtime for m in members] == [EPOCH, 1, EPOCH]  # clamped, older times kept
    assert {m.uname for m in members} == {""}


def test_content_still_decides_the_layer(tmp_path: Path) -> None:
    one, _, _ = normalized(tmp_path, [("a", "file", b"1", 1)])
    two, _, _ = normalized(tmp_path, [("a", "file", b"2", 1)])
    assert one != two


def test_a_hard_link_sorted_before_its_target_carries_the_data_and_stays_valid(tmp_path: Path) -> None:
    _, path, manifest = normalized(
        tmp_path, [("z/lib.so.1", "file", b"library", 1), ("a/lib.so", "link", "z/lib.so.1", 1)]
    )
    with tarfile.open(path) as out:
        first, second = out.getmembers()
        assert (first.name, first.isreg()) == ("a/lib.so", True)
        assert (second.name, second.islnk(), second.linkname) == ("z/lib.so.1", True, "a/lib.so")
        out.extractall(tmp_path / "root", filter="tar")
    assert (tmp_path / "root" / "z" / "lib.so.1").read_bytes() == b"library"
    assert [row[1] for row in manifest] == ["file", "hardlink"]


def test_volatile_files_are_dropped(tmp_path: Path) -> None:
    _, path, _ = normalized(
        tmp_path,
        [
            ("var/lib/apt/lists/deb.debian.org_dists", "file", b"x", 1),
            ("var/cache/ldconfig/aux-cache", "file", b"x", 1),
            ("var/log/dpkg.log", "file", b"x", 1),
            ("root/.cache/pip/http/abc", "file", b"x", 1),
            ("etc/keep.conf", "file", b"kept", 1),
        ],
    )
    with tarfile.open(path) as out:
        assert out.getnames() == ["etc/keep.conf"]


def test_config_loses_build_host_fields_and_gets_fixed_times() -> None:
    config = {
        "created": "2026-12-02T18:00:00.123Z",
        "container": "abc",
        "docker_version": "20.10.24",
        "config": {"Hostname": "abc", "Image": "sha256:parent", "Env": ["A=1"]},
        "history": [{"created": "2026-12-02T18:00:00Z", "created_by": "RUN x"}],
        "rootfs": {"type": "layers", "diff_ids": ["old"]},
    }
    result = json.loads(layers.normalize_config(config, ["sha256:new"], EPOCH))
    assert result == {
        "created": "2024-12-02T00:00:00Z",
        "config": {"Hostname": "", "Domainname": "", "Env": ["A=1"]},
        "history": [{"created": "2024-12-02T00:00:00Z", "created_by": "RUN x"}],
        "rootfs": {"type": "layers", "diff_ids": ["sha256:new"]},
    }


def test_differing_paths_names_what_changed_between_two_layers(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TORCH_IMAGES_CACHE", str(tmp_path / "cache"))
    one, _, files_one = normalized(tmp_path, [("a", "file", b"1", 1), ("b", "file", b"same", 1)])
    two, _, files_two = normalized(tmp_path, [("a", "file", b"2", 1), ("b", "file", b"same", 1)])
    for digest, files in ((one, files_one), (two, files_two)):
        (manifests.cache_dir() / f"{digest.removeprefix('sha256:')}.manifest.json").write_text(json.dumps(files))
    assert manifests.differing_paths(one, two) == ["a"]


def test_a_settled_entry_passes_and_each_kind_of_unsettled_entry_says_why() -> None:
    def entry(name: str, mtime: int = EPOCH, uid: int = 0, uname: str = "", kind: bytes = tarfile.REGTYPE):
        info = tarfile.TarInfo(name)
        info.mtime, info.uid, info.uname, info.type = mtime, uid, uname, kind
        return info

    assert layers.unsettled(entry("opt/venv/bin/python", uname="root"), EPOCH) is None
    assert layers.unsettled(entry("usr/lib/old.so", mtime=1), EPOCH) is None
    assert layers.unsettled(entry("var/lib/dpkg/status-old"), EPOCH) is None  # a deterministic copy
    assert layers.unsettled(entry("tmp/apt", kind=tarfile.DIRTYPE), EPOCH) is None
    assert "after SOURCE_DATE_EPOCH" in str(layers.unsettled(entry("opt/torch-images", mtime=EPOCH + 1), EPOCH))
    assert "log, cache or temporary" in str(layers.unsettled(entry("var/log/apt/history.log"), EPOCH))
    assert "owner named by the build host" in str(layers.unsettled(entry("x", uid=42, uname="_apt"), EPOCH))


def test_scanning_a_layer_keeps_an_exact_copy_and_reports_the_first_unsettled_entry(tmp_path: Path) -> None:
    source = layer(
        [("opt", "dir", "", EPOCH + 5), ("opt/a", "file", b"a" * 5000, 1), ("var/log/x.log", "file", b"", 1)]
    )
    expected = source.getvalue()
    with (tmp_path / "copy.tar").open("wb") as copy:
        problem = normalize._scan_layer(source, EPOCH, copy)
    assert (tmp_path / "copy.tar").read_bytes() == expected
    assert problem == "opt was modified after SOURCE_DATE_EPOCH"
    assert normalize._scan_layer(layer([("opt/a", "file", b"a", 1)]), EPOCH, None) is None


def test_the_archive_for_docker_load_names_every_layer_but_carries_only_those_the_engine_lacks(tmp_path: Path) -> None:
    new_layer = tmp_path / "new.tar"
    new_layer.write_bytes(layer([("a", "file", b"1", 1)]).getvalue())
    written = io.BytesIO()
    wanted = [("sha256:" + "1" * 64, None), ("sha256:" + "2" * 64, new_layer)]
    archive.write_load_archive(written, b"{}", wanted, "torch:test", EPOCH)
    written.seek(0)
    with tarfile.open(fileobj=written) as saved:
        names = saved.getnames()
        manifest = json.loads(saved.extractfile("manifest.json").read())  # type: ignore[union-attr]
    assert manifest[0]["Layers"] == ["1" * 64 + "/layer.tar", "2" * 64 + "/layer.tar"]
    assert "2" * 64 + "/layer.tar" in names and "1" * 64 + "/layer.tar" not in names


def test_a_file_manifest_lists_paths_kinds_and_content_digests() -> None:
    rows = layers.file_manifest(layer([("d", "dir", "", 1), ("d/f", "file", b"x", 1), ("d/g", "link", "d/f", 1)]))
    assert rows == [
        ["d", "dir", "0o755", 0, ""],
        ["d/f", "file", "0o644", 1, "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"],
        ["d/g", "hardlink", "0o644", 0, "d/f"],
    ]


class FakeImage:
    def __init__(self, image_id: str, diff_ids: list[str]) -> None:
        self.id, self.attrs, self.tags = image_id, {"RootFS": {"Layers": diff_ids}}, []

    def tag(self, repository: str, tag: str) -> None:
        self.tags.append(f"{repository}:{tag}")


class FakeEngine:
    """`docker save` of one image made of the given layer tars, and a `docker load` that keeps the archive."""

    def __init__(self, layer_tars: list[bytes]) -> None:
        self.layer_tars, self.saves, self.loaded = layer_tars, 0, b""
        diff_ids = ["sha256:" + hashlib.sha256(t).hexdigest() for t in layer_tars]
        self.raw = FakeImage("sha256:raw", diff_ids)
        self.images, self.api = self, self

    def get(self, reference: str) -> FakeImage:
        return self.raw

    def inspect_image(self, image_id: str) -> dict[str, object]:
        return {**self.raw.attrs, "Architecture": "amd64", "Os": "linux", "Config": {}}

    def history(self, image_id: str) -> list[dict[str, str]]:
        """Base, RUN, COPY, RUN (newest first, as the engine lists it): the COPY's layer is unsettled."""
        run = "/bin/sh -c step && sh /opt/torch-images/settle-layer.sh"
        steps = ["bootstrap", run, "/bin/sh -c #(nop) COPY file:ab in /opt/torch-images/spec.json ", run]
        return [{"CreatedBy": line, "Comment": ""} for line in reversed(steps)]

    def get_image(self, image_id: str, chunk_size: int) -> list[bytes]:
        self.saves += 1
        buffer = io.BytesIO()
        names = [f"{i:064x}/layer.tar" for i in range(len(self.layer_tars))]
        with tarfile.open(fileobj=buffer, mode="w") as saved:
            for name, data in [*zip(names, self.layer_tars, strict=True), ("config.json", b'{"config": {}}')]:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                saved.addfile(info, io.BytesIO(data))
            manifest = json.dumps([{"Config": "config.json", "Layers": names}]).encode()
            info = tarfile.TarInfo("manifest.json")
            info.size = len(manifest)
            saved.addfile(info, io.BytesIO(manifest))
        return [buffer.getvalue()]

    def load(self, chunks: Iterator[bytes]) -> list[FakeImage]:
        self.loaded = b"".join(chunks)
        return [FakeImage("sha256:normalized", [])]

    def loaded_layers(self) -> dict[str, bytes]:
        return {name: data for name, data in _members(self.loaded).items() if name.endswith("/layer.tar")}


@pytest.mark.parametrize("small_layer", [1 << 20, 0], ids=["kept-aside-in-one-pass", "second-pass"])
def test_normalizing_sends_back_only_the_first_unsettled_layer_and_those_above_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_layer: int
) -> None:
    monkeypatch.setenv("TORCH_IMAGES_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(normalize, "SMALL_LAYER", small_layer)
    base_layer = layer([("etc/debian_version", "file", b"12", EPOCH + 1)]).getvalue()  # kept: the base's
    settled = layer([("opt/venv/lib/torch.py", "file", b"torch", EPOCH)]).getvalue()
    copy_step = layer([("opt/torch-images", "dir", "", EPOCH + 99), ("opt/torch-images/spec.json", "file", b"{}", 1)])
    settled_above = layer([("opt/venv/bin/torch-selftest", "file", b"#!", EPOCH)]).getvalue()
    fake = FakeEngine([base_layer, settled, copy_step.getvalue(), settled_above])

    assert normalize.normalize_image(fake, "torch:test", EPOCH, 1, lambda _: None) == "sha256:normalized"  # type: ignore[arg-type]

    assert fake.saves == (1 if small_layer else 2)
    sent = fake.loaded_layers()
    rewritten, _, _ = layers.normalize_layer(copy_step, EPOCH, tmp_path)
    assert sorted(sent) == sorted(
        [
            f"{rewritten.removeprefix('sha256:')}/layer.tar",
            f"{fake.raw.attrs['RootFS']['Layers'][3].removeprefix('sha256:')}/layer.tar",
        ]
    )
    assert settled_above in sent.values()  # passed through byte for byte
    config = json.loads(
        next(v for k, v in _members(fake.loaded).items() if k.endswith(".json") and k != "manifest.json")
    )
    diff_ids = fake.raw.attrs["RootFS"]["Layers"]
    assert config["rootfs"]["diff_ids"] == [diff_ids[0], diff_ids[1], rewritten, diff_ids[3]]


def _members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as opened:
        return {m.name: opened.extractfile(m).read() for m in opened.getmembers() if m.isreg()}  # type: ignore[union-attr]


class _FakeApi:
    def __init__(self, history: list[str], layers_count: int) -> None:
        self._history, self._count = history, layers_count

    def inspect_image(self, image_id: str) -> dict[str, object]:
        diff_ids = [f"sha256:{i:064x}" for i in range(self._count)]
        return {"RootFS": {"Layers": diff_ids}, "Architecture": "amd64", "Os": "linux", "Config": {"Env": []}}

    def history(self, image_id: str) -> list[dict[str, object]]:
        return [{"CreatedBy": line, "Comment": ""} for line in reversed(self._history)]


class _FakeEngine:
    def __init__(self, history: list[str], layers_count: int) -> None:
        self.api = _FakeApi(history, layers_count)


RUN = "|1 PYTHONHASHSEED=0 /bin/sh -c pip install x  && sh /opt/torch-images/settle-layer.sh"


def test_only_an_image_whose_layers_all_come_from_settled_runs_skips_docker_save() -> None:
    settled = ["bootstrap bookworm", "/bin/sh -c #(nop)  ENV A=1", RUN, "/bin/sh -c #(nop)  LABEL x=y", RUN]
    config = normalize.config_from_engine(_FakeEngine(settled, 3), "sha256:x", 1)  # type: ignore[arg-type]
    assert config is not None
    assert [bool(h.get("empty_layer")) for h in config["history"]] == [False, True, False, True, False]
    copied = [*settled, "/bin/sh -c #(nop) COPY file:abc in /opt/x "]
    assert normalize.config_from_engine(_FakeEngine(copied, 4), "sha256:x", 1) is None  # type: ignore[arg-type]
    unsettled = [*settled, "/bin/sh -c touch /x"]
    assert normalize.config_from_engine(_FakeEngine(unsettled, 4), "sha256:x", 1) is None  # type: ignore[arg-type]
    assert normalize.config_from_engine(_FakeEngine(settled, 4), "sha256:x", 1) is None  # type: ignore[arg-type]
