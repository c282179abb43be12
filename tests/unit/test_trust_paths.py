"""No path under images/, a bundle, the cache or the wheel server's list is followed through a
symbolic link or allowed to leave its folder; a bundle holds exactly what the repository commits.

Each case is one the review found (issue 25), run through the command a user or CI runs where
there is one: exit 2, one line, and nothing outside the folder read, written or deleted.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from builder import confined, digests
from builder.assemble import bundle
from builder.errors import UserError
from builder.lock import inputs
from builder.lock import requirements as lock
from builder.plan.matrix import load_matrix
from builder.wheelhouse import served, wheelhouse, wheelserver
from tests.unit.test_hostile_inputs import CELL, Project, assert_one_line_error, project, run

__all__ = ["project"]  # the fixture, shared with test_hostile_inputs
SECRET = "host secret: do not print\n"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file outside the project that a link points at."""
    path = tmp_path / "outside" / "secret.txt"
    path.parent.mkdir()
    path.write_text(SECRET)
    return path


# ---------------------------------------------------------------- names


@pytest.mark.parametrize("name", ["/etc/passwd", "../x", "a/../../x", "a//b", "/", "", ".", "a/./b", "a\\b", "a\nb"])
def test_a_name_that_could_leave_its_folder_is_refused(name: str) -> None:
    with pytest.raises(UserError, match="is not a relative path of plain names"):
        confined.name_parts(name)


def test_a_plain_relative_name_is_kept() -> None:
    assert confined.name_parts("sha256/ab/x.whl") == ("sha256", "ab", "x.whl")


# ---------------------------------------------------------------- images/<cell>/


def test_a_symlinked_lock_is_refused_without_printing_what_it_points_at(
    project: Project, capsys: pytest.CaptureFixture[str], outside: Path
) -> None:
    path = project.cell() / lock.STACK_LOCK
    path.unlink()
    path.symlink_to(outside)
    for command in (["lock", "--check"], ["render", "--check"], ["render"], ["build", CELL]):
        code, output = run(project, capsys, *command)
        assert_one_line_error(code, output, str(path), "is a symbolic link")
        assert "host secret" not in output


def test_render_writes_no_file_through_a_symlinked_dockerfile(
    project: Project, capsys: pytest.CaptureFixture[str], outside: Path
) -> None:
    path = project.cell() / "Dockerfile"
    path.unlink()
    path.symlink_to(outside)
    code, output = run(project, capsys, "render")
    assert_one_line_error(code, output, str(path), "is a symbolic link")
    assert outside.read_text() == SECRET


