"""Apply data/layout.yaml's removals to the machine this runs on, to self-test what is left.

For a throwaway GPU machine whose own torch stack stands in for an image's (the image itself
cannot travel there): `prune` patterns are removed from this Python's site-packages by the very
script the images run (templates/scripts/prune-paths.py), and `dpkg` exclude globs that name
files (static archives, gcc's LTO tools) are deleted from the root filesystem, as dpkg would
not have unpacked them. Globs naming folders (docs, manuals, translations) are left: nothing on
this machine's GPU path reads them. It deletes files, so never run it on a machine you keep.

    python3 benchmarks/apply_layout_prunes.py --yes-this-machine-is-disposable

The layout is read by the builder's own validating loader (builder.config.layout, which needs
only PyYAML, as the GPU machine's image has it); the rest is the standard library.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the GPU machine has the checkout, not the installed builder

from builder.config import layout  # noqa: E402

PRUNE_SCRIPT = ROOT / "templates" / "scripts" / "prune-paths.py"


def load_prune_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("prune_paths", PRUNE_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def remove_dpkg_files(rules: tuple[layout.DpkgRule, ...]) -> None:
    """Delete the files each exclude glob names, except those an include glob keeps."""
    for pattern in [g for rule in rules for g in rule.exclude]:
        files = [p for p in glob.glob(pattern) if os.path.isfile(p) and not os.path.islink(p)]
        files = [p for p in files if layout.leaves_out(rules, p)]
        freed = sum(os.path.getsize(p) for p in files)
        for path in files:
            os.remove(path)
        print(f"dpkg exclude {pattern}: {len(files)} files on this machine, {freed / 1e6:.1f} MB")


def main() -> int:
    if sys.argv[1:] != ["--yes-this-machine-is-disposable"]:
        print(__doc__.split("\n\n")[0], file=sys.stderr)
        print("usage: apply_layout_prunes.py --yes-this-machine-is-disposable (it deletes files)", file=sys.stderr)
        return 2
    shipped = layout.load()
    site_packages = sysconfig.get_paths()["purelib"]
    print(f"pruning {site_packages} as data/layout.yaml says")
    load_prune_script().main(site_packages, list(shipped.prune))
    remove_dpkg_files(shipped.rules)  # all of them: the runtime image's view
    return 0


if __name__ == "__main__":
    sys.exit(main())
