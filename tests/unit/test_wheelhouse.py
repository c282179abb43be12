"""The wheelhouse: hash verification, content addressing, concurrency, wheel choice, serving."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import http.server
import os
import subprocess
import sys
import threading
import urllib.request
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from builder.errors import UserError
from builder.facts.compat import TorchWheels
from builder.lock import requirements as lock
from builder.plan.cell import Cell
from builder.plan.matrix import load_matrix
from builder.wheelhouse import served, wheelchoice, wheelhouse, wheelserver
from builder.wheelhouse.fileref import FileRef
from tests.conftest import lock_entry


def make_wheel(directory: Path, filename: str, payload: bytes = b"x") -> str:
    path = directory / filename
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("payload.txt", payload)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def served_wheel(server: tuple[str, Path], project: str = "demo", payload: bytes = b"x") -> FileRef:
    """A wheel on the loopback file server, and the reference a lock would resolve to."""
    url, root = server
    filename = f"{project}-1.0-py3-none-any.whl"
    return FileRef(project, filename, url + filename, make_wheel(root, filename, payload))


@pytest.fixture
def file_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A real HTTP server on loopback serving a directory, like an index's file host."""
    root = tmp_path / "served"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None  # type: ignore[method-assign, assignment]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", root
    server.shutdown()
    server.server_close()


def test_fetch_stores_a_verified_file_under_its_hash_and_downloads_it_once(
    tmp_path: Path, file_server: tuple[str, Path]
) -> None:
    ref = served_wheel(file_server)
    digest = ref.sha256
    house = wheelhouse.Wheelhouse(tmp_path / "house")
    first = house.fetch(ref)
    assert first == house.root / "sha256" / digest[:2] / digest / "demo-1.0-py3-none-any.whl"
    assert hashlib.sha256(first.read_bytes()).hexdigest() == digest
    downloaded = house.bytes_downloaded
    assert downloaded == first.stat().st_size
    house.fetch(ref)
    assert house.bytes_downloaded == downloaded


def test_a_file_whose_hash_does_not_match_is_refused_and_not_stored(
    tmp_path: Path, file_server: tuple[str, Path]
) -> None:
    actual = served_wheel(file_server).sha256
    house = wheelhouse.Wheelhouse(tmp_path / "house")
    expected = "0" * 64
    ref = dataclasses.replace(served_wheel(file_server), sha256=expected)
    with pytest.raises(UserError) as caught:
        house.fetch(ref)
    assert caught.value.line() == (
        f"demo-1.0-py3-none-any.whl: sha256 mismatch, expected {expected}, got {actual}; refusing it, nothing built"
    )
    assert not list((house.root / "sha256").rglob("*.whl")) and not list((house.root / "sha256").rglob(".part-*"))


def test_concurrent_fetches_of_one_file_share_the_cache_safely(tmp_path: Path, file_server: tuple[str, Path]) -> None:
    ref = served_wheel(file_server, "big", b"y" * 5_000_000)
    digest = ref.sha256
    houses = [wheelhouse.Wheelhouse(tmp_path / "house") for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda h: h.fetch(ref), houses))
    assert len(set(paths)) == 1 and hashlib.sha256(paths[0].read_bytes()).hexdigest() == digest
    assert sum(h.bytes_downloaded for h in houses) == paths[0].stat().st_size  # downloaded once


def test_the_wheel_chosen_fits_the_cells_python_and_glibc_and_a_locked_hash(
    tmp_path: Path, matrix_file: Path, wheels: TorchWheels
) -> None:
    links = tmp_path / "links"
    links.mkdir()
    fits = make_wheel(links, "fastlib-1.0-cp311-cp311-manylinux_2_28_x86_64.whl", b"311")
    other_python = make_wheel(links, "fastlib-1.0-cp312-cp312-manylinux_2_28_x86_64.whl", b"312")
    too_new_glibc = make_wheel(links, "fastlib-1.0-cp311-cp311-manylinux_2_39_x86_64.whl", b"239")
    make_wheel(links, "fastlib-1.0-py3-none-any.whl", b"unlocked")  # fits, but no locked hash
    matrix_file.write_text(
        matrix_file.read_text().replace('{url: "https://pypi.org/simple"}', f'{{find_links: ["{links}"]}}')
    )
    grid = load_matrix(matrix_file, wheels)
    cell = grid.cell("2.9.1-cu12.8-bookworm-runtime")
    lock_path = tmp_path / "requirements.lock"
    lock_path.write_text(lock_entry("fastlib", "1.0", fits, other_python, too_new_glibc))
    refs = wheelchoice.choose(cell, grid, lock.Lockfile.read(lock_path))
    assert [(r.filename, r.sha256) for r in refs] == [("fastlib-1.0-cp311-cp311-manylinux_2_28_x86_64.whl", fits)]


