"""Sessions: build (the main job), tests, lint, smoke, publish, audit, update, bench, repro, engine.

The sessions that run the builder share one virtual environment (.nox/builder), installed from
requirements/builder.lock once and again only when the lock changes, and call
`python -m builder ...`; the logic lives in builder/, not here. tests and lint install the
lock with the test and lint extras into environments of their own, as nox does.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import nox

# A bare `./nox` (a newcomer's first try) runs the linters: short, and it installs and starts nothing on
# the machine. The test suite, which does (as root), is asked for by name: `./nox -s tests`.
nox.options.sessions = ["lint"]
nox.options.reuse_existing_virtualenvs = True


# The builder's dependencies, pinned with their sha256 (`nox -s lock_builder` writes them from
# pyproject.toml): a newer release on PyPI changes no image, digest or zstd blob until the lock moves.
BUILDER_LOCK = "requirements/builder.lock"
DEV_LOCK = "requirements/dev.lock"  # the same, with the test and lint extras


def _install_with_extras(session: nox.Session) -> None:
    """The builder with its test and lint extras, into the session's own environment."""
    session.install("--require-hashes", "-r", DEV_LOCK)
    session.install("--no-deps", "-e", ".")


BUILDER_ENV = Path(".nox") / "builder"  # the one environment the builder's sessions share


