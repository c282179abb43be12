"""Debian package pins: what apt's simulation says it would install, recorded exactly."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from builder.engine import bases, debfile
from builder.errors import UserError
from builder.lock import aptindex, debian
from builder.plan.matrix import load_matrix

REPO = Path(__file__).resolve().parents[2]


def pinned(common: tuple[str, ...], flavor: tuple[str, ...] = (), base: tuple[str, ...] = ()) -> debian.DebianLock:
    """A lock of these pins, each with a made-up archive file (as `lock` writes one)."""

    def file_of(pin: str) -> aptindex.ArchiveFile:
        name, version = pin.split("=", 1)
        path = f"pool/main/{name[0]}/{name}/{name}_{version.split(':')[-1]}_amd64.deb"
        return aptindex.ArchiveFile(path, hashlib.sha256(pin.encode()).hexdigest())

    return debian.DebianLock(common, flavor, base, {pin: file_of(pin) for pin in (*base, *common, *flavor)})


SIMULATION = """Reading package lists...
Building dependency tree...
The following NEW packages will be installed:
  gcc-12 libpython3.11 python3
Inst libpython3.11-minimal (3.11.2-6+deb12u6 Debian:12.12/stable [amd64])
Inst gcc-12 (12.2.0-14+deb12u1 Debian:12.12/stable [amd64]) []
Inst libc-bin [2.36-9+deb12u9] (2.36-9+deb12u13 Debian:12.12/stable [amd64])
Conf gcc-12 (12.2.0-14+deb12u1 Debian:12.12/stable [amd64])
"""


def test_simulation_output_becomes_exact_pins_sorted() -> None:
    assert debian.parse_simulation(SIMULATION) == [
        "gcc-12=12.2.0-14+deb12u1",
        "libc-bin=2.36-9+deb12u13",  # an upgrade of a base package is pinned at its new version
        "libpython3.11-minimal=3.11.2-6+deb12u6",
    ]


def test_lock_round_trips_with_its_fingerprint(tmp_path: Path) -> None:
    lock = pinned(("gcc-12=12.2.0-14+deb12u1",), ("htop=3.2.2-2",), ("libc6=2.36-9+deb12u14",))
    path = tmp_path / debian.DEBIAN_LOCK
    path.write_text(lock.text("0123456789abcdef"))
    read = debian.DebianLock.read(path)
    assert (read.base, read.common, read.flavor, read.files) == (lock.base, lock.common, lock.flavor, lock.files)
    assert read.fingerprint == "0123456789abcdef"


def test_a_file_of_the_security_archive_round_trips_and_is_fetched_from_it(tmp_path: Path) -> None:
    fixed = aptindex.ArchiveFile("pool/updates/main/o/openssl/libssl3_3.0.17-1~deb12u3_amd64.deb", "a" * 64, "security")
    lock = debian.DebianLock(("libssl3=3.0.17-1~deb12u3",), (), (), {"libssl3=3.0.17-1~deb12u3": fixed})
    path = tmp_path / debian.DEBIAN_LOCK
    path.write_text(lock.text("0123456789abcdef"))
    assert '"security pool/updates/main/o/openssl/' in path.read_text()
    assert debian.DebianLock.read(path).files == lock.files
    base = load_matrix(REPO / "matrix.yaml").cell("2.13.0-cpu-bookworm-runtime").base
    assert base.mirror_of("security") == "http://deb.debian.org/debian-security"
    assert base.mirror_of("") == "http://deb.debian.org/debian"
    assert base.sources()[-1] == ("http://deb.debian.org/debian-security", "bookworm-security")


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        ("_amd64.deb ", "_amd64.deb; rm -rf / ", "is not an archive file"),
        ('": "pool/', '": "mirror pool/', "is not an archive file"),  # only the word `security` names a source
        ('": "pool/', '": "security security pool/', "is not an archive file"),
        ("pool/main/g/gcc-12/", "pool/../../etc/", "is not an archive file"),
        ("deb12u1_amd64.deb ", "deb12u1_amd64.deb 0x", "is not an archive file"),
    ],
)
def test_a_lock_file_entry_that_is_not_a_pool_path_and_sha256_is_refused_with_its_line(
    tmp_path: Path, old: str, new: str, says: str
) -> None:
    path = tmp_path / debian.DEBIAN_LOCK
    text = pinned(("gcc-12=12.2.0-14+deb12u1",)).text("0123456789abcdef")
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(UserError, match=says) as refused:
        debian.DebianLock.read(path)
    assert refused.value.line().startswith(f"{path}:")


def test_a_pin_without_its_file_is_refused(tmp_path: Path) -> None:
    lock = pinned(("gcc-12=12.2.0-14+deb12u1",))
    without = debian.DebianLock(("gcc-12=12.2.0-14+deb12u1", "htop=3.2.2-2"), (), (), lock.files)
    path = tmp_path / debian.DEBIAN_LOCK
    path.write_text(without.text("0123456789abcdef"))
    with pytest.raises(UserError, match=r'htop=3\.2\.2-2 has no entry in "files"'):
        debian.DebianLock.read(path)


RELEASE = """Origin: Debian
Suite: stable
SHA256:
 515e692f2c4121c6fcec444ef100cc18f79a991910615f3a88c8b7becfc94d2f 50060337 main/binary-amd64/Packages
 9e0b5aabb2465b3d2e7a7fe27f9913846277833f7a2826e7767acccff5b588c5  8790396 main/binary-amd64/Packages.xz
