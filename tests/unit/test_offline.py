"""Offline rebuilds without an engine: the local apt repository, bundles' manifests, recorded IDs."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from builder import digests
from builder.assemble import bundle
from builder.errors import UserError
from builder.lock.aptindex import ArchiveFile
from builder.plan.cell import Cell
from builder.plan.matrix import load_matrix
from builder.repro import recorded
from builder.wheelhouse import aptrepo, served, wheelhouse
from builder.wheelhouse.fileref import FileRef
from tests.conftest import FIXTURES


def make_deb(folder: Path, name: str, version: str, depends: str = "") -> Path:
    """A real .deb, as dpkg-deb builds it."""
    root = folder / f"{name}-root"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "usr/share" / name).mkdir(parents=True)
    (root / "usr/share" / name / "README").write_text(f"{name} {version}\n")
    control = f"Package: {name}\nVersion: {version}\nArchitecture: all\nMaintainer: t <t@example.org>\n"
    control += (f"Depends: {depends}\n" if depends else "") + f"Description: {name}\n"
    (root / "DEBIAN/control").write_text(control)
    deb = folder / f"{name}_{version}_all.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)], check=True, capture_output=True
    )
    return deb


@pytest.fixture
def repository(tmp_path: Path) -> tuple[wheelhouse.Wheelhouse, list[ArchiveFile], object]:
    """Two .debs in a wheelhouse (as if fetched from a mirror: here, a file:// one)."""
    mirror = tmp_path / "mirror"
    pool = mirror / "pool/main"
    pool.mkdir(parents=True)
    debs = [make_deb(pool, "alpha", "1.0-1"), make_deb(pool, "beta", "2:2.0-1", depends="alpha (>= 1.0)")]
    files = [ArchiveFile(f"pool/main/{d.name}", digests.sha256_file(d)) for d in debs]
    grid = load_matrix(FIXTURES / "multiarch.yaml")
    base = dataclasses.replace(grid.cells[0].base, mirror=mirror.as_uri())
    return wheelhouse.Wheelhouse(tmp_path / "house"), files, base


def test_the_local_repository_is_named_by_its_files_and_lists_each_with_its_sha256(repository: tuple) -> None:  # type: ignore[type-arg]
    house, files, base = repository
    where = aptrepo.publish(house, base, files)
    assert where == served.apt_repository(reversed(files)) != served.apt_repository(files[:1])
    packages = (house.root / where / "Packages").read_text()
    for file in files:
        blob = served.blob_path(file.sha256, Path(file.path).name)
        assert f"Filename: {blob}\n" in packages and f"SHA256: {file.sha256}\n" in packages
        assert house.serves(blob)
    assert "Depends: alpha (>= 1.0)" in packages and "Version: 2:2.0-1" in packages
    release = (house.root / where / "Release").read_text()
    assert f"Suite: {base.suite}\n" in release
    assert hashlib.sha256(packages.encode()).hexdigest() in release


def test_the_same_debs_give_the_same_repository_bytes_in_another_cache(repository: tuple, tmp_path: Path) -> None:  # type: ignore[type-arg]
    house, files, base = repository
    where = aptrepo.publish(house, base, files)
    elsewhere = wheelhouse.Wheelhouse(tmp_path / "elsewhere")
    assert aptrepo.publish(elsewhere, base, list(reversed(files))) == where
    for name in ("Packages", "Release"):
        assert (elsewhere.root / where / name).read_bytes() == (house.root / where / name).read_bytes()


def test_a_deb_that_does_not_match_its_locked_sha256_is_refused(repository: tuple) -> None:  # type: ignore[type-arg]
    house, files, base = repository
    wrong = [dataclasses.replace(files[0], sha256="0" * 64)]
    with pytest.raises(UserError, match="sha256 mismatch"):
        aptrepo.publish(house, base, wrong)


def test_offline_a_file_missing_from_the_cache_is_refused_without_a_download(tmp_path: Path) -> None:
    house = wheelhouse.Wheelhouse(tmp_path / "house", offline=True)
    ref = FileRef("alpha", "alpha_1.0-1_all.deb", "http://127.0.0.1:9/pool/alpha_1.0-1_all.deb", "1" * 64)
    with pytest.raises(UserError, match="is not in the cache and the build is offline"):
        house.fetch(ref)


# ---------------------------------------------------------------- bundles


@pytest.fixture
def fake_bundle(tmp_path: Path) -> Path:
    """A bundle's layout: the builder's shipped files, a cache file, and the manifest."""
    root = tmp_path / "bundle"
    files = {}
    for name, folder in bundle.SHIPPED.items():
        shutil.copytree(folder, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "cache/sha256/ab").mkdir(parents=True)
    (root / "cache/sha256/ab/a.deb").write_bytes(b"a deb")
    (root / "matrix.yaml").write_text("registry: 127.0.0.1:5000\n")
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        files[path.relative_to(root).as_posix()] = digests.sha256_file(path)
    manifest = {"cell": "c", "builder": {"version": "0", "commit": "abc123"}, "files": files}
    (root / bundle.MANIFEST).write_text(json.dumps(manifest))
    return root


def test_an_intact_bundle_opens(fake_bundle: Path) -> None:
    assert bundle.open_bundle(fake_bundle, lambda _: None).cell == "c"


def test_a_bundle_file_altered_is_refused_naming_it(fake_bundle: Path) -> None:
    (fake_bundle / "cache/sha256/ab/a.deb").write_bytes(b"another deb")
    with pytest.raises(UserError, match=r"cache/sha256/ab/a\.deb does not match its sha256"):
        bundle.open_bundle(fake_bundle, lambda _: None)


def test_a_file_added_to_or_missing_from_a_bundle_is_refused_naming_it(fake_bundle: Path) -> None:
    (fake_bundle / "cache/extra.whl").write_bytes(b"x")
    with pytest.raises(UserError, match=r"cache/extra\.whl is not in the bundle's manifest"):
        bundle.open_bundle(fake_bundle, lambda _: None)
    (fake_bundle / "cache/extra.whl").unlink()
    (fake_bundle / "matrix.yaml").unlink()
    with pytest.raises(UserError, match=r"matrix\.yaml: listed in manifest\.json but missing"):
        bundle.open_bundle(fake_bundle, lambda _: None)


def test_a_bundle_made_with_other_templates_names_the_commit_to_rebuild_with(fake_bundle: Path) -> None:
    template = fake_bundle / "templates/Dockerfile.j2"
    template.write_text(template.read_text() + "# changed\n")
    manifest = json.loads((fake_bundle / bundle.MANIFEST).read_text())
    manifest["files"]["templates/Dockerfile.j2"] = digests.sha256_file(template)
    (fake_bundle / bundle.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(UserError, match=r"templates/Dockerfile\.j2 differs from the bundle's; .* commit abc123"):
        bundle.open_bundle(fake_bundle, lambda _: None)


def test_a_directory_without_a_manifest_is_not_a_bundle(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"is not a bundle: it has no manifest\.json"):
        bundle.open_bundle(tmp_path, lambda _: None)


# ---------------------------------------------------------------- recorded image IDs


IMAGE_A, IMAGE_B = "sha256:" + "a" * 64, "sha256:" + "b" * 64
INPUTS, OTHER_INPUTS = "1" * 32, "2" * 32


@pytest.fixture
def unrecorded_cell(tmp_path: Path) -> Cell:
    grid = load_matrix(FIXTURES / "multiarch.yaml")
    cell = dataclasses.replace(grid.cells[0], images_root=tmp_path)
    cell.directory.mkdir(parents=True)
    return cell


def test_a_recorded_image_id_is_compared_for_the_inputs_it_was_recorded_for(unrecorded_cell: Cell) -> None:
    cell = unrecorded_cell
    assert recorded.compare(cell, IMAGE_A, INPUTS) == (None, "no image ID recorded")
    recorded.write(cell, IMAGE_A, INPUTS)
    assert recorded.compare(cell, IMAGE_A, INPUTS)[0] is True
    assert recorded.compare(cell, IMAGE_B, INPUTS)[0] is False


def test_a_record_for_other_inputs_is_stale_not_a_failed_reproduction(unrecorded_cell: Cell) -> None:
    recorded.write(unrecorded_cell, IMAGE_A, INPUTS)
    same, said = recorded.compare(unrecorded_cell, IMAGE_B, OTHER_INPUTS)
    assert same is None
    assert "is for other inputs" in said and "verify-repro --record" in said


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("sha256:aaaa; rm -rf /\n", 1, "is not an image ID"),
        (f"{IMAGE_A}\n", 2, "is not `build-id"),
        (f"{IMAGE_A}\nbuild-id {INPUTS}$(id)\n", 2, "is not `build-id"),
        (f"{IMAGE_A}\nbuild-id {INPUTS}\nRUN curl evil\n", 3, "is not `base sha256:"),
        (f"{IMAGE_A}\nbuild-id {INPUTS}\nbase sha256:{'c' * 63}\n", 3, "is not `base sha256:"),
        (f"{IMAGE_A}\nbuild-id {INPUTS}\nbase {IMAGE_B}\nRUN curl evil\n", 4, "at most three lines"),
    ],
)
def test_a_hostile_record_is_refused_naming_its_line(unrecorded_cell: Cell, text: str, line: int, message: str) -> None:
    recorded.path(unrecorded_cell).write_text(text)
    with pytest.raises(UserError, match=re.escape(message)) as refused:
        recorded.read(unrecorded_cell)
    assert refused.value.line().startswith(f"{recorded.path(unrecorded_cell)}:{line}:")


