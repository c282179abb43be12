"""Which self-test reports `publish --prune-reports` deletes (builder/publish/prune.py): another
image's passes and a device's older passes, superseded only by a pass at least as trusted; never
a failure, and never what does not prove itself this digest's own attachment."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from typing import Any, ClassVar

import pytest

from builder import verdict
from builder.oci.registry import OCI_INDEX, OCI_MANIFEST, Registry
from builder.publish import attachments, prune, reports

IMAGE = "sha256:" + "a" * 64
DIGEST = "sha256:" + "d" * 64
ARTIFACT = "sha256:" + "f" * 64


def _report(device: str, time: str, status: str = "pass", image_id: str = IMAGE) -> dict[str, Any]:
    return {"image_id": image_id, "device": device, "time": time, "status": status}


def _signed(report: dict[str, Any], verified: bool) -> prune._Statement:
    return prune._Statement("sha256:s", "sha256:e", prune.provenance.SELFTEST, report, verified)


@pytest.fixture(autouse=True)
def reports_pass_by_status(monkeypatch: pytest.MonkeyPatch) -> None:
    # The real check also reads the report's checks; here a report passes when it says so.
    monkeypatch.setattr(
        verdict, "why_not_a_pass", lambda report, image_id: None if report.get("status") == "pass" else "failed"
    )


def test_each_devices_newest_pass_stays_and_its_older_passes_go() -> None:
    attached = [
        prune._Attached("sha256:1", "d1", _report("cpu", "2026-01-01T00:00:00Z")),
        prune._Attached("sha256:2", "d2", _report("cpu", "2026-03-01T00:00:00Z")),
        prune._Attached("sha256:3", "d3", _report("NVIDIA H200", "2026-02-01T00:00:00Z")),
        prune._Attached("sha256:4", "d4", _report("NVIDIA H200", "2026-01-01T00:00:00Z")),
    ]
    assert [a.artifact for a in prune._stale(attached, IMAGE, [], keyed=False)] == ["sha256:1", "sha256:4"]


def test_a_failure_is_never_pruned_whosever_it_is_but_another_images_pass_is() -> None:
    attached = [
        prune._Attached("sha256:1", "d1", _report("NVIDIA H200", "2020-01-01T00:00:00Z", status="fail")),
        prune._Attached("sha256:2", "d2", _report("NVIDIA H200", "2026-01-01T00:00:00Z")),
        prune._Attached("sha256:3", "d3", _report("cpu", "2026-01-01T00:00:00Z", image_id="sha256:" + "b" * 64)),
        prune._Attached("sha256:5", "d5", _report("H200", "2026-01-01T00:00:00Z", "fail", "sha256:" + "c" * 64)),
        prune._Attached("sha256:4", "", None),  # proven attached here as a report, and none: junk
    ]
    assert sorted(a.artifact for a in prune._stale(attached, IMAGE, [], keyed=False)) == ["sha256:3", "sha256:4"]


def test_a_forged_newer_pass_does_not_supersede_a_signed_one() -> None:
    genuine = _report("NVIDIA H200", "2026-01-01T00:00:00Z")
    forged = _report("NVIDIA H200", "2030-01-01T00:00:00Z")
    attached = [prune._Attached("sha256:1", "d1", genuine), prune._Attached("sha256:2", "d2", forged)]
    # Without a key, a statement about the genuine pass keeps it; with one, only a verified newer pass goes over it.
    assert prune._stale(attached, IMAGE, [_signed(genuine, False)], keyed=False) == []
    assert prune._stale(attached, IMAGE, [_signed(genuine, True)], keyed=True) == []
    newer_signed = [_signed(genuine, True), _signed(forged, True)]
    assert [a.artifact for a in prune._stale(attached, IMAGE, newer_signed, keyed=True)] == ["sha256:1"]


def test_a_signed_statement_goes_only_with_the_exact_report_bytes_it_names_and_never_while_they_stay() -> None:
    older, newer = _report("cpu", "2026-01-01T00:00:00Z"), _report("cpu", "2026-02-01T00:00:00Z")
    gone, kept = prune._Attached("sha256:1", "d1", older), prune._Attached("sha256:2", "d2", newer)
    copy = prune._Attached("sha256:3", "d1", older)  # the same bytes under another manifest

    def goes(kind: str, predicate: dict[str, Any], staying: list[prune._Attached]) -> bool:
        return prune._goes_with(prune._Statement("a", "e", kind, predicate, True), [gone], staying)

    result = {"result": "PASSED", "configuration": [{"digest": {"sha256": "d1"}}]}
    assert goes(prune.provenance.SELFTEST, older, [kept]) and goes(prune.provenance.TEST_RESULT, result, [kept])
    assert not goes(prune.provenance.SELFTEST, newer, [kept])  # about the report that stays
    assert not goes(prune.provenance.SELFTEST, older, [kept, copy])  # its bytes stay in the copy
    assert not goes(prune.provenance.TEST_RESULT, result, [kept, copy])
    assert goes(prune.provenance.TEST_RESULT, {**result, "result": "WARNED"}, [kept])  # a pass, warned
    assert not goes(prune.provenance.TEST_RESULT, {**result, "result": "FAILED"}, [kept])
    other = {"result": "PASSED", "configuration": [{"digest": {"sha256": "d9"}}]}  # bytes not attached here
    assert not goes(prune.provenance.TEST_RESULT, other, [kept])
    assert not goes(prune.provenance.PROVENANCE, {}, [kept])  # provenance never goes


def test_a_look_alike_or_a_copy_of_the_teams_signed_pass_supersedes_nothing() -> None:
    """Issue 57: a stranger's unsigned report with the identity (image, device, time) of the
    team's signed pass, as a byte-identical copy or with other figures, made prune delete the
    team's pass and its statements. An equal time is not later; the copy's bytes are the team's."""
    team = _report("NVIDIA H200", "2026-01-01T00:00:00Z")
    other_figures = {**team, "figures": "made up"}
    statements = [_signed(team, True)]
    for stranger in (prune._Attached("sha256:2", "d1", team), prune._Attached("sha256:2", "d2", other_figures)):
        attached = [prune._Attached("sha256:1", "d1", team), stranger]
        assert prune._stale(attached, IMAGE, statements, keyed=True) == []
        assert prune._stale(attached, IMAGE, [], keyed=False) == []  # unsigned: an equal time is not later


