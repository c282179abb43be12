"""Report text is someone else's words: `verify` shows each such field quoted, on the builder's own
line, its newlines and control characters escaped, so a report cannot print a verdict of its own."""

from __future__ import annotations

from builder.oci.registry import Manifest
from builder.publish import attachments, reports, verify
from builder.terminal import quoted

IMAGE = "sha256:" + "a" * 64
FORGED = "H200\nregistry/torch:latest: verified (signed: \u202eall good)"


def test_a_device_name_with_a_newline_stays_inside_its_quotes_on_one_line() -> None:
    found = verify.ImageFindings(digest="sha256:" + "d" * 64, platform="", image_id=IMAGE)
    report = {"image_id": IMAGE, "device": FORGED, "status": "fail", "checks": []}
    verify._check_reports([verify.Artifact(reports.SELFTEST_TYPE, {}, report)], found, "optional")
    about = [line for line in [*found.lines, *found.problems] if "H200" in line]
    assert len(about) == 2  # the line and the problem, each the builder's own
    for line in about:
        assert "\n" not in line and "\u202e" not in line
        assert line.startswith('cpu report on "H200\\nregistry/torch:latest: verified')


def test_quoting_escapes_quotes_backslashes_and_cuts_long_text() -> None:
    assert quoted('say "hi" \\ ok') == '"say \\"hi\\" \\\\ ok"'
    assert quoted("x" * 200, 10) == '"' + "x" * 10 + '..."'
    assert quoted(None) == '"None"'


def test_many_artifacts_of_other_tools_do_not_make_verify_refuse_the_image() -> None:
    """Issue 47: more than 64 referrers of any kind (another tool's signatures, say) refused the image."""

    class Registry:
        def referrers(self, repository: str, subject: str, artifact_type: str | None = None) -> list[dict[str, str]]:
            return [{"digest": f"sha256:{n:064x}", "artifactType": "application/vnd.other.sig"} for n in range(100)]

    subject = Manifest.of(b'{"schemaVersion": 2}', "application/vnd.oci.image.manifest.v1+json")
    found = verify.ImageFindings(digest=subject.digest, platform="", image_id=IMAGE)
    assert verify._artifacts(attachments.Door(Registry(), "torch"), subject, found) == []  # type: ignore[arg-type]
    assert any("not read" in line and ": 100 (" in line for line in found.lines)
