"""Report text is someone else's words: `verify` shows each such field quoted, on the builder's own
line, its newlines and control characters escaped, so a report cannot print a verdict of its own."""

from __future__ import annotations

from builder.publish import reports, verify
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