class _Registry:
    """Manifests as a registry would serve them; what is listed is only a hint."""

    host = "127.0.0.1:5000"

    def __init__(self, manifests: dict[str, Any]) -> None:
        self.manifests = manifests

    def artifact_manifest(self, repository: str, digest: str) -> dict[str, Any]:
        if digest not in self.manifests:
            raise prune.UserError("not served")
        return self.manifests[digest]  # type: ignore[no-any-return]


def _artifact(subject: str, kind: str = reports.SELFTEST_TYPE, layers: int = 1) -> dict[str, Any]:
    layer = {"mediaType": kind, "digest": "sha256:" + "1" * 64}
    return {"artifactType": kind, "layers": [layer] * layers, "subject": {"digest": subject}}


@pytest.mark.parametrize(
    ("manifest", "proven"),
    [
        (_artifact(DIGEST), True),
        (_artifact("sha256:" + "e" * 64), False),  # another image's report, listed in this digest's tag
        ({**_artifact(DIGEST), "subject": None}, False),  # names no subject: another cell's released image
        (_artifact(DIGEST, "application/vnd.cyclonedx+json"), False),  # this image's SBOM, not a report
        (None, False),  # listed, not served
    ],
)
def test_only_a_manifest_that_names_this_digest_as_its_subject_is_proven(manifest: Any, proven: bool) -> None:
    registry = _Registry({ARTIFACT: manifest} if manifest is not None else {})
    found = attachments.Door(registry, "torch").prove(DIGEST, ARTIFACT, [reports.SELFTEST_TYPE])  # type: ignore[arg-type]
    assert (found is not None) == proven