def test_a_locked_package_without_a_fitting_wheel_is_one_clear_error(
    tmp_path: Path, matrix_file: Path, wheels: TorchWheels
) -> None:
    links = tmp_path / "links"
    links.mkdir()
    other = make_wheel(links, "fastlib-1.0-cp312-cp312-manylinux_2_28_x86_64.whl")
    matrix_file.write_text(
        matrix_file.read_text().replace('{url: "https://pypi.org/simple"}', f'{{find_links: ["{links}"]}}')
    )
    grid = load_matrix(matrix_file, wheels)
    lock_path = tmp_path / "requirements.lock"
    lock_path.write_text(lock_entry("fastlib", "1.0", other))
    with pytest.raises(
        UserError, match=r"no wheel of fastlib==1\.0 with a locked hash fits Python 3\.11 on glibc 2\.36"
    ):
        wheelchoice.choose(grid.cell("2.9.1-cu12.8-bookworm-runtime"), grid, lock.Lockfile.read(lock_path))


def test_served_page_links_each_file_with_its_hash_and_a_second_server_reuses_the_first(
    tmp_path: Path, file_server: tuple[str, Path]
) -> None:
    ref = served_wheel(file_server)
    digest = ref.sha256
    house = wheelhouse.Wheelhouse(tmp_path / "house")
    house.fetch(ref)
    lock_path = tmp_path / "requirements.lock"
    lock_path.write_text(lock_entry("demo", "1.0", digest))
    page = house.publish_page(lock.Lockfile.read(lock_path), "locks/demo/", [ref])
    with (
        wheelserver.serve(house, "127.0.0.1:18741") as base,
        wheelserver.serve(house, "127.0.0.1:18741") as again,
    ):
        assert base == again == "http://127.0.0.1:18741/"
        html = urllib.request.urlopen(base + page, timeout=5).read().decode()
        assert f"#sha256={digest}" in html
        href = html.split('href="')[1].split("#")[0]
        body = urllib.request.urlopen(base + page + href, timeout=5).read()
        assert hashlib.sha256(body).hexdigest() == digest


def test_a_port_held_by_something_else_is_a_clear_error(tmp_path: Path, file_server: tuple[str, Path]) -> None:
    url, _ = file_server
    port = url.rsplit(":", 1)[1].strip("/")
    with (
        pytest.raises(UserError, match=f"cannot serve the wheelhouse on 127.0.0.1:{port}"),
        wheelserver.serve(wheelhouse.Wheelhouse(tmp_path / "house"), f"127.0.0.1:{port}"),
    ):
        pass


HOLD_ADDRESS = """
import sys, time
from pathlib import Path
from builder.wheelhouse import wheelhouse, wheelserver
with wheelserver.serve(wheelhouse.Wheelhouse(Path(sys.argv[1])), sys.argv[2]):
    print("serving", flush=True)
    sys.stdin.readline()  # until the test says go
    time.sleep(1.5)
"""