"""
PACKAGES = """Package: gcc-12
Version: 12.2.0-14+deb12u1
Architecture: amd64
Filename: pool/main/g/gcc-12/gcc-12_12.2.0-14+deb12u1_amd64.deb
SHA256: 1111111111111111111111111111111111111111111111111111111111111111

Package: htop
Version: 3.2.2-2
Architecture: amd64
Filename: pool/main/h/htop/htop_3.2.2-2_amd64.deb
SHA256: 2222222222222222222222222222222222222222222222222222222222222222
"""


def test_the_signed_release_names_each_index_file_by_sha256() -> None:
    assert (
        aptindex.listed_sha256(RELEASE, "main/binary-amd64/Packages.xz")
        == "9e0b5aab" + RELEASE.split("9e0b5aab")[1][:56]
    )
    assert aptindex.listed_sha256(RELEASE, "contrib/binary-amd64/Packages.xz") is None


def test_each_pin_is_found_in_the_packages_index_or_the_lock_says_to_lock_again() -> None:
    index = aptindex.parse_packages(PACKAGES)
    assert index["htop=3.2.2-2"] == aptindex.ArchiveFile("pool/main/h/htop/htop_3.2.2-2_amd64.deb", "2" * 64)
    base = type("Base", (), {"mirror": "http://deb.debian.org/debian", "suite": "bookworm", "arch": "amd64"})()
    with pytest.raises(UserError, match=r"htop=3.2.2-3 is not in http://deb.debian.org/debian bookworm \(amd64\)"):
        aptindex.files_of(index, ["htop=3.2.2-3"], base)  # type: ignore[arg-type]


def test_a_bases_bootstrap_hooks_are_part_of_its_debian_lock_fingerprint() -> None:
    grid = load_matrix(REPO / "matrix.yaml")
    cell = grid.cell("2.13.0-cpu-bookworm-runtime")
    assert cell.base.hooks == ("merged-usr",)
    without = dataclasses.replace(cell, base=dataclasses.replace(cell.base, hooks=()))
    assert debian.fingerprint(cell) != debian.fingerprint(without)


def test_a_hook_is_mmdebstraps_own_folder_and_a_missing_one_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = load_matrix(REPO / "matrix.yaml").cell("2.13.0-cpu-bookworm-runtime").base
    monkeypatch.setattr(bases, "MMDEBSTRAP_HOOKS", tmp_path)
    with pytest.raises(UserError) as caught:
        bases.hook_options(base)
    assert "merged-usr is missing" in caught.value.line() and "mmdebstrap" in caught.value.line()
    (tmp_path / "merged-usr").mkdir()
    assert bases.hook_options(base) == [f"--hook-dir={tmp_path / 'merged-usr'}"]


def test_each_keyring_fetch_writes_a_partial_file_of_its_own_and_leaves_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two builders filling one cache entry at once (the suite's two parts, two cells) must not
    write one partial file: each downloads beside the entry under a name of its own, then renames
    it onto the entry, or removes it when its sha256 is wrong."""
    monkeypatch.setenv("TORCH_IMAGES_CACHE", str(tmp_path / "cache"))
    written: list[Path] = []

    def download(url: str, destination: Path, timeout: int, most: int) -> None:
        written.append(destination)
        destination.write_bytes(b"not the pinned package")

    monkeypatch.setattr(debfile.downloads, "download", download)
    keyring = next(c.base for c in load_matrix(REPO / "matrix.yaml").cells if c.base.name == "noble").keyring
    assert keyring is not None
    for _ in range(2):
        with pytest.raises(UserError, match=r"; the matrix pins [0-9a-f]{64}$"):
            bases.keyring_file(keyring, tmp_path)
    first, second = written
    assert first != second and first.parent == second.parent
    assert first.parent.name == keyring.sha256 and list(first.parent.iterdir()) == []


