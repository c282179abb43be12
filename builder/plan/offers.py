"""What `plan` offers beyond the matrix: the newest TensorRT-LLM releases, and where the
matrix's trtllm cells stand against them."""

from __future__ import annotations

from typing import Any

from builder.facts.compat import TrtllmTable
from builder.plan.matrix import Matrix


def trtllm_offers(grid: Matrix, table: TrtllmTable) -> dict[str, Any]:
    """The newest stable release and pre-release from data/trtllm.json, and for the newest
    stable, the matrix's cell on it (built or rejected, with the reason) or that it has none."""
    stable, prerelease = table.newest(prerelease=False), table.newest(prerelease=True)
    offers: dict[str, Any] = {
        "newest_stable": stable.summary() if stable else None,
        "newest_prerelease": prerelease.summary() if prerelease else None,
    }
    if stable is None:
        return offers
    cells = [c.name for c in grid.cells if c.flavor == "trtllm" and c.trtllm == stable.version]
    rejected = [f"{r.name}: {r.reason}" for r in grid.rejected if r.selector.get("trtllm") == stable.version]
    older = sorted({c.trtllm for c in grid.cells if c.flavor == "trtllm" and c.trtllm and c.trtllm != stable.version})
    offers["cells_on_newest_stable"] = cells
    offers["rejected_on_newest_stable"] = rejected
    offers["older_releases_in_matrix"] = older
    return offers


def describe(offers: dict[str, Any]) -> list[str]:
    """The offers as lines for the terminal."""
    lines = [f"TensorRT-LLM newest stable: {offers['newest_stable']}"]
    if offers.get("newest_prerelease"):
        lines.append(f"TensorRT-LLM newest pre-release (not for published tags): {offers['newest_prerelease']}")
    if offers.get("cells_on_newest_stable"):
        lines.append(f"  built on it here: {', '.join(offers['cells_on_newest_stable'])}")
    lines += [f"  rejected: {line}" for line in offers.get("rejected_on_newest_stable", [])]
    if not offers.get("cells_on_newest_stable") and not offers.get("rejected_on_newest_stable"):
        lines.append("  no cell of this matrix is on it; add an include with trtllm: set to it")
    if offers.get("older_releases_in_matrix"):
        lines.append(f"  this matrix also builds older releases: {', '.join(offers['older_releases_in_matrix'])}")
    return lines