def _builder(session: nox.Session) -> str:
    """The shared environment's python, with the builder installed from its lock: made once, and
    again when the lock changes. Each session in an environment of its own installed the same 65
    packages again (about 25 s each, and a CI job runs three sessions)."""
    python = BUILDER_ENV / "bin" / "python"
    stamp = BUILDER_ENV / "builder.lock.sha256"
    wanted = hashlib.sha256(Path(BUILDER_LOCK).read_bytes()).hexdigest()
    BUILDER_ENV.parent.mkdir(exist_ok=True)
    with (BUILDER_ENV.parent / "builder.install-lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # two sessions at once: one installs, the other waits
        if not (python.exists() and stamp.exists() and stamp.read_text() == wanted):
            session.run(sys.executable, "-m", "venv", "--clear", str(BUILDER_ENV), external=True)
            pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            session.run(*pip, "--require-hashes", "-r", BUILDER_LOCK, external=True)
            session.run(*pip, "--no-deps", "-e", ".", external=True)
            stamp.write_text(wanted)
    return str(python)


def _run_builder(session: nox.Session, *arguments: str) -> None:
    session.run(_builder(session), "-m", "builder", *arguments, external=True)


@nox.session
def lock_builder(session: nox.Session) -> None:
    """Write requirements/*.lock from pyproject.toml (after changing its dependencies); needs PyPI."""
    session.install("--require-hashes", "-r", BUILDER_LOCK)  # uv is one of the builder's dependencies
    common = ["uv", "pip", "compile", "--universal", "--python-version", "3.10", "--generate-hashes", "--no-header"]
    session.run(*common, "pyproject.toml", "-o", BUILDER_LOCK)
    session.run(*common, "pyproject.toml", "--extra", "test", "--extra", "lint", "-o", DEV_LOCK)
    session.run(*common, "requirements/nox.in", "-o", "requirements/nox.lock")


def _ensure_engine(session: nox.Session) -> None:
    """Start an engine when none answers; as root this may install Debian's docker.io."""
    _run_builder(session, "engine", "--install")


@nox.session(venv_backend="none")
def engine(session: nox.Session) -> None:
    """Install (as root, with apt) and start a Docker engine if none answers."""
    _ensure_engine(session)


@nox.session(venv_backend="none")
def build(session: nox.Session) -> None:
    """Build the flagship image, or the cells named after `--` (or `-- --all`), then self-test each."""
    _ensure_engine(session)
    _run_builder(session, "build", *session.posargs)


@nox.session(venv_backend="none")
def sweep(session: nox.Session) -> None:
    """Build and self-test every buildable cell in turn (hours), recorded in images/sweep.json and docs/matrix.md."""
    _ensure_engine(session)
    _run_builder(session, "sweep", *session.posargs)


@nox.session(venv_backend="none")
def smoke(session: nox.Session) -> None:
    """Run the in-image self-test on built cells or images (`-- CELL|IMAGE ...`)."""
    _run_builder(session, "smoke", *session.posargs)


@nox.session(venv_backend="none")
def publish(session: nox.Session) -> None:
    """Push cells whose self-test passed for that exact image ID (`-- CELL ...`)."""
    _run_builder(session, "publish", *session.posargs)


@nox.session(venv_backend="none")
def verify(session: nox.Session) -> None:
    """Check a published image (`-- REF`); `-- --rebuild REF` also builds it again here and compares."""
    if "--rebuild" in session.posargs:
        _ensure_engine(session)
    _run_builder(session, "verify", *session.posargs)


@nox.session(venv_backend="none")
def audit(session: nox.Session) -> None:
    """Locked packages a security fix has since replaced (`-- --osv DIR`, `--json`, `--fail-on`)."""
    _run_builder(session, "audit", *session.posargs)


@nox.session(venv_backend="none")
def update(session: nox.Session) -> None:
    """Regenerate what the matrix generates (`-- --security`: only the packages with fixes)."""
    _run_builder(session, "update", *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """Unit tests, drift checks, and integration tests against the real engine and registry.

    As root on a fresh machine this installs, with apt, the engine and the tools the tests use
    (docker.io, mmdebstrap, gpgv, docker-registry, apache2-utils, openssl, gnupg, sudo) and starts dockerd.
    `-- --cell CELL` runs the integration tests on another cell (a CUDA one, say).
    """
    _install_with_extras(session)
    if not _excludes_integration(session.posargs):  # `-m "not integration"` touches no engine
        session.run("python", "-m", "builder", "engine", "--install", "--test-tools")
    for matrix in ("matrix.yaml", "tests/fixtures/multiarch.yaml"):  # generated files match their matrix
        session.run("python", "-m", "builder", "--matrix", matrix, "render", "--check")
        session.run("python", "-m", "builder", "--matrix", matrix, "lock", "--check")
    # The slowest tests, in every log: where the suite's minutes go. Test files or folders named
    # after `--` are run alone, not added to the whole suite.
    if any(_names_tests(arg) for arg in session.posargs):
        session.run("pytest", "--durations=25", *session.posargs, env={"PYTHONUNBUFFERED": "1"})
    elif _excludes_integration(session.posargs):
        session.run("pytest", "tests", "--durations=25", *session.posargs, env={"PYTHONUNBUFFERED": "1"})
    else:
        _run_parts_side_by_side(session, ["tests", "--durations=25", *session.posargs])


BESIDE_LOG = Path(".nox") / "tests-beside.log"


def _run_parts_side_by_side(session: nox.Session, arguments: list[str]) -> None:
    """The whole suite as its two parts at once (tests/support/parts.py): the host's integration
    tests here, the rest in a second pytest whose output goes to BESIDE_LOG and is printed after.
    Both run to their end; the session fails if either failed."""
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", "PATH": f"{session.bin}:{os.environ.get('PATH', '')}"}
    session.log(f"the unit tests and those marked `beside` run meanwhile; their output: {BESIDE_LOG}")
    with BESIDE_LOG.open("w") as log:
        beside = subprocess.Popen(
            [str(Path(session.bin) / "pytest"), *arguments],
            env={**environment, "TORCH_IMAGES_TESTS_PART": "beside"},
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            host_code = subprocess.run([str(Path(session.bin) / "pytest"), *arguments],
                                       env={**environment, "TORCH_IMAGES_TESTS_PART": "host"}).returncode  # fmt: skip
        finally:
            beside_code = beside.wait()
    print(BESIDE_LOG.read_text(), flush=True)
    codes = {"host": host_code, "beside": beside_code}
    # 5: pytest selected none of that part's tests (`-m network` has no host part), not a failure.
    failed = [part for part, code in codes.items() if code not in (0, 5)]
    if failed or set(codes.values()) == {5}:
        session.error(f"pytest exit status by part: {codes}")


def _names_tests(argument: str) -> bool:
    """Whether a pytest argument names tests to run (a path under tests/, with or without ::)."""
    return argument.split("::")[0].startswith("tests/")


def _excludes_integration(posargs: list[str]) -> bool:
    """Whether pytest's `-m` expression leaves the integration tests out."""
    expressions = [posargs[i + 1] for i, arg in enumerate(posargs[:-1]) if arg == "-m"]
    expressions += [arg.removeprefix("-m") for arg in posargs if arg.startswith("-m") and arg != "-m"]
    return any("not integration" in expression for expression in expressions)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff and mypy."""
    _install_with_extras(session)
    session.run("ruff", "check", "builder", "image", "benchmarks", "harness", "tests", "noxfile.py")
    session.run("ruff", "format", "--check", "builder", "image", "benchmarks", "harness", "tests", "noxfile.py")
    session.run("mypy", "builder", "benchmarks", "harness")


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """Benchmarks, ratios side by side in one run (targets in README)."""
    _ensure_engine(session)
    # The checkout on the path: the bench uses harness/ (the loopback registry, ctr, Docker 29), never tests/.
    session.run(_builder(session), "benchmarks/bench.py", *session.posargs,
                env={"PYTHONUNBUFFERED": "1", "PYTHONPATH": "."}, external=True)  # fmt: skip


@nox.session(venv_backend="none")
def repro(session: nox.Session) -> None:
    """Build a cell twice without cache and compare image IDs and layers (`-- CELL`)."""
    _ensure_engine(session)
    _run_builder(session, "verify-repro", *session.posargs)