class _ReferrersApi(http.server.BaseHTTPRequestHandler):
    """A registry with the referrers API, whose listing of a digest's reports was written by a
    party with push rights: it lists the digest's own report beside another cell's released image
    (no subject) and another image's failed report (another subject). Deletes are recorded."""

    manifests: ClassVar[dict[str, bytes]] = {}
    blobs: ClassVar[dict[str, bytes]] = {}
    listed: ClassVar[list[dict[str, Any]]] = []
    deleted: ClassVar[list[str]] = []

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes = b"", content_type: str = "") -> None:
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
            self.send_header("Docker-Content-Digest", "sha256:" + hashlib.sha256(body).hexdigest())
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        reference = path.rsplit("/", 1)[-1]
        if "/referrers/" in path:
            index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": self.listed}
            self._send(200, json.dumps(index).encode(), OCI_INDEX)
        elif "/manifests/" in path and reference in self.manifests:
            self._send(200, self.manifests[reference], OCI_MANIFEST)
        elif "/blobs/" in path and reference in self.blobs:
            self._send(200, self.blobs[reference], "application/octet-stream")
        else:
            self._send(404)

    def do_DELETE(self) -> None:
        self.deleted.append(self.path.rsplit("/", 1)[-1])
        self._send(202)


def _serve(document: dict[str, Any]) -> str:
    body = json.dumps(document).encode()
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    _ReferrersApi.manifests[digest] = body
    return digest


def _report_artifact(subject: str | None, report: dict[str, Any]) -> str:
    blob = json.dumps(report).encode()
    layer = "sha256:" + hashlib.sha256(blob).hexdigest()
    _ReferrersApi.blobs[layer] = blob
    document: dict[str, Any] = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": reports.SELFTEST_TYPE,
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": "sha256:" + "4" * 64, "size": 2},
        "layers": [{"mediaType": reports.SELFTEST_TYPE, "digest": layer, "size": len(blob)}],
    }  # fmt: skip
    if subject is not None:
        document["subject"] = {"mediaType": OCI_MANIFEST, "digest": subject, "size": 2}
    return _serve(document)


def _prune_listing(*listed: str) -> prune.Pruned:
    """Prune DIGEST on the HTTP registry, its referrers listing naming `listed` in that order."""
    _ReferrersApi.listed = [{"mediaType": OCI_MANIFEST, "digest": d, "size": 1, "artifactType": reports.SELFTEST_TYPE}
                            for d in listed]  # fmt: skip
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ReferrersApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = Registry(f"127.0.0.1:{server.server_address[1]}", retries=0)
        return prune.prune_digest(attachments.Door(client, "torch"), "tag", DIGEST, IMAGE)
    finally:
        server.shutdown()
        server.server_close()


def test_on_a_registry_with_the_referrers_api_only_a_proven_attachment_is_deleted() -> None:
    """Issue 47: a listing is a hint, never proof; the manifest itself must name this digest."""
    _ReferrersApi.manifests, _ReferrersApi.blobs, _ReferrersApi.deleted = {}, {}, []
    other_image = "sha256:" + "e" * 64
    stale = _report_artifact(DIGEST, _report("cpu", "2020-01-01T00:00:00Z", image_id="sha256:" + "b" * 64))
    released = _serve({"schemaVersion": 2, "mediaType": OCI_MANIFEST,  # another cell's image: no subject
                       "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                  "digest": "sha256:" + "5" * 64, "size": 2},
                       "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                                   "digest": "sha256:" + "6" * 64, "size": 9}]})  # fmt: skip
    elsewhere = _report_artifact(other_image, _report("NVIDIA H200", "2026-01-01T00:00:00Z", status="fail"))
    pruned = _prune_listing(stale, released, elsewhere)
    assert pruned.reports == [stale] and _ReferrersApi.deleted == [stale]


def test_on_a_registry_with_the_referrers_api_a_listing_that_names_each_entry_twice_deletes_only_the_stale() -> None:
    """Issue 57: with each genuine entry listed twice, each report superseded itself and the
    newest went too. A digest proves once: only the older pass goes, and once."""
    _ReferrersApi.manifests, _ReferrersApi.blobs, _ReferrersApi.deleted = {}, {}, []
    older = _report_artifact(DIGEST, _report("cpu", "2026-01-01T00:00:00Z"))
    newer = _report_artifact(DIGEST, _report("cpu", "2026-02-01T00:00:00Z"))
    pruned = _prune_listing(older, newer, newer, older)
    assert pruned.reports == [older] and _ReferrersApi.deleted == [older] and pruned.kept == 1