def test_a_build_in_another_process_holding_the_address_is_waited_for_not_shared(tmp_path: Path) -> None:
    """Two builds on one machine (two CI jobs, or a build while the tests run): the second waits
    for the first's server to go, and says so, instead of failing or of reusing a server that
    stops when the other build ends."""
    listen = "127.0.0.1:18745"
    other = subprocess.Popen(
        [sys.executable, "-c", HOLD_ADDRESS, str(tmp_path / "other"), listen],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert other.stdout is not None and other.stdout.readline() == "serving\n"
        said: list[str] = []
        house = wheelhouse.Wheelhouse(tmp_path / "mine", report=said.append)
        assert other.stdin is not None
        other.stdin.write("go\n")
        other.stdin.flush()
        with wheelserver.serve(house, listen) as url:  # the other's server is gone first
            marker = urllib.request.urlopen(url + wheelhouse.MARKER, timeout=5).read().decode()
            assert marker == str((tmp_path / "mine").resolve())  # this build's own server
        assert said == [f"waiting for {listen}: another build on this machine serves its wheelhouse there"]
    finally:
        other.kill()
        other.wait()


def test_one_process_serves_one_root_on_an_address(tmp_path: Path) -> None:
    with (
        wheelserver.serve(wheelhouse.Wheelhouse(tmp_path / "a"), "127.0.0.1:18746"),
        pytest.raises(UserError, match=r"already serves the wheelhouse .* in this run"),
        wheelserver.serve(wheelhouse.Wheelhouse(tmp_path / "b"), "127.0.0.1:18746"),
    ):
        pass


def test_a_lock_whose_files_are_cached_is_prepared_without_any_index(
    tmp_path: Path, file_server: tuple[str, Path], matrix_file: Path, wheels: TorchWheels
) -> None:
    ref = served_wheel(file_server)
    digest = ref.sha256
    house = wheelhouse.Wheelhouse(tmp_path / "house")
    lock_path = tmp_path / "requirements.lock"
    lock_path.write_text(lock_entry("demo", "1.0", digest))
    locked = lock.Lockfile.read(lock_path)
    # The matrix's index is unreachable here: preparing must not need it.
    matrix_file.write_text(matrix_file.read_text().replace("https://pypi.org/simple", "http://127.0.0.1:9/simple"))
    grid = load_matrix(matrix_file, wheels)
    page = served.lock_page(locked, grid.cell("2.9.1-cu12.8-bookworm-runtime"))
    assert house.cached_files(locked, page) is None
    house.fetch(ref)
    house.publish_page(locked, page, [ref])
    files = house.prepare(grid.cell("2.9.1-cu12.8-bookworm-runtime"), grid, [locked])
    assert files == [house.blob(digest, "demo-1.0-py3-none-any.whl")]
    house.blob(digest, "demo-1.0-py3-none-any.whl").unlink()
    with pytest.raises(UserError, match="not all in the cache and the index cannot be reached"):
        house.prepare(grid.cell("2.9.1-cu12.8-bookworm-runtime"), grid, [locked])


def _flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    stat = path.stat()
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # even with its mtime put back


def _cached_and_published(
    tmp_path: Path, file_server: tuple[str, Path], cell: Cell
) -> tuple[wheelhouse.Wheelhouse, FileRef, lock.Lockfile]:
    """A wheel fetched for a lock, and the lock's page published for a cell."""
    ref = served_wheel(file_server)
    house = wheelhouse.Wheelhouse(tmp_path / "house")
    lock_path = tmp_path / "requirements.lock"
    lock_path.write_text(lock_entry("demo", "1.0", ref.sha256))
    locked = lock.Lockfile.read(lock_path)
    house.publish_page(locked, served.lock_page(locked, cell), [ref])
    house.fetch(ref)
    return house, ref, locked


def _cached_then_corrupted(
    tmp_path: Path, file_server: tuple[str, Path], cell: Cell
) -> tuple[wheelhouse.Wheelhouse, FileRef, lock.Lockfile]:
    """A wheel fetched and published for a lock and a cell, then one byte of the cached file flipped."""
    house, ref, locked = _cached_and_published(tmp_path, file_server, cell)
    _flip_one_byte(house.blob(ref.sha256, ref.filename))
    return house, ref, locked


def test_a_corrupt_cached_wheel_is_found_before_the_build_and_fetched_again(
    tmp_path: Path,
    file_server: tuple[str, Path],
    matrix_file: Path,
    wheels: TorchWheels,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    grid = load_matrix(matrix_file, wheels)
    cell = grid.cell("2.9.1-cu12.8-bookworm-runtime")
    house, ref, locked = _cached_then_corrupted(tmp_path, file_server, cell)
    # Online: the index (stood in for by the wheel choice) names the file again, and it is downloaded anew.
    monkeypatch.setattr(wheelchoice, "choose", lambda *_: [ref])
    [path] = house.prepare(cell, grid, [locked])
    assert hashlib.sha256(path.read_bytes()).hexdigest() == ref.sha256
    assert house.corrupt == ["demo-1.0-py3-none-any.whl"]


def test_a_corrupt_cached_wheel_offline_is_one_line_naming_the_file(
    tmp_path: Path, file_server: tuple[str, Path], matrix_file: Path, wheels: TorchWheels
) -> None:
    matrix_file.write_text(matrix_file.read_text().replace("https://pypi.org/simple", "http://127.0.0.1:9/simple"))
    grid = load_matrix(matrix_file, wheels)
    house, ref, locked = _cached_then_corrupted(tmp_path, file_server, grid.cell("2.9.1-cu12.8-bookworm-runtime"))
    lock_path = locked.path
    with pytest.raises(UserError) as caught:
        house.prepare(grid.cell("2.9.1-cu12.8-bookworm-runtime"), grid, [locked])
    line = caught.value.line()
    assert "\n" not in line and line.startswith(f"{lock_path}: cached demo-1.0-py3-none-any.whl did not match")
    assert "put the original file back" in line
    assert not house.blob(ref.sha256, ref.filename).exists()  # removed, never served


def test_a_cached_wheel_replaced_by_a_link_is_removed_and_fetched_again_even_to_the_right_bytes(
    tmp_path: Path, file_server: tuple[str, Path], matrix_file: Path, wheels: TorchWheels,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Issue 58: a link in the cache could be pointed elsewhere after the check; it is never served."""
    grid = load_matrix(matrix_file, wheels)
    cell = grid.cell("2.9.1-cu12.8-bookworm-runtime")
    house, ref, locked = _cached_and_published(tmp_path, file_server, cell)
    cached = house.blob(ref.sha256, ref.filename)
    elsewhere = tmp_path / "elsewhere.whl"
    elsewhere.write_bytes(cached.read_bytes())
    cached.unlink()
    cached.symlink_to(elsewhere)
    monkeypatch.setattr(wheelchoice, "choose", lambda *_: [ref])
    [path] = house.prepare(cell, grid, [locked])
    assert not path.is_symlink() and hashlib.sha256(path.read_bytes()).hexdigest() == ref.sha256
    assert elsewhere.exists()  # what the link named is not the cache's to remove


def test_a_cached_lock_page_naming_a_file_the_lock_does_not_pin_is_chosen_again(
    tmp_path: Path, file_server: tuple[str, Path], matrix_file: Path, wheels: TorchWheels
) -> None:
    """Issue 58: the page is a cache entry too. One that names another file (its own hash beside
    it, the file in the cache with that hash) is not taken on its word."""
    grid = load_matrix(matrix_file, wheels)
    cell = grid.cell("2.9.1-cu12.8-bookworm-runtime")
    house, ref, locked = _cached_and_published(tmp_path, file_server, cell)
    page = served.lock_page(locked, cell)
    assert house.cached_files(locked, page) is not None
    planted = b"not the locked wheel"
    other = hashlib.sha256(planted).hexdigest()
    house.place(planted, house.blob(other, ref.filename))
    index = house.root / page / "index.html"
    index.write_text(index.read_text().replace(ref.sha256, other))
    assert house.cached_files(locked, page) is None


def test_two_cells_whose_locks_read_alike_get_a_page_each_with_their_own_wheels_on_one_cache(
    tmp_path: Path, matrix_file: Path, wheels: TorchWheels
) -> None:
    """A lock's page is keyed by what chooses its wheels: the second cell built on a cache must not
    be served the first one's page (build --all, a team's second cell)."""
    links = tmp_path / "links"
    links.mkdir()
    digests = {}
    for python in ("3.9", "3.10", "3.11", "3.12", "3.13"):
        tag = "cp" + python.replace(".", "")
        digests[python] = make_wheel(links, f"fastlib-1.0-{tag}-{tag}-manylinux_2_28_x86_64.whl", python.encode())
    matrix_file.write_text(
        matrix_file.read_text().replace('{url: "https://pypi.org/simple"}', f'{{find_links: ["{links}"]}}')
    )
    grid = load_matrix(matrix_file, wheels)
    by_python = {cell.python: cell for cell in grid.cells if cell.platform == "linux/amd64"}
    first, second = (by_python[p] for p in sorted(by_python)[:2])
    lock_path = tmp_path / "requirements.lock"
    lock_path.write_text(lock_entry("fastlib", "1.0", *digests.values()))
    locked = lock.Lockfile.read(lock_path)
    house = wheelhouse.Wheelhouse(tmp_path / "house")
    for cell in (first, second):
        [path] = house.prepare(cell, grid, [locked])
        assert path.read_bytes() and f"cp{cell.python.replace('.', '')}" in path.name
        page = (house.root / served.lock_page(locked, cell) / "index.html").read_text()
        assert f"cp{cell.python.replace('.', '')}" in page
    assert served.lock_page(locked, first) != served.lock_page(locked, second)
