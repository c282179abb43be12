"""The command line as a newcomer meets it: --matrix anywhere, pipes, help, progress, render's folder."""

from __future__ import annotations

import argparse
import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from builder import cli
from builder.commands import build as build_command
from builder.commands import common
from builder.commands import lock as lock_command
from builder.commands import render as render_command
from builder.engine import daemon
from builder.errors import UserError
from builder.facts import refresh
from builder.facts.compat import TorchWheels
from builder.lock import inputs
from builder.plan import matrix
from builder.plan.matrix import load_matrix
from builder.terminal import SafeConsole

REPO = Path(__file__).resolve().parents[2]


def _builder(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "builder", *argv], capture_output=True, text=True, cwd=cwd, check=False
    )


def test_matrix_is_accepted_before_or_after_the_subcommand(tmp_path: Path) -> None:
    before = _builder("--matrix", str(REPO / "matrix.yaml"), "plan", "--json", cwd=tmp_path)
    after = _builder("plan", "--json", "--matrix", str(REPO / "matrix.yaml"), cwd=tmp_path)
    assert before.returncode == after.returncode == 0 and before.stdout == after.stdout
    missing = _builder("plan", "--matrix", str(tmp_path / "nope.yaml"), cwd=tmp_path)
    assert missing.returncode == 2 and "nope.yaml: cannot read" in missing.stderr


def test_plan_json_into_a_reader_that_stops_early_ends_without_a_traceback() -> None:
    result = subprocess.run(
        f"{sys.executable} -m builder plan --json | head -n 2", shell=True, capture_output=True, text=True, cwd=REPO
    )
    assert result.stdout.splitlines() == ["{", ' "cells": [']
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr


def test_every_subcommand_and_option_has_help_that_names_its_default_or_needs() -> None:
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command").choices  # type: ignore[union-attr]
    for name, sub in subparsers.items():
        assert sub.description, name
        for action in sub._actions:
            assert action.help, (name, action.dest)
            verbs = action.choices if isinstance(action, argparse._SubParsersAction) else {}
            for verb, verb_parser in verbs.items():
                if isinstance(verb_parser, argparse.ArgumentParser):  # a verb (publish stage): the same
                    assert verb_parser.description, (name, verb)
                    assert all(option.help for option in verb_parser._actions), (name, verb)
    build_help = subparsers["build"].format_help()
    assert "default: the flagship" in build_help and "Needs the engine" in build_help
    assert "about 6 GB" in subparsers["verify-repro"].format_help()
    assert "mmdebstrap" in subparsers["engine"].format_help()


def test_progress_off_a_terminal_prints_one_line_per_step_with_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    sink = io.StringIO()
    monkeypatch.setattr(common, "console", Console(file=sink, force_terminal=False, width=200))
    with common.progress("cell: starting") as report:
        report("cell: Step 1/9 : FROM base")
        report("cell: Step 2/9 : RUN apt-get")
    lines = sink.getvalue().splitlines()
    assert len(lines) == 3
    assert all(re.match(r"^\[\s*\d+\.\d s\] cell: ", line) for line in lines), lines


