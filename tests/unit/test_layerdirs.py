"""A layer read from the overlay2 driver's folder (builder/engine/layerdirs.py) gives the entries
the driver's differ writes into its tar: byte order of names, whiteout devices as `.wh.` files,
an opaque directory's marker, hard links by inode; and the canonical layer made from them is the
one made from such a tar."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from builder.engine import canonical, layerdirs

EPOCH = 1_733_097_600


def _layer(root: Path) -> None:
    (root / "b").mkdir()
    (root / "b" / "file").write_bytes(b"data")
    os.link(root / "b" / "file", root / "a-link")  # sorts before its target: it carries the data
    (root / "c").symlink_to("b/file")
    (root / "B").write_bytes(b"upper case sorts first")
    for path in (root / "b" / "file", root / "a-link", root / "B", root / "b"):
        os.utime(path, (EPOCH + 99, EPOCH + 99), follow_symlinks=False)


def test_a_folders_entries_come_in_walk_order_with_hard_links_by_inode(tmp_path: Path) -> None:
    _layer(tmp_path)
    found = layerdirs.LayerFolder(tmp_path).gathered(EPOCH)
    names = [(e.name, e.kind) for e, _ in canonical.in_walk_order(found)]
    assert names == [("B", canonical.REGULAR), ("a-link", canonical.REGULAR), ("b", canonical.DIRECTORY),
                     ("b/file", canonical.HARDLINK), ("c", canonical.SYMLINK)]  # fmt: skip
    assert all(e.mtime <= EPOCH for e, _ in found)


@pytest.mark.skipif(os.geteuid() != 0, reason="whiteout devices and trusted.* attributes need root")
def test_whiteouts_and_opaque_directories_read_as_the_differ_writes_them(tmp_path: Path) -> None:
    os.mknod(tmp_path / "gone", 0o644 | 0o020000, os.makedev(0, 0))
    (tmp_path / "fresh").mkdir(mode=0o755)
    os.setxattr(tmp_path / "fresh", "trusted.overlay.opaque", b"y")
    found = {e.name: e for e, _ in layerdirs.LayerFolder(tmp_path).gathered(EPOCH)}
    assert found[".wh.gone"].kind == canonical.REGULAR and found[".wh.gone"].mode == 0o600
    marker = found["fresh/.wh..wh..opq"]
    assert (marker.kind, marker.mode, marker.mtime) == (canonical.REGULAR, 0o755, 0)


def test_the_canonical_layer_from_a_folder_is_the_one_from_its_tar(tmp_path: Path) -> None:
    root = tmp_path / "layer"
    root.mkdir()
    _layer(root)
    from_folder = canonical.rewrite_gathered(
        layerdirs.LayerFolder(root).gathered(EPOCH), tmp_path / "a.tar", canonical.LowerTree()
    )
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(os.listdir(root)):
            tar.add(root / name, arcname=name)
    from_tar = canonical.rewrite_layer(lambda: io.BufferedReader(io.BytesIO(buffer.getvalue())), tmp_path / "b.tar",
                                       canonical.LowerTree(), EPOCH)  # fmt: skip
    assert from_folder.diff_id == from_tar.diff_id
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