def test_a_record_keeps_the_base_it_was_built_on_and_an_older_record_has_none(unrecorded_cell: Cell) -> None:
    recorded.write(unrecorded_cell, IMAGE_A, INPUTS)
    assert recorded.read(unrecorded_cell) == recorded.Record(IMAGE_A, INPUTS, None)
    recorded.write(unrecorded_cell, IMAGE_A, INPUTS, IMAGE_B)
    assert recorded.path(unrecorded_cell).read_text() == f"{IMAGE_A}\nbuild-id {INPUTS}\nbase {IMAGE_B}\n"
    assert recorded.read(unrecorded_cell) == recorded.Record(IMAGE_A, INPUTS, IMAGE_B)


BASE_RECORDED, BASE_CHANGED = "sha256:" + "d" * 64, "sha256:" + "e" * 64


def _build_id_on(base: str) -> str:
    """A stand-in for the cell's build ID on a base: its context is fixed, so only the base moves it."""
    return INPUTS if base == BASE_RECORDED else OTHER_INPUTS


def test_a_base_other_than_the_recorded_one_for_the_same_packages_is_named(unrecorded_cell: Cell) -> None:
    """A rootfs changed in the cache gives another base, hence another build ID: the record,
    which holds the base, still knows these inputs and says the base is not theirs."""
    recorded.write(unrecorded_cell, IMAGE_A, INPUTS, BASE_RECORDED)
    assert recorded.wrong_base(unrecorded_cell, BASE_RECORDED, _build_id_on) is None
    said = recorded.wrong_base(unrecorded_cell, BASE_CHANGED, _build_id_on)
    assert said is not None and "its base is eeeeeeeeeeee" in said and "on base dddddddddddd" in said


def test_a_record_without_a_base_or_for_other_inputs_says_nothing_of_the_base(unrecorded_cell: Cell) -> None:
    recorded.write(unrecorded_cell, IMAGE_A, INPUTS)
    assert recorded.wrong_base(unrecorded_cell, BASE_CHANGED, _build_id_on) is None
    recorded.write(unrecorded_cell, IMAGE_A, "3" * 32, BASE_RECORDED)  # the context moved since
    assert recorded.wrong_base(unrecorded_cell, BASE_CHANGED, _build_id_on) is None


def test_every_buildable_cell_has_its_recorded_image_id_and_base() -> None:
    """Issue 55: a build that contradicts its record fails, so every cell the matrix builds has one
    (written from runs that agreed: `sweep --record-passed`, `verify-repro --record`), naming the
    base it was built on."""
    grid = load_matrix(FIXTURES.parents[1] / "matrix.yaml")
    missing = [cell.name for cell in grid.cells if recorded.read(cell) is None]
    assert missing == []
    assert all(record.base_id for record in (recorded.read(cell) for cell in grid.cells) if record is not None)