def test_a_pinned_download_stops_at_its_cap_and_an_interrupted_one_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 57: a server that sends a pinned .deb without end is stopped at MAX_PINNED_BYTES (here a
    file:// source larger than a lowered cap), and Ctrl-C in the middle leaves no `.part-*` file."""
    source = tmp_path / "huge.deb"
    source.write_bytes(b"x" * 4096)
    cached = tmp_path / "cache" / "huge.deb"
    monkeypatch.setattr(debfile, "MAX_PINNED_BYTES", 1024)
    with pytest.raises(UserError, match=r"could not fetch file://.*huge\.deb \(.*has more than 1024 bytes\)"):
        debfile.fetch(source.as_uri(), "0" * 64, cached, "the test pins")
    assert list(cached.parent.iterdir()) == []

    def interrupted(url: str, destination: Path, timeout: int, most: int) -> None:
        destination.write_bytes(b"half a package")
        raise KeyboardInterrupt

    monkeypatch.setattr(debfile.downloads, "download", interrupted)
    with pytest.raises(KeyboardInterrupt):
        debfile.fetch("http://127.0.0.1:9/x.deb", "0" * 64, cached, "the test pins")
    assert list(cached.parent.iterdir()) == []


def _tool_deb(tmp_path: Path) -> Path:
    """A real .deb (dpkg-deb --build) holding one program."""
    tree = tmp_path / "pkg"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        "Package: demo-tool\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@t>\nDescription: a test tool\n"
    )
    program = tree / "usr" / "bin" / "demo-tool"
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\necho the packaged tool\n")
    program.chmod(0o755)
    deb = tmp_path / "demo-tool_1.0_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(deb)], check=True, capture_output=True)
    return deb


@pytest.mark.parametrize("change", ["rewritten", "made executable by others", "replaced by a link", "added"])
def test_an_unpacked_tool_changed_in_the_cache_is_unpacked_again_before_it_runs(tmp_path: Path, change: str) -> None:
    """Issue 58: the tools publish and emulation run are unpacked once into the cache, which a CI
    job restores from anywhere; a changed tree is found on use and unpacked again from the .deb."""
    deb = _tool_deb(tmp_path)
    root = tmp_path / "cache" / "tools" / "demo-tool-1.0"
    program = debfile.unpacked(deb, root, "1.0") / "usr" / "bin" / "demo-tool"
    original = program.read_bytes()
    if change == "rewritten":
        program.write_text("#!/bin/sh\necho planted\n")
    elif change == "made executable by others":
        program.chmod(0o777)
    elif change == "replaced by a link":
        planted = tmp_path / "planted"
        planted.write_bytes(original)  # even to the same bytes: the link could be pointed elsewhere
        program.unlink()
        program.symlink_to(planted)
    else:
        (program.parent / "demo-tool-helper").write_text("#!/bin/sh\n")
    again = debfile.unpacked(deb, root, "1.0") / "usr" / "bin" / "demo-tool"
    assert not again.is_symlink() and again.read_bytes() == original
    assert stat.S_IMODE(again.stat().st_mode) == 0o755
    assert sorted(p.name for p in again.parent.iterdir()) == ["demo-tool"]


