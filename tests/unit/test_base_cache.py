"""A base's root filesystem in the cache proves itself: it is loaded only as the plain file with
the sha256 kept beside it when it was made. Truncated, changed, a link, or without its digest, it
is removed with one line, and the base is bootstrapped again (bases.checked_cached_rootfs)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from builder.engine import bases

TAG = "torch-images/base:bookworm-amd64-0123456789abcdef"


@pytest.fixture
def kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A rootfs kept in an empty cache the way a bootstrap keeps it."""
    monkeypatch.setenv("TORCH_IMAGES_CACHE", str(tmp_path / "cache"))
    made = tmp_path / "rootfs.tar"
    made.write_bytes(b"a canonical tar" * 1000)
    bases._keep_in_cache(made, TAG)
    return bases.cached_rootfs(TAG)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


def _append(path: Path) -> None:
    path.write_bytes(path.read_bytes() + b"planted")


def _link(path: Path) -> None:
    target = path.with_name("elsewhere.tar")
    path.replace(target)
    path.symlink_to(target)


def _drop_digest(path: Path) -> None:
    path.with_name(path.name + ".sha256").unlink()


def test_a_rootfs_kept_whole_with_its_digest_is_loaded(kept: Path) -> None:
    said: list[str] = []
    assert bases.checked_cached_rootfs(TAG, said.append) == kept
    assert said == [] and not list(kept.parent.glob(".part-*"))


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (_truncate, "has sha256"),
        (_append, "has sha256"),
        (_link, "is not a plain file"),
        (_drop_digest, "has no sha256 recorded beside it"),
    ],
)
def test_a_damaged_cached_rootfs_is_removed_with_one_line_and_never_loaded(
    kept: Path, damage: Callable[[Path], None], why: str
) -> None:
    damage(kept)
    said: list[str] = []
    assert bases.checked_cached_rootfs(TAG, said.append) is None
    assert len(said) == 1 and why in said[0] and "bootstrapped again" in said[0]
    assert not kept.exists() and not kept.is_symlink() and not kept.with_name(kept.name + ".sha256").exists()


@pytest.mark.parametrize("fault", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_rootfs_copy_cut_by_a_full_disk_or_a_signal_leaves_no_partial_file_and_no_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: BaseException
) -> None:
    """Issue 58: the copy into the cache failing halfway (the disk full, Ctrl-C) left its
    `.part-` file behind; now nothing of it stays, and no rootfs or digest is kept."""
    monkeypatch.setenv("TORCH_IMAGES_CACHE", str(tmp_path / "cache"))
    made = tmp_path / "rootfs.tar"
    made.write_bytes(b"a canonical tar" * 1000)

    def half_a_copy(source: Path, target: Path) -> None:
        target.write_bytes(source.read_bytes()[:100])
        raise fault

    monkeypatch.setattr(bases.shutil, "copyfile", half_a_copy)
    with pytest.raises(type(fault)):
        bases._keep_in_cache(made, TAG)
    assert list(bases.cached_rootfs(TAG).parent.iterdir()) == []
