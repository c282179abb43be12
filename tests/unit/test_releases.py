"""`update --releases` (issue 59): torch's releases read from an index, offline here from PyPI's
recorded pages (harness/record_releases.py), served by a loopback index whose wheels hold only
their recorded METADATA; the `follow:` policy; the matrix edit; the proposed distro bases."""

from __future__ import annotations

import contextlib
import http.server
import json
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import pytest
import yaml

from builder.config import schema
from builder.config.schema import BaseSpec
from builder.config.validated import validate
from builder.config.yamlsource import SourceMap
from builder.errors import UserError
from builder.facts import pypi, releases
from builder.facts.compat import TorchWheels
from builder.lock import distros, upstream
from builder.plan import follow
from builder.plan.matrix import base_image

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "releases"
SHIPPED_AXIS = ["2.6.0", "2.9.1", "2.13.0", "2.15.0"]


def _tiny_wheel(folder: Path, filename: str, metadata: str) -> Path:
    """A wheel of that name holding only its METADATA: all the builder reads of a release."""
    version = filename.split("-")[1]
    path = folder / filename
    if not path.exists():
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr(f"torch-{version}.dist-info/METADATA", metadata)
    return path


class _Index(http.server.BaseHTTPRequestHandler):
    page = b""

    def do_GET(self) -> None:
        found = self.path == "/simple/torch/"
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
        self.end_headers()
        self.wfile.write(self.page if found else b"")

    def log_message(self, *_: object) -> None:
        pass