def test_a_symlinked_cell_folder_is_refused(
    project: Project, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    project.cell().rename(elsewhere)
    project.cell().symlink_to(elsewhere, target_is_directory=True)
    code, output = run(project, capsys, "lock", "--check")
    assert_one_line_error(code, output, str(project.cell()), "is a symbolic link")


def test_render_deletes_nothing_through_a_symlinked_orphan_folder(
    project: Project, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    for name in ("Dockerfile", "spec.json", "requirements.lock"):  # names render would delete in an orphan
        (victim / name).write_text("keep me\n")
    link = project.root / "images" / "0.0.0-gone-bookworm-runtime"
    link.symlink_to(victim, target_is_directory=True)
    code, output = run(project, capsys, "render")
    assert code == 0, output
    assert sorted(p.name for p in victim.iterdir()) == ["Dockerfile", "requirements.lock", "spec.json"]
    code, output = run(project, capsys, "render", "--check")
    assert code != 0 and "a symbolic link: remove it" in output and "Traceback" not in output


def test_the_images_folder_itself_may_be_a_link(
    project: Project, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    kept = tmp_path / "kept-images"
    (project.root / "images").rename(kept)
    (project.root / "images").symlink_to(kept, target_is_directory=True)
    assert run(project, capsys, "lock", "--check")[0] == 0
    assert run(project, capsys, "render", "--check")[0] == 0


# ---------------------------------------------------------------- the wheel server's list


def _status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/{path}", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_served_list_entries_that_leave_the_cache_are_never_served(tmp_path: Path, outside: Path) -> None:
    house = wheelhouse.Wheelhouse(tmp_path / "house")
    relative = Path("..") / outside.relative_to(tmp_path)
    hostile = [str(relative), str(outside), "files//x", "files/../../outside/secret.txt"]
    with (house.root / wheelhouse.SERVED_LIST).open("a") as listing:  # as another process could write it
        listing.writelines(line + "\n" for line in hostile)
    assert not any(house.serves(line) for line in hostile)
    with wheelserver.serve(house, "127.0.0.1:18743"):
        for line in hostile:
            assert _status(18743, line) == 404, line
    with pytest.raises(UserError, match="is not a relative path"):
        house.allow(["../outside/secret.txt"])


def test_a_cache_whose_root_is_a_link_still_serves_what_was_asked(tmp_path: Path) -> None:
    real = tmp_path / "restored-cache"
    real.mkdir()
    (tmp_path / "cache").symlink_to(real, target_is_directory=True)
    house = wheelhouse.Wheelhouse(tmp_path / "cache")
    house.place(b"#!/bin/sh\n", house.root / "files/0123456789abcdef/x.sh")
    house.allow(["files/0123456789abcdef/x.sh"])
    with wheelserver.serve(house, "127.0.0.1:18744"):
        assert _status(18744, "files/0123456789abcdef/x.sh") == 200


# ---------------------------------------------------------------- bundles


def _make_bundle(root: Path, files: dict[str, bytes], cell: str = CELL) -> Path:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    listed = {name: digests.sha256_file(root / name) for name in files}
    (root / bundle.MANIFEST).write_text(json.dumps({"cell": cell, "builder": {}, "files": listed}))
    return root


def test_a_symbolic_link_in_a_bundle_is_refused(tmp_path: Path, outside: Path) -> None:
    root = _make_bundle(tmp_path / "b", {"matrix.yaml": b"x\n"})
    (root / "cache").mkdir()
    (root / "cache" / "secret.txt").symlink_to(outside)
    with pytest.raises(UserError, match="is a symbolic link; a bundle holds files only"):
        bundle.open_bundle(root, lambda _: None)


@pytest.mark.parametrize("name", ["cache//tmp/evil", "cache/../../evil", "/etc/evil", "cache/./x"])
def test_a_manifest_name_that_leaves_the_bundle_is_refused_before_anything_is_copied(tmp_path: Path, name: str) -> None:
    root = _make_bundle(tmp_path / "b", {"matrix.yaml": b"x\n"})
    manifest = json.loads((root / bundle.MANIFEST).read_text())
    manifest["files"][name] = "a" * 64
    (root / bundle.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="is not a relative path of plain names"):
        bundle.open_bundle(root, lambda _: None)


def test_a_manifest_that_is_not_what_bundle_writes_is_one_line(tmp_path: Path) -> None:
    root = _make_bundle(tmp_path / "b", {"matrix.yaml": b"x\n"})
    for document in ({"cell": "c", "files": {"matrix.yaml": 5}}, {"cell": "../c", "files": {}}, [1, 2]):
        (root / bundle.MANIFEST).write_text(json.dumps(document))
        with pytest.raises(UserError) as refused:
            bundle.open_bundle(root, lambda _: None)
        assert "\n" not in refused.value.line()


@pytest.fixture
def repository_cell(project: Project) -> tuple[Project, object, inputs.CellLocks]:
    grid = load_matrix(project.matrix)
    cell = grid.cell(CELL)
    return project, cell, inputs.read(cell, grid)


def _cell_files(project: Project) -> dict[str, str]:
    """The cell folder as gather lists it: its files, by name under the bundle, with their sha256."""
    return {f"images/{CELL}/{p.name}": digests.sha256_file(p) for p in sorted(project.cell().iterdir())}


def test_a_bundle_holding_the_repositorys_cell_and_its_locked_files_passes(
    repository_cell: tuple[Project, object, inputs.CellLocks], tmp_path: Path
) -> None:
    project, cell, locks = repository_cell
    assert locks.stack is not None and locks.debian is not None
    wheel_hash = next(iter(locks.stack.packages.values())).hashes[0]
    deb = next(iter(locks.debian.files.values()))
    files = {
        **_cell_files(project),
        f"cache/sha256/{wheel_hash[:2]}/{wheel_hash}/x-1.0-py3-none-any.whl": wheel_hash,
        f"cache/sha256/{deb.sha256[:2]}/{deb.sha256}/{Path(deb.path).name}": deb.sha256,
        f"cache/{served.lock_page(locks.stack, locks.cell)}{lock.STACK_LOCK}": locks.stack.sha256,
    }
    bundle.check_against_repository(bundle.Bundle(tmp_path, CELL, files), cell, locks)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        ("lock", "requirements.lock differs from this repository's"),
        ("dockerfile", "Dockerfile differs from this repository's"),
        ("image-id", "image-id differs from this repository's"),
        ("no-image-id", "image-id is missing from the bundle"),
        ("extra-wheel", "not a file the cell's locks name"),
        ("misfiled-wheel", "not a file the cell's locks name"),
        ("other-file", "not a file of the cell's locks"),
    ],
)
def test_a_bundle_changed_together_with_its_manifest_is_refused(
    repository_cell: tuple[Project, object, inputs.CellLocks], tmp_path: Path, edit: str, needle: str
) -> None:
    # What the review did: change a file and its manifest line, so the bundle checks itself clean.
    project, cell, locks = repository_cell
    assert locks.stack is not None
    files = _cell_files(project)
    wheel_hash = next(iter(locks.stack.packages.values())).hashes[0]
    other = "e" * 64
    changes: dict[str, tuple[str, str | None]] = {
        "lock": (f"images/{CELL}/requirements.lock", other),
        "dockerfile": (f"images/{CELL}/Dockerfile", other),
        "image-id": (f"images/{CELL}/image-id", other),
        "no-image-id": (f"images/{CELL}/image-id", None),
        "extra-wheel": (f"cache/sha256/{other[:2]}/{other}/evil-1.0-py3-none-any.whl", other),
        "misfiled-wheel": (f"cache/sha256/{wheel_hash[:2]}/{wheel_hash}/x.whl", other),
        "other-file": ("cache/served.list", other),
    }
    name, sha256 = changes[edit]
    if sha256 is None:
        files.pop(name)
    else:
        files[name] = sha256
    with pytest.raises(UserError, match=needle):
        bundle.check_against_repository(bundle.Bundle(tmp_path, CELL, files), cell, locks)  # type: ignore[arg-type]


def test_bundle_gathers_no_file_through_a_link_in_a_cell_folder(tmp_path: Path, outside: Path) -> None:
    # The review saw `bundle` copy a symlink's target into the bundle.
    folder = tmp_path / "images" / CELL
    folder.mkdir(parents=True)
    (folder / "Dockerfile").write_text("FROM scratch\n")
    (folder / "requirements.lock").symlink_to(outside)
    with pytest.raises(UserError, match="is a symbolic link; a bundle holds files only"):
        list(bundle._files_under(folder))
