"""Record what the release tests read, from PyPI: torch's simple-index page (its x86_64 CPython
wheels of 2.6.0 and later, the fields the builder reads) and each release's METADATA (the lines
that say what it needs). `python -m harness.record_releases` writes tests/fixtures/releases/."""

from __future__ import annotations

import json
from pathlib import Path

from packaging.version import Version

from builder.facts import pypi, releases

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "releases"
OLDEST = Version("2.6.0")
KEPT_HEADERS = ("Metadata-Version", "Name", "Version", "Requires-Python", "Requires-Dist")


def main() -> None:
    listed = releases.releases_on(pypi.index_files("torch", "https://pypi.org/simple"))
    files, metadata = [], {}
    for version, wheels in sorted(listed.items(), key=lambda item: Version(item[0])):
        if Version(version) < OLDEST:
            continue
        files += [{"filename": w.filename, "url": w.url, "hashes": {"sha256": w.sha256},
                   "requires-python": w.requires_python, "size": w.size} for w in wheels]  # fmt: skip
        message = pypi.wheel_metadata(wheels[0])
        metadata[version] = "".join(f"{name}: {value}\n" for name, value in message.items() if name in KEPT_HEADERS)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    page = {"meta": {"api-version": "1.1"}, "name": "torch", "files": files}
    (FIXTURES / "torch-simple.json").write_text(json.dumps(page, indent=1) + "\n")
    (FIXTURES / "torch-metadata.json").write_text(json.dumps(metadata, indent=1, sort_keys=True) + "\n")
    print(f"recorded {len(files)} wheels of {len(metadata)} releases into {FIXTURES}")


if __name__ == "__main__":
    main()
