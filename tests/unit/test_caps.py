"""Every cap the builder puts on hostile input, at its value (accepted) and one past it (refused
with one line). docs/security.md lists them; a cap changed here and not there fails the last test."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from builder import confined, verdict
from builder.assemble import bundle, smoke
from builder.config import yamlsource
from builder.config.schema import parse
from builder.errors import UserError
from builder.lock import header
from builder.oci import auth, registry
from builder.plan import matrix
from builder.publish import attachments, reports, verify
from builder.repro import recorded
from tests.unit.test_hostile_inputs import Project, assert_one_line_error, project, run
from tests.unit.test_registry_answers import (
    IMAGE_ID,
    OCI_INDEX,
    OCI_MANIFEST,
    Scripted,
    _digest,
    hostile,
    passing_report,
)

__all__ = ["hostile", "project"]  # fixtures shared with the files they come from
REPO = Path(__file__).resolve().parents[2]


def padded_json(document: object, size: int) -> bytes:
    """The JSON document, padded with trailing whitespace to exactly `size` bytes."""
    text = json.dumps(document).encode()
    assert len(text) <= size
    return text + b" " * (size - len(text))


# ---------------------------------------------------------------- files


def test_a_file_read_under_a_cap_may_be_exactly_that_size(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 1000)
    assert len(confined.read_bytes(path, 1000)) == 1000
    with pytest.raises(UserError, match="is larger than 999 bytes"):
        confined.read_bytes(path, 999)


def test_a_lock_at_its_cap_is_read_and_one_byte_past_it_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "requirements.lock"
    path.write_bytes(b"#" * header.MAX_LOCK_BYTES)
    assert len(header.read_text(path)) == header.MAX_LOCK_BYTES
    path.write_bytes(b"#" * (header.MAX_LOCK_BYTES + 1))
    with pytest.raises(UserError, match=f"larger than {header.MAX_LOCK_BYTES} bytes"):
        header.read_text(path)


def test_a_docker_config_at_its_cap_is_read_and_past_it_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_bytes(padded_json({"auths": {}}, auth.MAX_CONFIG_BYTES))
    assert auth.docker_config_credentials("ghcr.io", config) is None
    config.write_bytes(padded_json({"auths": {}}, auth.MAX_CONFIG_BYTES + 1))
    with pytest.raises(UserError, match="larger than 1024 KiB"):
        auth.docker_config_credentials("ghcr.io", config)


def test_a_bundle_manifest_at_its_caps_opens_and_past_them_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "b"
    root.mkdir()
    document = {"cell": "c", "builder": {}, "files": {}}
    (root / bundle.MANIFEST).write_bytes(padded_json(document, bundle.MAX_MANIFEST_BYTES))
    assert bundle._manifest(root)["cell"] == "c"
    (root / bundle.MANIFEST).write_bytes(padded_json(document, bundle.MAX_MANIFEST_BYTES + 1))
    with pytest.raises(UserError, match="is larger than"):
        bundle._manifest(root)
    files = {f"cache/f{i}": "a" * 64 for i in range(bundle.MAX_FILES)}
    (root / bundle.MANIFEST).write_text(json.dumps({**document, "files": files}))
    assert len(bundle._manifest(root)["files"]) == bundle.MAX_FILES  # type: ignore[arg-type]
    files["cache/one-more"] = "a" * 64
    (root / bundle.MANIFEST).write_text(json.dumps({**document, "files": files}))
    with pytest.raises(UserError, match=f"lists more than {bundle.MAX_FILES} files"):
        bundle._manifest(root)


def test_a_stored_report_at_its_cap_is_judged_and_past_it_is_not_a_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_IMAGES_CACHE", str(tmp_path))
    path = smoke.report_path(IMAGE_ID)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(padded_json(passing_report(), verdict.MAX_REPORT_BYTES))
    assert smoke.passing_report(IMAGE_ID) is not None
    path.write_bytes(padded_json(passing_report(), verdict.MAX_REPORT_BYTES + 1))
    assert smoke.passing_report(IMAGE_ID) is None


def test_a_recorded_image_id_file_past_its_cap_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "image-id"
    path.write_bytes(b"x" * (recorded.MAX_RECORD_BYTES + 1))
    with pytest.raises(UserError, match=f"larger than {recorded.MAX_RECORD_BYTES} bytes"):
        confined.read_bytes(path, recorded.MAX_RECORD_BYTES)


# ---------------------------------------------------------------- the matrix


def _axes(project: Project, torch: int, cudnn: int) -> None:
    """axes of `torch` x `cudnn` x 1 base x 1 flavor combinations (versions no index has: each is
    rejected quickly, which is what a cap must bound)."""
    versions = ", ".join(f'"9.{n}.0"' for n in range(torch))
    cudnns = ", ".join(f'"8.{n}.0"' for n in range(cudnn))
    text = project.matrix.read_text()
    text = re.sub(
        r"\ninclude:",
        f"\naxes:\n  torch: [{versions}]\n  cudnn: [{cudnns}]\n  base: [bookworm]\n  flavor: [runtime]\ninclude:",
        text,
        count=1,
    )
    project.matrix.write_text(text)


def test_a_matrix_at_the_combination_cap_expands_and_one_past_is_refused_before_expanding(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    includes = len(yamlsource.load(project.matrix)[0]["include"])
    _axes(project, 1, matrix.MAX_COMBINATIONS - includes)
    assert matrix.check_expansion(*parse(project.matrix)) == matrix.MAX_COMBINATIONS
    code, output = run(project, capsys, "plan")
    assert code == 0 and "Traceback" not in output, output[-2000:]


def test_one_combination_past_the_cap_is_one_line_with_the_product(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    includes = len(yamlsource.load(project.matrix)[0]["include"])
    _axes(project, 1, matrix.MAX_COMBINATIONS - includes + 1)
    code, output = run(project, capsys, "plan")
    total = matrix.MAX_COMBINATIONS + 1
    assert_one_line_error(code, output, f"{project.matrix}:", f"asks for {total} combinations", "more than the 1000")


def test_the_reviews_million_cell_matrix_is_refused_at_once(
    project: Project, capsys: pytest.CaptureFixture[str]
) -> None:
    text = project.matrix.read_text()
    versions = ", ".join(f'"{n}.0"' for n in range(1, 12))
    axes = f"\naxes:\n  torch: [{versions}]\n  cuda: [{versions}]\n  cudnn: [{versions}]\n  python: [{versions}]\n"
    axes += "  base: [bookworm]\n  flavor: [runtime]\n  platform: [linux/amd64]\n"
    project.matrix.write_text(re.sub(r"\ninclude:", axes + "include:", text, count=1))
    code, output = run(project, capsys, "plan")  # run() fails a call over 30 s; this answers in well under one
    assert_one_line_error(code, output, "11 torch x 11 cuda x 11 cudnn x 11 python = 14641")


# ---------------------------------------------------------------- registry answers


def test_a_blob_at_its_cap_is_read_and_past_it_is_refused(hostile: tuple[str, type[Scripted]]) -> None:
    host, handler = hostile
    at_cap = b"\0" * registry.MAX_BLOB_BYTES
    handler.routes = {f"/v2/torch/blobs/{_digest(at_cap)}": (200, {}, at_cap)}
    client = registry.Registry(host, retries=0)
    assert len(client.blob("torch", _digest(at_cap))) == registry.MAX_BLOB_BYTES
    past = at_cap + b"\0"
    handler.routes = {f"/v2/torch/blobs/{_digest(past)}": (200, {}, past)}
    with pytest.raises(UserError, match=f"more than the {registry.MAX_BLOB_BYTES} such an answer may hold"):
        client.blob("torch", _digest(past))


def test_a_referrer_list_at_its_entry_cap_is_read_and_past_it_is_refused(hostile: tuple[str, type[Scripted]]) -> None:
    host, handler = hostile
    entry = {"digest": IMAGE_ID, "size": 1, "artifactType": "application/x"}
    for count, refused in ((registry.MAX_REFERRERS, False), (registry.MAX_REFERRERS + 1, True)):
        body = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [entry] * count}).encode()
        handler.routes = {f"/v2/torch/referrers/{IMAGE_ID}": (200, {"Content-Type": OCI_INDEX}, body)}
        client = registry.Registry(host, retries=0)
        if refused:
            with pytest.raises(UserError, match="without a list of manifests"):
                client.referrers("torch", IMAGE_ID)
        else:
            assert len(client.referrers("torch", IMAGE_ID)) == count


def test_a_token_answer_at_its_cap_is_read_and_past_it_is_refused(hostile: tuple[str, type[Scripted]]) -> None:
    host, handler = hostile
    challenge = {"/v2/": (401, {"WWW-Authenticate": f'Bearer realm="http://{host}/token",service="s"'}, b"")}
    handler.routes = {**challenge, "/token": (200, {}, padded_json({"token": "t0k"}, auth.MAX_TOKEN_ANSWER_BYTES))}
    with pytest.raises(UserError, match="refused the credentials"):  # the token was read and used; /v2/ still says no
        registry.Registry(host, registry.Registry.login("ci", "pw"), retries=0).check()
    handler.routes = {**challenge, "/token": (200, {}, padded_json({"token": "t0k"}, auth.MAX_TOKEN_ANSWER_BYTES + 1))}
    with pytest.raises(UserError, match="more than the"):
        registry.Registry(host, registry.Registry.login("ci", "pw"), retries=0).check()


def _serve_attached(handler: type[Scripted], subject: str, count: int) -> None:
    """`count` referrers of `subject`, each its own self-test artifact (the same report, under
    another annotation: the door counts an artifact once however often a listing names it)."""
    report = json.dumps(passing_report()).encode()
    routes: dict[str, tuple[int, dict[str, str], bytes]] = {
        f"/v2/torch/blobs/{_digest(report)}": (200, {}, report),
    }
    entries = []
    for number in range(count):
        artifact = json.dumps({
            "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": reports.SELFTEST_TYPE,
            "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": _digest(b"{}"), "size": 2},
            "layers": [{"mediaType": reports.SELFTEST_TYPE, "digest": _digest(report), "size": len(report)}],
            "subject": {"mediaType": OCI_MANIFEST, "digest": subject, "size": 1},
            "annotations": {"test.number": str(number)},
        }).encode()  # fmt: skip
        routes[f"/v2/torch/manifests/{_digest(artifact)}"] = (200, {"Content-Type": OCI_MANIFEST}, artifact)
        entries.append({"mediaType": OCI_MANIFEST, "digest": _digest(artifact), "size": len(artifact),
                        "artifactType": reports.SELFTEST_TYPE})  # fmt: skip
    listing = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()
    routes[f"/v2/torch/referrers/{subject}"] = (200, {"Content-Type": OCI_INDEX}, listing)
    handler.routes = routes


def test_reports_on_a_digest_at_their_cap_are_read_and_past_it_are_refused(hostile: tuple[str, type[Scripted]]) -> None:
    host, handler = hostile
    client = registry.Registry(host, retries=0)
    _serve_attached(handler, IMAGE_ID, reports.MAX_REPORTS)
    door = attachments.Door(client, "torch")
    assert len(door.reports(IMAGE_ID)) == reports.MAX_REPORTS
    _serve_attached(handler, IMAGE_ID, reports.MAX_REPORTS + 1)
    with pytest.raises(UserError, match=f"carries {reports.MAX_REPORTS + 1} self-test reports, more than"):
        door.reports(IMAGE_ID)


def test_artifacts_verify_reads_at_their_cap_and_past_it_are_refused(hostile: tuple[str, type[Scripted]]) -> None:
    host, handler = hostile
    client, subject = registry.Registry(host, retries=0), registry.Manifest.of(b"{}", OCI_MANIFEST)
    _serve_attached(handler, subject.digest, verify.MAX_ARTIFACTS)
    found = verify.ImageFindings(subject.digest, "")
    door = attachments.Door(client, "torch")
    assert len(verify._artifacts(door, subject, found)) == verify.MAX_ARTIFACTS and not found.problems
    _serve_attached(handler, subject.digest, verify.MAX_ARTIFACTS + 1)
    with pytest.raises(UserError, match=f"lists {verify.MAX_ARTIFACTS + 1} SBOMs, reports and attestations, more"):
        verify._artifacts(door, subject, found)


# ---------------------------------------------------------------- the documentation


def test_every_cap_is_stated_in_the_security_page_with_its_value() -> None:
    page = (REPO / "docs" / "security.md").read_text()
    caps = {
        "MAX_COMBINATIONS": f"{matrix.MAX_COMBINATIONS:,}",
        "yamlsource.MAX_BYTES": "1 MiB",
        "yamlsource.MAX_VALUES": f"{yamlsource.MAX_VALUES:,}",
        "yamlsource.MAX_ALIASES": str(yamlsource.MAX_ALIASES),
        "yamlsource.MAX_DEPTH": str(yamlsource.MAX_DEPTH),
        "MAX_LOCK_BYTES": "16 MiB",
        "bundle.MAX_MANIFEST_BYTES": "16 MiB",
        "bundle.MAX_FILES": f"{bundle.MAX_FILES:,}",
        "registry.MAX_MANIFEST_BYTES": "4 MiB",
        "registry.MAX_BLOB_BYTES": "64 MiB",
        "registry.MAX_REFERRERS": f"{registry.MAX_REFERRERS:,}",
        "auth.MAX_TOKEN_ANSWER_BYTES": "1 MiB",
        "auth.MAX_CONFIG_BYTES": "1 MiB",
        "verdict.MAX_REPORT_BYTES": "16 MiB",
        "recorded.MAX_RECORD_BYTES": "4 KiB",
        "reports.MAX_REPORTS": str(reports.MAX_REPORTS),
        "verify.MAX_ARTIFACTS": str(verify.MAX_ARTIFACTS),
    }
    assert matrix.MAX_COMBINATIONS == 1000 and yamlsource.MAX_BYTES == 1 << 20
    assert header.MAX_LOCK_BYTES == bundle.MAX_MANIFEST_BYTES == verdict.MAX_REPORT_BYTES == 16 << 20
    assert registry.MAX_MANIFEST_BYTES == 4 << 20 and registry.MAX_BLOB_BYTES == 64 << 20
    assert auth.MAX_TOKEN_ANSWER_BYTES == auth.MAX_CONFIG_BYTES == 1 << 20 and recorded.MAX_RECORD_BYTES == 4096
    rows = {line for line in page.splitlines() if line.startswith("| ")}
    for name, value in caps.items():
        assert any(f"`{name}`" in row and f"| {value} |" in row for row in rows), (name, value)
