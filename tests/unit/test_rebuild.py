"""`verify --rebuild`'s report of what differs (builder/publish/rebuild.py): each path whose content,
mode, owner or kind differs between the published layer and the rebuilt one, with both sizes."""

from __future__ import annotations

from builder.publish import rebuild

PUBLISHED = [
    ["opt/venv/bin/python", "file", "0o755", 10, "aa", "0:0"],
    ["opt/torch-images/spec.json", "file", "0o644", 5, "bb", "0:0"],
    ["opt/torch-images/x", "file", "0o644", 1, "cc", "0:0"],
    ["etc/gone", "file", "0o644", 1, "dd", "0:0"],
]


def test_each_differing_path_says_what_differs_and_both_sizes() -> None:
    rebuilt = [
        ["opt/venv/bin/python", "file", "0o755", 10, "aa", "0:0"],
        ["opt/torch-images/spec.json", "file", "0o644", 6, "b2", "0:0"],
        ["opt/torch-images/x", "file", "0o600", 1, "cc", "1000:1000"],
        ["etc/new", "file", "0o644", 1, "ee", "0:0"],
    ]
    assert rebuild.differing(PUBLISHED, rebuilt) == [
        "etc/gone: only in the published layer",
        "etc/new: only in the rebuilt layer",
        "opt/torch-images/spec.json: content differs (published 5 bytes, rebuilt 6 bytes)",
        "opt/torch-images/x: mode, owner differs (published 1 bytes, rebuilt 1 bytes)",
    ]


def test_at_most_twenty_paths_are_named_and_the_rest_counted() -> None:
    many = [[f"f{n:03}", "file", "0o644", 1, "x", "0:0"] for n in range(30)]
    lines = rebuild.differing(many, [])
    assert len(lines) == 21 and lines[-1] == "... and 10 more"