def test_progress_on_a_terminal_keeps_each_step_above_its_spinner(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39: the spinner alone erased the build's steps."""
    sink = io.StringIO()
    monkeypatch.setattr(common, "console", SafeConsole(file=sink, force_terminal=True, width=200))
    with common.progress("cell: starting") as report:
        report("cell: Step 1/9 : FROM base")
        report("cell: Step 2/9 : RUN apt-get")
    text = sink.getvalue()
    assert "] cell: Step 1/9 : FROM base" in text and "] cell: Step 2/9 : RUN apt-get" in text


def test_a_matrix_whose_every_cell_is_rejected_says_why_each_was(matrix_file: Path, wheels: TorchWheels) -> None:
    matrix_file.write_text(
        matrix_file.read_text()
        .replace('glibc: "2.36"', 'glibc: "2.17"')
        .replace('glibc: "2.31"', 'glibc: "2.17"')
        .replace('torch: ["2.6.0", "2.9.1", "2.13.0"]', 'torch: ["2.9.1"]')
    )
    with pytest.raises(UserError) as caught:
        load_matrix(matrix_file, wheels)
    line = caught.value.line()
    assert "the matrix makes no buildable cell" in line
    assert (
        "2.9.1-bookworm-runtime: torch 2.9.1's wheel needs glibc 2.28 (manylinux_2_28), base bookworm has 2.17" in line
    )
    assert "2.9.1-bullseye-runtime: torch 2.9.1 has no wheel for Python 3.9" in line


def test_render_removes_folders_of_cells_the_matrix_no_longer_has(tmp_path: Path) -> None:
    shutil.copy(REPO / "matrix.yaml", tmp_path / "matrix.yaml")
    shutil.copytree(REPO / "images", tmp_path / "images")
    gone = tmp_path / "images" / "2.0.0-cu11.8-buster-runtime"
    shutil.copytree(tmp_path / "images" / "2.13.0-cpu-bookworm-runtime", gone)
    kept = tmp_path / "images" / "notes"
    kept.mkdir()
    (kept / "README.txt").write_text("mine")
    check = _builder("--matrix", str(tmp_path / "matrix.yaml"), "render", "--check")
    assert check.returncode == 1 and f"{gone} belongs to no cell" in check.stdout
    result = _builder("--matrix", str(tmp_path / "matrix.yaml"), "render")
    assert result.returncode == 0 and not gone.exists()
    assert (kept / "README.txt").read_text() == "mine"  # not render's: left alone, still reported
    assert (
        f"{kept} belongs to no cell" in _builder("--matrix", str(tmp_path / "matrix.yaml"), "render", "--check").stdout
    )


def test_each_matrix_renders_under_its_own_images_folder() -> None:
    # examples/trtllm.yaml's cells cannot be locked here (no real TensorRT-LLM wheels): its
    # check reports its own missing locks, and never matrix.yaml's cells as orphans.
    result = _builder("--matrix", "examples/trtllm.yaml", "render", "--check")
    assert "belongs to no cell" not in result.stdout
    assert "examples/trtllm-images/" in result.stdout
    assert _builder("render", "--check").returncode == 0


def test_paths_do_not_depend_on_the_working_directory(tmp_path: Path) -> None:
    for command in (["render", "--check"], ["lock", "--check"]):
        result = _builder("--matrix", str(REPO / "matrix.yaml"), *command, cwd=tmp_path)
        assert result.returncode == 0, (command, result.stdout[-400:])
    assert not any(tmp_path.iterdir())  # and nothing written there


def test_the_engine_command_lists_what_it_would_install(monkeypatch: pytest.MonkeyPatch) -> None:

    monkeypatch.setattr(daemon, "_program_missing", lambda program: program in ("docker-registry", "htpasswd"))
    assert daemon.missing_packages(test_tools=False) == []
    assert daemon.missing_packages(test_tools=True) == ["docker-registry", "apache2-utils"]


def test_update_refreshes_then_locks_then_renders_reading_the_matrix_after_the_refresh(
    monkeypatch: pytest.MonkeyPatch, matrix_file: Path, wheels: TorchWheels
) -> None:
    # The stages themselves have their own tests (and `update` was run for real on the shipped
    # matrix); this is the order, and that lock sees the cells the refreshed facts allow.
    calls: list[str] = []
    refreshed = TorchWheels({"pypi": {k: v for k, v in wheels.table["pypi"].items() if k == "2.9.1"}})
    facts = [wheels]
    monkeypatch.setattr(matrix.TorchWheels, "load", staticmethod(lambda: facts[-1]))
    monkeypatch.setattr(refresh, "refresh", lambda spec, report: calls.append("refresh") or facts.append(refreshed))
    monkeypatch.setattr(
        lock_command,
        "locked",
        lambda grid, cells, jobs, python_only: calls.append(f"lock {len(cells)} {python_only}") or 0,
    )
    monkeypatch.setattr(render_command, "rendered", lambda grid: calls.append(f"render {len(grid.cells)}") or 0)
    assert cli.main(["--matrix", str(matrix_file), "update", "--python-only"]) == 0
    torch_291_cells = len([c for c in load_matrix(matrix_file, wheels).cells if c.torch.version == "2.9.1"])
    assert calls == ["refresh", f"lock {torch_291_cells} True", f"render {torch_291_cells}"]
    calls.clear()
    assert cli.main(["--matrix", str(matrix_file), "update", "--no-refresh"]) == 0
    assert calls[0].startswith("lock ") and "refresh" not in calls


def test_each_publish_verb_takes_only_its_own_options(tmp_path: Path) -> None:
    """Issue 60: one verb a command. `--key` gates promote, gpu-test and prune; on stage it would
    do nothing, so stage has no such option (and the old mode flags are gone)."""
    result = _builder("publish", "stage", "--key", str(tmp_path / "team.pub"))
    assert result.returncode == 2 and "unrecognized arguments: --key" in result.stderr
    old = _builder("publish", "--stage")
    assert old.returncode == 2 and "required: VERB" in old.stderr
    listed = _builder("publish", "--help")
    assert all(verb in listed.stdout for verb in ("push", "stage", "sign", "gpu-test", "promote", "prune"))
    assert "Traceback" not in result.stderr + old.stderr


def test_every_publish_verb_offers_a_dry_run() -> None:
    """Issue 60: each verb that writes to a registry says what it would do with --dry-run."""
    from builder import cli

    parser = cli.build_parser()
    verbs = next(a for a in parser._subparsers._group_actions[0].choices["publish"]._actions  # type: ignore[union-attr]
                 if isinstance(a, argparse._SubParsersAction)).choices  # fmt: skip
    assert set(verbs) == {"push", "stage", "sign", "stage-rebuild", "sign-rebuild", "gpu-test", "promote", "prune"}
    for name, verb in verbs.items():
        assert any("--dry-run" in action.option_strings for action in verb._actions), name


def test_the_front_door_ci_output_cells_after_options_and_update_without_security(tmp_path: Path) -> None:
    """Issue 39: `--output` into a folder a fresh checkout lacks gave a traceback; cells after an
    option gave the top-level usage; `update CELL` silently relocked every cell."""
    target = tmp_path / ".github" / "workflows" / "torch-images.yml"
    written = _builder("ci", "github", "--output", str(target))
    assert written.returncode == 0 and target.is_file() and "Traceback" not in written.stderr
    after = _builder("ci", "github", "--registry", "127.0.0.1:5000/torch", "2.13.0-cpu-bookworm-runtime")
    assert after.returncode == 0, after.stderr
    jobs = yaml.safe_load(after.stdout)["jobs"]["cell"]["strategy"]["matrix"]["include"]
    assert [job["cell"] for job in jobs] == ["2.13.0-cpu-bookworm-runtime"]
    refused = _builder("update", "2.13.0-cpu-bookworm-runtime")
    assert refused.returncode == 2 and "cells and --osv go with --security" in refused.stderr
    assert _builder("plan", "--bogus").returncode == 2


def test_a_python_without_the_builders_dependencies_gets_one_line_saying_where_to_run_it() -> None:
    """The README's `python -m builder` from a Python that lacks rich and the rest (its site
    packages off, as a fresh machine's system Python): one line naming the environment to use,
    exit 2, no traceback."""
    result = subprocess.run(
        [sys.executable, "-S", "-m", "builder", "plan"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and ".nox/builder/bin/python -m builder" in result.stderr


@pytest.mark.parametrize(("no_cache", "tested_again"), [(False, False), (True, True)])
def test_build_no_cache_runs_the_self_test_again_even_with_an_earlier_pass_of_the_image(
    monkeypatch: pytest.MonkeyPatch, no_cache: bool, tested_again: bool
) -> None:
    """`build --no-cache` redoes everything: a passing report of the same image ID from an earlier
    run is taken only without it (CI builds the flagship with it, to try how the self-test runs)."""
    from builder.assemble import build, smoke
    from builder.commands import build as build_command

    grid = load_matrix(REPO / "matrix.yaml")
    cell = grid.cell("2.13.0-cpu-bookworm-runtime")
    image_id = "sha256:" + "a" * 64

    def built(*_: object) -> build.BuildResult:
        result = build.BuildResult(cell.name, "torch:x")
        result.image_id, result.state = image_id, build.BuildState.BUILT
        return result

    ran: list[str] = []
    monkeypatch.setattr(build, "build_cell", built)
    monkeypatch.setattr(build_command.recorded, "compare", lambda *_: (None, "no record"))
    monkeypatch.setattr(smoke, "passing_report", lambda found: {"status": "pass"} if found == image_id else None)
    monkeypatch.setattr(smoke, "run", lambda _, reference: ran.append(reference) or smoke.SmokeResult(
        image_id, "pass", {"checks": []}, Path("report.json"), 1.0))  # fmt: skip
    args = cli.build_parser().parse_args(["build", *(["--no-cache"] if no_cache else []), cell.name])
    locks = inputs.read(cell, grid)
    result = build_command._build(None, grid, locks, None, args)  # type: ignore[arg-type]
    build_command._self_test(None, result, args)  # type: ignore[arg-type]
    assert (ran == ["torch:x"]) == tested_again
    assert result.notes[-1] == ("self-test pass" if tested_again else "self-test pass (earlier run, same image ID)")


def test_skip_existing_against_a_registry_that_will_not_answer_without_credentials_builds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 55: CI builds before it logs in; a registry that refuses to answer then says nothing
    of whether the build ID is published, so the cell is built (never skipped on a guess)."""

    class Refusing:
        def manifest(self, repository: str, reference: str) -> None:
            raise UserError(f"registry ghcr.io: {repository}:{reference}: answered 401")

    grid = load_matrix(REPO / "matrix.yaml")
    assert build_command._published_or_unknown(Refusing(), grid, grid.flagship, "a" * 32) is False  # type: ignore[arg-type]
    assert "cannot tell whether build ID aaaaaaaaaaaa is published" in " ".join(capsys.readouterr().err.split())


def test_skip_existing_with_a_registry_that_wants_credentials_builds_every_cell(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the act run: reaching the registry itself asks for credentials, before any cell."""

    def refuses(*_: object) -> None:
        raise UserError("registry 127.0.0.1:5000 wants credentials (401); log in with `docker login`")

    monkeypatch.setattr(build_command, "registry_of", refuses)
    grid = load_matrix(REPO / "matrix.yaml")
    assert build_command._registry_to_read(grid, argparse.Namespace()) is None
    assert "--skip-existing: registry 127.0.0.1:5000 wants credentials" in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize(
    "verb", ["push", "stage", "sign", "stage-rebuild", "sign-rebuild", "gpu-test", "promote", "prune"]
)
def test_every_publish_verb_runs_to_its_registry_and_stops_there_in_one_line(verb: str) -> None:
    """Each verb parses its options and reaches the registry (a dead one here): a verb whose own
    options its code does not know (sign-rebuild's `--compression`, found under act) ends in a
    traceback, not this line."""
    result = _builder("publish", verb, "--registry", "127.0.0.1:9/torch", "--run", "7")
    if verb in ("push", "prune"):  # they take no run ID
        result = _builder("publish", verb, "--registry", "127.0.0.1:9/torch")
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-2000:]
    assert result.returncode == 2 and "error:" in result.stdout + result.stderr
