"""Apply data/layout.yaml's removals to the machine this runs on, to self-test what is left.

For a throwaway GPU machine whose own torch stack stands in for an image's (the image itself
cannot travel there): `prune` patterns are removed from this Python's site-packages by the very
script the images run (templates/scripts/prune-paths.py), and `dpkg` exclude globs that name
files (static archives, gcc's LTO tools) are deleted from the root filesystem, as dpkg would
not have unpacked them. Globs naming folders (docs, manuals, translations) are left: nothing on
this machine's GPU path reads them. It deletes files, so never run it on a machine you keep.

    python3 benchmarks/apply_layout_prunes.py --yes-this-machine-is-disposable

Needs PyYAML (on the GPU machine's image); standard library otherwise.
"""

from __future__ import annotations

import fnmatch
import glob
import importlib.util
import os
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

import yaml

ROOT = Path(__file__).resolve().parent.parent
LAYOUT = ROOT / "data" / "layout.yaml"
PRUNE_SCRIPT = ROOT / "templates" / "scripts" / "prune-paths.py"


def load_prune_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("prune_paths", PRUNE_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def remove_dpkg_files(entries: list[dict[str, list[str]]]) -> None:
    for entry in entries:
        keep = entry.get("keep", [])
        for pattern in entry["exclude"]:
            files = [p for p in glob.glob(pattern) if os.path.isfile(p) and not os.path.islink(p)]
            files = [p for p in files if not any(fnmatch.fnmatch(p, k) for k in keep)]
            freed = sum(os.path.getsize(p) for p in files)
            for path in files:
                os.remove(path)
            print(f"dpkg exclude {pattern}: {len(files)} files on this machine, {freed / 1e6:.1f} MB")


def main() -> int:
    if sys.argv[1:] != ["--yes-this-machine-is-disposable"]:
        print(__doc__.split("\n\n")[0], file=sys.stderr)
        print("usage: apply_layout_prunes.py --yes-this-machine-is-disposable (it deletes files)", file=sys.stderr)
        return 2
    layout = yaml.safe_load(LAYOUT.read_text())
    site_packages = sysconfig.get_paths()["purelib"]
    print(f"pruning {site_packages} as data/layout.yaml says")
    load_prune_script().main(site_packages, [p for entry in layout["prune"] for p in entry["paths"]])
    remove_dpkg_files(layout.get("dpkg", []))
    return 0


if __name__ == "__main__":
    sys.exit(main())