@pytest.mark.parametrize("change", ["truncated", "changed", "replaced by a link"])
def test_a_pinned_cache_entry_that_is_not_its_bytes_is_fetched_again(tmp_path: Path, change: str) -> None:
    """Issue 58: keyrings, Packages indexes and tool packages live in the cache by their sha256;
    one truncated, changed or linked (even to the right bytes) is fetched again, never used."""
    source = tmp_path / "origin.deb"
    source.write_bytes(b"the pinned package " * 64)
    pinned = hashlib.sha256(source.read_bytes()).hexdigest()
    cached = tmp_path / "cache" / pinned / "origin.deb"
    debfile.fetch(source.as_uri(), pinned, cached, "the test pins")
    if change == "truncated":
        cached.write_bytes(source.read_bytes()[:100])
    elif change == "changed":
        cached.write_bytes(source.read_bytes().replace(b"pinned", b"planted"))
    else:
        elsewhere = tmp_path / "elsewhere.deb"
        elsewhere.write_bytes(source.read_bytes())
        cached.unlink()
        cached.symlink_to(elsewhere)
    assert debfile.fetch(source.as_uri(), pinned, cached, "the test pins") == cached
    assert not cached.is_symlink() and hashlib.sha256(cached.read_bytes()).hexdigest() == pinned


def _later(monkeypatch: pytest.MonkeyPatch, seconds: float = 10) -> None:
    """The clock moved on: what was changed before now is settled (a change time cannot be set back)."""
    now = time.time_ns() + int(seconds * 1e9)
    monkeypatch.setattr(debfile.time, "time_ns", lambda: now)


def test_a_settled_unpacked_tree_is_not_hashed_again_until_an_entry_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 58's follow-up: qemu's 455 MB tree was hashed on every use (about 3 s each). Its
    bytes are hashed again only where an entry's inode, size, mode or times moved."""
    deb = _tool_deb(tmp_path)
    root = tmp_path / "cache" / "tools" / "demo-tool-1.0"
    debfile.unpacked(deb, root, "1.0")
    hashed: list[Path] = []
    real = debfile.tree_digest
    monkeypatch.setattr(debfile, "tree_digest", lambda where: hashed.append(where) or real(where))
    debfile.unpacked(deb, root, "1.0")
    assert hashed == [root]  # just unpacked: its times are too recent to trust, so its bytes are read
    _later(monkeypatch)
    debfile.unpacked(deb, root, "1.0")  # bytes read once more, and the settled signature kept
    debfile.unpacked(deb, root, "1.0")
    debfile.unpacked(deb, root, "1.0")
    assert hashed == [root, root]
    program = root / "usr" / "bin" / "demo-tool"
    text = program.read_text()
    info = program.stat()
    program.write_text(text.replace("packaged", "planted!"))  # the same size
    os.utime(program, ns=(info.st_atime_ns, info.st_mtime_ns))  # its modification time put back
    _later(monkeypatch, 20)
    debfile.unpacked(deb, root, "1.0")
    # The change time moved: the bytes read (they differ), then unpacked again and the new tree hashed.
    assert len(hashed) == 4 and program.read_text() == text


def test_a_tree_changed_within_its_clock_tick_is_never_trusted_by_its_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change in the same tick of the file system's clock as the one before keeps its times: an
    entry changed within the last two seconds gives no signature, and the bytes are read."""
    deb = _tool_deb(tmp_path)
    root = debfile.unpacked(deb, tmp_path / "cache" / "tools" / "demo-tool-1.0", "1.0")
    assert debfile.stat_signature(root) == ""
    _later(monkeypatch)
    assert debfile.stat_signature(root) != ""
    monkeypatch.undo()
    (root / "usr" / "bin" / "demo-tool").chmod(0o700)
    assert debfile.stat_signature(root) == ""
