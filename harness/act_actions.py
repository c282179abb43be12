"""The GitHub actions the emitted workflow uses, laid out for `act --local-repository`, each at the
commit data/github-actions.yaml pins (the act test, tests/integration/test_act.py).

    python -m harness.act_actions --clones DIR --into OUT

DIR holds a clone of each action's repository (`git clone https://github.com/actions/checkout`
and so on: checkout, setup-python, cache, upload-artifact, download-artifact). Each is exported at
its pinned commit into OUT/<name>. The two artifact actions keep no `dist/` bundle small enough to
ship in every clone, so theirs is built here with npm, as their `release` script does:

- download-artifact: `npm ci` from its own lock; the bundle is checked to be byte for byte the
  one its pinned commit holds (its git blob hash).
- upload-artifact: its lock pins @actions/artifact 6.2.0, which the npm registry no longer serves;
  it is built with 6.2.1, with two edits for act 0.2.89's artifact server: the CreateArtifact
  request leaves out `mime_type`, a field act refuses (`unknown field "mime_type"`), and the Azure
  client's query parser (@azure/core-client's `pair.split("=", 2)`) keeps a value's `=` padding,
  which it drops from act's base64 `sig` (act then answers "Error unauthorized"). That bundle is
  therefore not the pinned commit's bytes: the deviation the act test states, and the only one.

Needs git, node and npm (the npm registry); nothing else leaves this machine.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

from builder.config import actions

NAMES = ("checkout", "setup-python", "cache", "upload-artifact", "download-artifact")
# The one edit, and why (upload-artifact only): see the module's docstring.
CLIENT = "node_modules/@actions/artifact/lib/internal/upload/upload-artifact.js"
MIME_LINE = re.compile(r"^(\s*)mimeType: StringValue\.create\(\{ value: contentType \}\),$", re.MULTILINE)
UPLOAD_CLIENT_VERSION = "6.2.1"
QUERY_SPLIT = re.compile(r'const \[name, value\] = pair\.split\("=", 2\);')
QUERY_SPLIT_KEEPING_PADDING = (
    'const cut = pair.indexOf("="); const name = cut < 0 ? pair : pair.slice(0, cut); '
    "const value = cut < 0 ? undefined : pair.slice(cut + 1); // act: keep base64 padding"
)


def _git(clone: Path, *arguments: str) -> str:
    return subprocess.run(["git", "-C", str(clone), *arguments], capture_output=True, text=True, check=True).stdout


def export(clone: Path, commit: str, into: Path) -> dict[str, str]:
    """The tree of `commit` into `into`; returns the blob hashes of the files it could not export
    (the bundles missing from a partial clone), by path."""
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    missing = {}
    for line in _git(clone, "ls-tree", "-r", commit).splitlines():
        meta, path = line.split("\t", 1)
        _, kind, blob = meta.split()
        if kind != "blob":
            continue
        target = into / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shown = subprocess.run(["git", "-C", str(clone), "cat-file", "blob", blob], capture_output=True, check=False)
        if shown.returncode != 0:
            missing[path] = blob
            continue
        target.write_bytes(shown.stdout)
    return missing


def _npm(folder: Path, *arguments: str) -> None:
    subprocess.run(["npm", *arguments, "--ignore-scripts", "--no-audit", "--no-fund"], cwd=folder, check=True)


def _blob_hash(path: Path) -> str:
    return subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, check=True).stdout.strip()


def build_download_artifact(folder: Path, missing: dict[str, str]) -> str:
    _npm(folder, "ci")
    subprocess.run(["npx", "ncc", "build", "src/download-artifact.ts"], cwd=folder, check=True)
    built = _blob_hash(folder / "dist/index.js")
    if built != missing.get("dist/index.js", built):
        raise SystemExit(f"download-artifact's bundle is {built}, the pinned commit's {missing['dist/index.js']}")
    return "dist/index.js: the pinned commit's bytes (git blob " + built + ")"


def build_upload_artifact(folder: Path) -> str:
    _npm(folder, "install", f"@actions/artifact@{UPLOAD_CLIENT_VERSION}")
    client = folder / CLIENT
    text, count = MIME_LINE.subn(
        r"\1// mimeType left out: act 0.2.89's artifact server refuses the field", client.read_text()
    )
    if count != 1:
        raise SystemExit(f"{client}: the mimeType line to leave out was not found once ({count})")
    client.write_text(text)
    subprocess.run(["npm", "run", "release"], cwd=folder, check=True)
    for bundle in (folder / "dist/upload/index.js", folder / "dist/merge/index.js"):
        text, count = QUERY_SPLIT.subn(QUERY_SPLIT_KEEPING_PADDING, bundle.read_text())
        if count != 1:
            raise SystemExit(f"{bundle}: the query parser to mend was not found once ({count})")
        bundle.write_text(text)
    return (
        f"dist/: built with @actions/artifact {UPLOAD_CLIENT_VERSION} (the lock's 6.2.0 is not served), without "
        "mime_type and with the Azure client's query parser keeping '=' padding (act needs both): NOT the "
        "pinned commit's bytes"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clones", type=Path, required=True, help="a folder with a clone of each action's repository")
    parser.add_argument("--into", type=Path, required=True, help="where each action goes, at its pinned commit")
    args = parser.parse_args(argv)
    pins = actions.load()
    for name in NAMES:
        commit = pins[f"actions/{name}"].commit
        clone = args.clones / name
        if not (clone / ".git").exists() and not (clone / "HEAD").exists():
            raise SystemExit(
                f"{clone}: no clone of actions/{name}; git clone https://github.com/actions/{name} {clone}"
            )
        missing = export(clone, commit, args.into / name)
        note = "as the pinned commit holds it"
        if name == "download-artifact":
            note = build_download_artifact(args.into / name, missing)
        elif name == "upload-artifact":
            note = build_upload_artifact(args.into / name)
        elif missing:
            raise SystemExit(f"actions/{name} at {commit}: the clone lacks {', '.join(missing)}")
        (args.into / name / ".torch-images-act").write_text(f"{commit}\n{note}\n")
        print(f"actions/{name}@{commit[:12]}: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
