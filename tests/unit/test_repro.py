"""Layer normalization: the same files give the same layer, whatever the build's times and order."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from builder import repro

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
    return repro.normalize_layer(layer(entries), EPOCH, tmp_path)


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
    result = json.loads(repro.normalize_config(config, ["sha256:new"], EPOCH))
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
        (repro.cache_dir() / f"{digest.removeprefix('sha256:')}.manifest.json").write_text(json.dumps(files))
    assert repro.differing_paths(one, two) == ["a"]
