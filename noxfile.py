"""Sessions: build (the main job), tests, lint, smoke, publish, audit, update, bench, repro, engine.

Each session installs the builder into its own virtual environment and calls
`python -m builder ...`; the logic lives in builder/, not here.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True


# The builder's dependencies, pinned with their sha256 (`nox -s lock_builder` writes them from
# pyproject.toml): a newer release on PyPI changes no image, digest or zstd blob until the lock moves.
BUILDER_LOCK = "requirements/builder.lock"
DEV_LOCK = "requirements/dev.lock"  # the same, with the test and lint extras


def _install(session: nox.Session, *extras: str) -> None:
    session.install("--require-hashes", "-r", DEV_LOCK if extras else BUILDER_LOCK)
    session.install("--no-deps", "-e", ".")


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
    session.run("python", "-m", "builder", "engine", "--install")


@nox.session
def engine(session: nox.Session) -> None:
    """Install (as root, with apt) and start a Docker engine if none answers."""
    _install(session)
    _ensure_engine(session)


@nox.session
def build(session: nox.Session) -> None:
    """Build the flagship image, or the cells named after `--` (or `-- --all`), then self-test each."""
    _install(session)
    _ensure_engine(session)
    session.run("python", "-m", "builder", "build", *session.posargs)


@nox.session
def sweep(session: nox.Session) -> None:
    """Build and self-test every buildable cell in turn (hours), recorded in images/sweep.json and docs/matrix.md."""
    _install(session)
    _ensure_engine(session)
    session.run("python", "-m", "builder", "sweep", *session.posargs)


@nox.session
def smoke(session: nox.Session) -> None:
    """Run the in-image self-test on built cells or images (`-- CELL|IMAGE ...`)."""
    _install(session)
    session.run("python", "-m", "builder", "smoke", *session.posargs)


@nox.session
def publish(session: nox.Session) -> None:
    """Push cells whose self-test passed for that exact image ID (`-- CELL ...`)."""
    _install(session)
    session.run("python", "-m", "builder", "publish", *session.posargs)


@nox.session
def verify(session: nox.Session) -> None:
    """Check a published image (`-- REF`); `-- --rebuild REF` also builds it again here and compares."""
    _install(session)
    if "--rebuild" in session.posargs:
        _ensure_engine(session)
    session.run("python", "-m", "builder", "verify", *session.posargs)


@nox.session
def audit(session: nox.Session) -> None:
    """Locked packages a security fix has since replaced (`-- --osv DIR`, `--json`, `--fail-on`)."""
    _install(session)
    session.run("python", "-m", "builder", "audit", *session.posargs)


@nox.session
def update(session: nox.Session) -> None:
    """Regenerate what the matrix generates (`-- --security`: only the packages with fixes)."""
    _install(session)
    session.run("python", "-m", "builder", "update", *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """Unit tests, drift checks, and integration tests against the real engine and registry.

    As root on a fresh machine this installs, with apt, the engine and the tools the tests use
    (docker.io, mmdebstrap, docker-registry, apache2-utils, openssl, gnupg, sudo) and starts dockerd.
    `-- --cell CELL` runs the integration tests on another cell (a CUDA one, say).
    """
    _install(session, "test")
    if not _excludes_integration(session.posargs):  # `-m "not integration"` touches no engine
        session.run("python", "-m", "builder", "engine", "--install", "--test-tools")
    for matrix in ("matrix.yaml", "tests/fixtures/multiarch.yaml"):  # generated files match their matrix
        session.run("python", "-m", "builder", "--matrix", matrix, "render", "--check")
        session.run("python", "-m", "builder", "--matrix", matrix, "lock", "--check")
    # The slowest tests, in every log: where the suite's minutes go. Test files or folders named
    # after `--` are run alone, not added to the whole suite.
    whole = [] if any(_names_tests(arg) for arg in session.posargs) else ["tests"]
    session.run("pytest", *whole, "--durations=25", *session.posargs, env={"PYTHONUNBUFFERED": "1"})


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
    _install(session, "lint")
    session.run("ruff", "check", "builder", "image", "benchmarks", "harness", "tests", "noxfile.py")
    session.run("ruff", "format", "--check", "builder", "image", "benchmarks", "harness", "tests", "noxfile.py")
    session.run("mypy", "builder", "benchmarks", "harness")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks, ratios side by side in one run (targets in README)."""
    _install(session)
    _ensure_engine(session)
    # The checkout on the path: the bench uses harness/ (the loopback registry, ctr, Docker 29), never tests/.
    session.run("python", "benchmarks/bench.py", *session.posargs, env={"PYTHONUNBUFFERED": "1", "PYTHONPATH": "."})


@nox.session
def repro(session: nox.Session) -> None:
    """Build a cell twice without cache and compare image IDs and layers (`-- CELL`)."""
    _install(session)
    _ensure_engine(session)
    session.run("python", "-m", "builder", "verify-repro", *session.posargs)
