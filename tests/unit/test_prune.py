"""Which self-test reports `publish --prune-reports` deletes (builder/publish/prune.py): another
image's, junk, and a device's older passes; never a failure of the image."""

from __future__ import annotations

from typing import Any

import pytest

from builder.assemble import smoke
from builder.publish import prune

IMAGE = "sha256:" + "a" * 64


def _report(device: str, time: str, status: str = "pass", image_id: str = IMAGE) -> dict[str, Any]:
    return {"image_id": image_id, "device": device, "time": time, "status": status}


@pytest.fixture(autouse=True)
def reports_pass_by_status(monkeypatch: pytest.MonkeyPatch) -> None:
    # The real check also reads the report's checks; here a report passes when it says so.
    monkeypatch.setattr(
        smoke, "why_not_a_pass", lambda report, image_id: None if report.get("status") == "pass" else "failed"
    )


def test_each_devices_newest_pass_stays_and_its_older_passes_go() -> None:
    attached = [
        prune._Attached("sha256:1", "d1", _report("cpu", "2026-01-01T00:00:00Z")),
        prune._Attached("sha256:2", "d2", _report("cpu", "2026-03-01T00:00:00Z")),
        prune._Attached("sha256:3", "d3", _report("NVIDIA H200", "2026-02-01T00:00:00Z")),
        prune._Attached("sha256:4", "d4", _report("NVIDIA H200", "2026-01-01T00:00:00Z")),
    ]
    assert [a.artifact for a in prune._stale(attached, IMAGE)] == ["sha256:1", "sha256:4"]


def test_a_failure_of_the_image_is_never_pruned_but_another_images_report_and_junk_are() -> None:
    attached = [
        prune._Attached("sha256:1", "d1", _report("NVIDIA H200", "2020-01-01T00:00:00Z", status="fail")),
        prune._Attached("sha256:2", "d2", _report("NVIDIA H200", "2026-01-01T00:00:00Z")),
        prune._Attached("sha256:3", "d3", _report("cpu", "2026-01-01T00:00:00Z", image_id="sha256:" + "b" * 64)),
        prune._Attached("sha256:4", "", None),
    ]
    assert sorted(a.artifact for a in prune._stale(attached, IMAGE)) == ["sha256:3", "sha256:4"]


def test_a_signed_statement_goes_only_with_the_report_it_is_about() -> None:
    gone = {prune._identity(_report("cpu", "2026-01-01T00:00:00Z"))}
    same_time_other_image = _report("cpu", "2026-01-01T00:00:00Z", image_id="sha256:" + "b" * 64)
    assert prune._about_gone(prune.provenance.SELFTEST, _report("cpu", "2026-01-01T00:00:00Z"), IMAGE, set(), gone)
    assert not prune._about_gone(prune.provenance.SELFTEST, _report("cpu", "2026-02-01T00:00:00Z"), IMAGE, set(), gone)
    assert prune._about_gone(prune.provenance.SELFTEST, same_time_other_image, IMAGE, set(), set())  # another image
    result = {"configuration": [{"digest": {"sha256": "d1"}}]}
    assert prune._about_gone(prune.provenance.TEST_RESULT, result, IMAGE, {"d1"}, set())
    assert not prune._about_gone(prune.provenance.TEST_RESULT, result, IMAGE, {"d2"}, set())
    assert not prune._about_gone(prune.provenance.PROVENANCE, {}, IMAGE, {"d1"}, gone)  # provenance never goes
