"""The code's shape is checked, not described: the stages import only the stages to their left
(import-linter's layers contract in pyproject.toml), and no two modules import each other."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[2]


def test_the_stages_import_only_the_stages_to_their_left() -> None:
    program = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    result = subprocess.run([program, "--no-cache"], cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "1 kept, 0 broken" in result.stdout


def test_no_two_modules_import_each_other() -> None:
    graph = grimp.build_graph("builder", include_external_packages=False)
    cycles = sorted(
        {
            tuple(sorted((module, imported)))
            for module in graph.modules
            for imported in graph.find_modules_directly_imported_by(module)
            if graph.chain_exists(importer=imported, imported=module)
        }
    )
    assert cycles == [], cycles
