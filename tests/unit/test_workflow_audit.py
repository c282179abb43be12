"""zizmor (offline, its default persona) audits every GitHub workflow `ci` emits: the plain one,
with the rebuild check, with GitHub's attestations, with zstd, and the daily schedule. A finding
fails the test unless the template says, on that line, why it does not apply (a `# zizmor:
ignore[rule]` comment with its reason)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from builder.plan.matrix import Matrix, load_matrix
from builder.render import ci

REPO = Path(__file__).resolve().parents[2]
ZIZMOR = shutil.which("zizmor")


def _rebuild_check(grid: Matrix, tmp_path: Path) -> None:
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    (tmp_path / "rebuilder.pub").write_bytes(
        key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    publish = grid.spec.publish.model_copy(update={"rebuilders": {"ci": "rebuilder.pub"}})
    grid.spec = grid.spec.model_copy(
        update={"publish": publish, "ci": grid.spec.ci.model_copy(update={"rebuild_check": True})}
    )


def _attestations(grid: Matrix, tmp_path: Path) -> None:
    grid.spec = grid.spec.model_copy(update={"ci": grid.spec.ci.model_copy(update={"github_attestations": True})})


def _zstd(grid: Matrix, tmp_path: Path) -> None:
    grid.spec = grid.spec.model_copy(update={"publish": grid.spec.publish.model_copy(update={"compression": "zstd"})})


VARIANTS: dict[str, Callable[[Matrix, Path], None]] = {
    "plain": lambda grid, tmp_path: None,
    "rebuild-check": _rebuild_check,
    "github-attestations": _attestations,
    "zstd": _zstd,
}


def _audit(text: str, tmp_path: Path) -> list[dict[str, object]]:
    folder = tmp_path / ".github" / "workflows"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "torch-images.yml").write_text(text)
    assert ZIZMOR is not None
    done = subprocess.run(
        [ZIZMOR, "--offline", "--no-progress", "--format", "json", str(folder / "torch-images.yml")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode in (0, 10, 11, 12, 13, 14), done.stderr  # 1x: findings, by their highest severity
    return list(json.loads(done.stdout))


@pytest.mark.skipif(ZIZMOR is None, reason="zizmor is not installed (the test extra installs it)")
@pytest.mark.parametrize("variant", [*VARIANTS, "schedule"])
def test_every_emitted_github_workflow_passes_zizmors_default_persona(
    variant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    grid = load_matrix(Path("matrix.yaml"))
    if variant == "schedule":
        text = ci.schedule(grid, "github")
    else:
        VARIANTS[variant](grid, tmp_path)
        text = ci.workflow(grid, "github", registry="ghcr.io/acme/torch")
    findings = _audit(text, tmp_path)
    assert findings == [], "\n".join(f"{f.get('ident')}: {f.get('desc')}" for f in findings)


@pytest.mark.skipif(ZIZMOR is None, reason="zizmor is not installed (the test extra installs it)")
def test_the_audit_finds_what_the_templates_avoid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: the same workflow as the templates had it before (the write permission for every
    job, at the workflow's level, and checkouts that keep their token) gives those findings."""
    monkeypatch.chdir(REPO)
    text = ci.workflow(load_matrix(Path("matrix.yaml")), "github", registry="ghcr.io/acme/torch")
    broken = re.sub(r"\n    permissions:\n(      .*\n)+", "\n", text)
    broken = broken.replace("permissions: {}", "permissions:\n  contents: read\n  packages: write", 1)
    broken = broken.replace("        with:\n          persist-credentials: false\n", "")
    assert broken != text and "persist-credentials" not in broken
    idents = {str(f.get("ident")) for f in _audit(broken, tmp_path)}
    assert {"excessive-permissions", "artipacked"} <= idents