@contextlib.contextmanager
def _serve(page: dict[str, Any]) -> Iterator[str]:
    handler = type("Index", (_Index,), {"page": json.dumps(page).encode()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/simple"
    finally:
        server.shutdown()
        server.server_close()


def _recorded(tmp_path: Path, extra: dict[str, str] | None = None) -> dict[str, Any]:
    """PyPI's recorded page, each wheel's URL pointing at a tiny wheel with its recorded METADATA;
    `extra`: made-up releases (version -> METADATA) listed with one cp312 wheel each."""
    page = json.loads((FIXTURES / "torch-simple.json").read_text())
    metadata = json.loads((FIXTURES / "torch-metadata.json").read_text())
    wheels = tmp_path / "wheels"
    wheels.mkdir(exist_ok=True)
    for version, text in (extra or {}).items():
        metadata[version] = text
        page["files"].append({"filename": f"torch-{version}-cp312-cp312-manylinux_2_28_x86_64.whl", "url": "",
                              "hashes": {"sha256": "0" * 64}, "requires-python": ">=3.10"})  # fmt: skip
    for entry in page["files"]:
        version = entry["filename"].split("-")[1]
        entry["url"] = _tiny_wheel(wheels, entry["filename"], metadata[version]).as_uri()
    return page


@pytest.fixture
def index(tmp_path: Path) -> Iterator[str]:
    with _serve(_recorded(tmp_path)) as url:
        yield url


def _matrix_copy(tmp_path: Path, url: str, axis: list[str], follow_line: str) -> Path:
    """The shipped matrix with its pypi index at `url`, axes.torch at `axis` and its `follow:`
    line replaced by `follow_line` ("" drops it)."""
    text = (
        (REPO / "matrix.yaml").read_text().replace('pypi: {url: "https://pypi.org/simple"}', f'pypi: {{url: "{url}"}}')
    )
    text = follow.with_torch_axis(text, axis, "matrix.yaml")
    lines = [line for line in text.splitlines() if not line.startswith("follow:")]
    at = next(i for i, line in enumerate(lines) if line.startswith("axes:"))
    lines.insert(at, follow_line)
    path = tmp_path / "matrix.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _propose(path: Path) -> upstream.Proposal:
    spec, _ = schema.parse(path)
    return upstream.propose(path, spec, read_distros=False)


# ---------------------------------------------------------------- torch releases


def test_the_releases_of_an_index_are_final_versions_with_a_cpython_wheel_for_the_platform(tmp_path: Path) -> None:
    page = _recorded(tmp_path)
    page["files"] += [
        {"filename": "torch-2.16.0rc1-cp312-cp312-manylinux_2_28_x86_64.whl", "url": "file:///x"},
        {"filename": "torch-2.16.0.dev20261201-cp312-cp312-manylinux_2_28_x86_64.whl", "url": "file:///x"},
        {"filename": "torch-2.17.0-cp312-cp312-win_amd64.whl", "url": "file:///x"},
        {"filename": "not a wheel name.whl", "url": "file:///x"},
    ]
    with _serve(page) as url:
        listed = releases.releases_on(pypi.index_files("torch", url))
    assert "2.14.1" in listed and "2.10.0" in listed
    assert not {"2.16.0rc1", "2.16.0.dev20261201", "2.17.0"} & set(listed)


def test_a_matrix_without_2_14_1_and_2_10_0_is_proposed_them_back_with_their_cuda_lines_and_pythons(
    tmp_path: Path, index: str
) -> None:
    path = _matrix_copy(tmp_path, index, SHIPPED_AXIS, "follow: {torch: [newest, newest-per-cuda]}")
    proposal = _propose(path)
    assert proposal.torch is not None
    changes = {change.version: change for change in proposal.torch.changes}
    assert set(changes) == {"2.10.0", "2.14.1"}
    assert changes["2.10.0"].build.cuda == "12.8" and changes["2.10.0"].replaces == ("2.9.1",)
    assert changes["2.14.1"].build.cuda == "13.0" and changes["2.14.1"].replaces == ("2.13.0",)
    assert changes["2.14.1"].build.pythons == ["3.10", "3.11", "3.12", "3.13", "3.14"]
    assert proposal.torch.after == ["2.6.0", "2.10.0", "2.14.1", "2.15.0"]
    # The edited matrix plans: the new cells, and why the others of the new versions cannot be built.
    assert "2.14.1-cu13.0-bookworm-runtime" in {cell.name for cell in proposal.new_cells}
    assert any("no wheel for Python 3.9" in rejected.reason for rejected in proposal.not_buildable)
    assert proposal.matrix_text is not None
    edited = yaml.safe_load(proposal.matrix_text)
    assert edited["axes"]["torch"] == ["2.6.0", "2.10.0", "2.14.1", "2.15.0"]
    markdown = proposal.markdown()
    assert "torch 2.14.1 (CUDA 13.0; Pythons 3.10, 3.11, 3.12, 3.13, 3.14)" in markdown
    assert "new cell 2.10.0-cu12.8-bookworm-runtime" in markdown


def test_a_current_matrix_is_proposed_nothing(tmp_path: Path, index: str) -> None:
    path = _matrix_copy(tmp_path, index, ["2.6.0", "2.10.0", "2.14.1", "2.15.0"],
                        "follow: {torch: [newest, newest-per-cuda]}")  # fmt: skip
    proposal = _propose(path)
    assert proposal.torch is not None and proposal.torch.changes == [] and proposal.matrix_text is None
    assert proposal.markdown().startswith("No new upstream release")


def test_newest_alone_adds_a_release_on_a_new_cuda_line_beside_the_others(tmp_path: Path) -> None:
    metadata = json.loads((FIXTURES / "torch-metadata.json").read_text())["2.15.0"]
    newer = metadata.replace("Version: 2.15.0", "Version: 2.16.0").replace("]==13.2.2;", "]==13.3.0;")
    assert newer != metadata.replace("Version: 2.15.0", "Version: 2.16.0")  # the made-up release is on CUDA 13.3
    with _serve(_recorded(tmp_path, {"2.16.0": newer})) as url:
        path = _matrix_copy(tmp_path, url, SHIPPED_AXIS, "follow: {torch: [newest]}")
        proposal = _propose(path)
        assert proposal.torch is not None
        [change] = proposal.torch.changes
        assert (change.version, change.build.cuda, change.replaces) == ("2.16.0", "13.3", ())
        assert proposal.torch.after == [*SHIPPED_AXIS, "2.16.0"]
        both = _matrix_copy(tmp_path, url, SHIPPED_AXIS, "follow: {torch: [newest, newest-per-cuda]}")
        assert "2.16.0" in (_propose(both).torch or follow.TorchProposal([])).after


def test_a_newer_build_of_a_followed_line_replaces_it_for_both_reasons(tmp_path: Path) -> None:
    metadata = json.loads((FIXTURES / "torch-metadata.json").read_text())["2.15.0"]
    with _serve(_recorded(tmp_path, {"2.15.1": metadata.replace("Version: 2.15.0", "Version: 2.15.1")})) as url:
        path = _matrix_copy(tmp_path, url, ["2.10.0", "2.14.1", "2.15.0"], "follow: {torch: [newest, newest-per-cuda]}")
        proposal = _propose(path)
    assert proposal.torch is not None
    [change] = proposal.torch.changes
    assert change.version == "2.15.1" and change.replaces == ("2.15.0",)
    assert change.reasons == ("the newest build for CUDA 13.2", "the newest release")


def test_an_index_that_lists_more_new_releases_than_a_check_reads_is_named_and_proposes_nothing(
    tmp_path: Path,
) -> None:
    metadata = json.loads((FIXTURES / "torch-metadata.json").read_text())["2.15.0"]
    flood = {f"3.{n}.0": metadata for n in range(releases.MAX_NEW_RELEASES + 1)}
    with _serve(_recorded(tmp_path, flood)) as url:
        path = _matrix_copy(tmp_path, url, SHIPPED_AXIS, "follow: {torch: [newest]}")
        proposal = _propose(path)
    assert proposal.matrix_text is None
    assert any(f"more than the {releases.MAX_NEW_RELEASES} a check reads" in line for line in proposal.unread)


def test_the_command_without_a_follow_key_proposes_nothing_and_with_dry_run_writes_nothing(
    tmp_path: Path, index: str
) -> None:
    bare = _matrix_copy(tmp_path, index, SHIPPED_AXIS, "")
    before = bare.read_text()
    said = _builder("--matrix", str(bare), "update", "--releases", "--markdown")
    assert said.returncode == 0 and "no `follow:` key" in said.stderr
    assert said.stdout.startswith("No new upstream release") and bare.read_text() == before
    followed = _matrix_copy(tmp_path, index, SHIPPED_AXIS, "follow: {torch: [newest, newest-per-cuda]}")
    before = followed.read_text()
    dry = _builder("--matrix", str(followed), "update", "--releases", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "axes.torch: 2.6.0, 2.9.1, 2.13.0, 2.15.0 -> 2.6.0, 2.10.0, 2.14.1, 2.15.0" in dry.stderr
    assert "dry run:" in dry.stderr and followed.read_text() == before
    wrong = _builder("--matrix", str(followed), "update", "--dry-run")
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and "go with --releases" in wrong.stderr


def _builder(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "builder", *args], capture_output=True, text=True, cwd=REPO,
                          check=False, timeout=120)  # fmt: skip


def test_a_follow_key_naming_an_unknown_index_or_policy_is_one_line(tmp_path: Path) -> None:
    for line, needle in (("follow: {torch: [newest], index: nope}", "unknown index 'nope'"),
                         ("follow: {torch: [latest]}", "follow.torch")):  # fmt: skip
        path = _matrix_copy(tmp_path, "https://pypi.org/simple", SHIPPED_AXIS, line)
        with pytest.raises(UserError, match=needle):
            schema.parse(path)


# ---------------------------------------------------------------- the matrix edit


def test_the_axis_edit_keeps_every_other_byte_of_the_matrix() -> None:
    text = (REPO / "matrix.yaml").read_text()
    edited = follow.with_torch_axis(text, ["2.6.0", "2.10.0"], "matrix.yaml")
    before, after = text.splitlines(), edited.splitlines()
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    assert len(changed) == 1
    assert after[changed[0]].startswith('  torch: ["2.6.0", "2.10.0"]   # CUDA')  # its comment kept


def test_a_block_list_is_edited_in_place_and_an_alias_is_refused() -> None:
    block = "axes:\n  torch:\n    - 2.6.0   # old\n    - 2.9.1\n  base: [bookworm]\n"
    edited = follow.with_torch_axis(block, ["2.10.0"], "m.yaml")
    assert yaml.safe_load(edited) == {"axes": {"torch": ["2.10.0"], "base": ["bookworm"]}}
    aliased = "x: &v [2.6.0]\naxes:\n  torch: *v\n"
    with pytest.raises(UserError, match="not written as a list where it stands"):
        follow.with_torch_axis(aliased, ["2.10.0"], "m.yaml")


# ---------------------------------------------------------------- distro releases


UBUNTU_CSV = """version,codename,series,created,release,eol,eol-server,eol-esm
24.04 LTS,Noble Numbat,noble,2023-10-12,2024-04-25,2029-05-31,2029-05-31,2034-04-25
25.10,Questing Quokka,questing,2025-04-17,2025-10-09,2026-07-09
26.04 LTS,Resolute Raccoon,resolute,2025-10-16,2026-04-23,2031-05-29,2031-05-29,2036-04-23
28.04 LTS,Xenial Future,future,2027-10-16,2028-04-27,2033-05-29
"""


def test_the_newest_lts_is_the_newest_one_already_released() -> None:
    assert distros.newest_lts(UBUNTU_CSV, date(2026, 12, 7)) == distros.Release("ubuntu", "resolute", "26.04")
    assert distros.newest_lts(UBUNTU_CSV, date(2025, 1, 1)).codename == "noble"
    with pytest.raises(UserError, match="no LTS release"):
        distros.newest_lts("version,codename,series,created,release\n25.10,Q,questing,2025-04-17,2025-10-09\n",
                           date(2026, 12, 7))  # fmt: skip


def test_a_proposed_base_is_a_valid_matrix_entry_after_the_template_bases_bootstrap() -> None:
    spec, _ = schema.parse(REPO / "matrix.yaml")
    template = base_image("noble", spec.bases["noble"])
    proposed = distros.ProposedBase(
        distros.Release("ubuntu", "resolute", "26.04"), glibc="2.43", python="3.14",
        keyring_deb="http://archive.ubuntu.com/ubuntu/pool/main/u/ubuntu-keyring/ubuntu-keyring_2023.11.28.1build1_all.deb",
        keyring_sha256="c" * 64, template=template,
    )  # fmt: skip
    entry = yaml.safe_load(proposed.yaml())["resolute"]
    base = validate(BaseSpec, entry, SourceMap(Path("proposal")), "a base")
    assert (base.suite, base.glibc, base.python) == ("resolute", "2.43", "3.14")
    assert base.bootstrap.extra_suites == ["resolute-updates", "resolute-security"]
    assert base.bootstrap.keyring is not None and base.bootstrap.keyring.sha256 == "c" * 64
    debian = distros.ProposedBase(distros.Release("debian", "forky", "14"), "2.42", "3.13", "", "",
                                  base_image("trixie", spec.bases["trixie"]))  # fmt: skip
    forky = yaml.safe_load(debian.yaml())["forky"]
    assert forky["bootstrap"]["security"]["suite"] == "forky-security" and "keyring" not in forky["bootstrap"]


def test_shipped_matrix_follows_both_policies() -> None:
    spec, _ = schema.parse(REPO / "matrix.yaml")
    assert spec.follow is not None and set(spec.follow.torch) == {"newest", "newest-per-cuda"}
    assert TorchWheels.load().builds("pypi", "2.15.0")  # the facts the policy reads the axis by
