"""Hash-locked requirements per cell: images/<cell>/requirements.lock (and flavor.lock).

Each cell is resolved by uv for its own target (its architecture, the base's glibc as the
manylinux tag, the cell's Python), wheels only, with a sha256 for every file. The torch stack and the
flavor's extras are locked separately so that cells differing only in flavor share the
stack's layer; the flavor is resolved with the stack lock as constraints, so it can never
move torch or a CUDA library.

A lock's header records the fingerprint of its inputs and a digest of its body. Locks arrive
through pull requests, so `lock --check` and the build's preflight read every line: each
entry is `name==version` with sha256 hashes and nothing else (no URL, no option, no marker),
the body must be the one `lock` wrote, and torch and every library torch pins must be the
versions the cell resolves to. All of it offline.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from builder.errors import Location, UserError
from builder.facts import pypi
from builder.facts.compat import version_key
from builder.lock.header import read_text, split, with_header
from builder.plan.cell import Cell
from builder.plan.matrix import Matrix
from builder.spec import flavor, grammar
from builder.spec import platform as platforms
from builder.spec.env import expand_env

STACK_LOCK = "requirements.lock"
FLAVOR_LOCK = "flavor.lock"
ENTRY = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)(?P<hashes>(?:\s+--hash=sha256:\S+)*)")
# The manylinux targets uv resolves for (see `uv pip compile --help`); a base with a newer
# glibc is resolved for the newest of them, which only ever picks older wheels.
UV_MANYLINUX = ["2.17", "2.28", *(f"2.{n}" for n in range(31, 41))]


@dataclass(frozen=True)
class LockedPackage:
    name: str
    version: str
    hashes: tuple[str, ...]


@dataclass(frozen=True)
class Lockfile:
    path: Path
    fingerprint: str | None
    packages: dict[str, LockedPackage]
    content_matches: bool = True  # the body is the one `lock` wrote (its digest is in the header)
    text: str = field(default="", repr=False)  # the whole file: the flavor lock's input, the served copy and its hash

    @classmethod
    def read(cls, path: Path) -> Lockfile:
        """Read and validate every line; anything but comments and hashed pins is a UserError."""
        text = read_text(path)
        header, _ = split(text)
        return cls(path, header.fingerprint, parse_lock(text, path), header.content_matches, text)

    @property
    def sha256(self) -> str:
        """The file's sha256 (read_text decoded it from UTF-8, so encoding gives the same bytes)."""
        return hashlib.sha256(self.text.encode()).hexdigest()

    def version(self, prefix: str) -> str | None:
        """Version of the first locked package whose name starts with prefix."""
        return next((p.version for n, p in sorted(self.packages.items()) if n.startswith(prefix)), None)


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """Lines with their backslash continuations joined, each with the number of its first line."""
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        yield start, pending + line
        pending = ""
    if pending:
        yield start, pending


def parse_lock(text: str, path: Path, require_hashes: bool = True) -> dict[str, LockedPackage]:
    """The `name==version --hash=sha256:...` entries of a lock; any other line is a UserError.

    Comments and blank lines are skipped. Everything else pip would act on (an option such as
    --index-url, a URL or path requirement, a marker, an editable) is refused with its line.
    """
    packages: dict[str, LockedPackage] = {}
    for number, line in _logical_lines(text):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        where = Location(path, number)
        match = ENTRY.fullmatch(stripped)
        if match is None:
            raise UserError(
                f"{stripped[:60]!r} is not a pinned requirement; a lock holds only `name==version "
                "--hash=sha256:<64 hex>` lines; run `python -m builder lock` to write it again",
                where,
            )
        name, version = match.group("name"), match.group("version")
        if not grammar.PYTHON_NAME.matches(name) or not grammar.PYTHON_VERSION.matches(version):
            raise UserError(f"{name}=={version[:40]!r} is not a valid project name and version", where)
        hashes = tuple(h.split(":", 1)[1] for h in match.group("hashes").split())
        bad = next((h for h in hashes if not grammar.SHA256.matches(h)), None)
        if bad is not None:
            raise UserError(f"{name}: hash {bad[:70]!r} is not {grammar.SHA256.hint}", where)
        if require_hashes and not hashes:
            raise UserError(f"{name}=={version} has no --hash=sha256:...; every locked file needs one", where)
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in packages:
            raise UserError(f"{key} is locked twice; run `python -m builder lock` to write it again", where)
        packages[key] = LockedPackage(key, version, hashes)
    return packages


def parse_requirements(text: str) -> dict[str, LockedPackage]:
    """`name==version` lines such as `pip freeze` prints (hashes optional)."""
    return parse_lock(text, Path("<requirements>"), require_hashes=False)


def stack_requirements(cell: Cell) -> list[str]:
    """The torch stack every flavor of this torch build shares: torch at its exact build, plus common."""
    return [f"torch=={cell.torch.version}", *flavor.load().common_python]


def stack_overrides(cell: Cell) -> list[str]:
    """Pins that replace torch's own: a cuDNN raised above torch's exact pin (never lowered)."""
    if not cell.cudnn_overridden:
        return []
    package = next(name for name in cell.torch.pins if name.startswith("nvidia-cudnn"))
    return [f"{package}=={cell.cudnn}"]


def flavor_requirements(cell: Cell) -> list[str]:
    """What the cell's flavor adds to the stack, with the torch wheel's own pins filled in."""
    spec = flavor.load().flavors[cell.flavor]
    values = {
        "cuda": cell.cuda,
        "cuda_major": cell.torch.cuda_major or "",
        "cuda_toolkit": cell.torch.cuda_toolkit or "",
        "trtllm": cell.trtllm or "",
    }
    templates = list(spec.python)
    if cell.is_cuda:
        templates += spec.python_cuda_toolkit if cell.torch.cuda_toolkit else spec.python_cuda_legacy
    return [template.format(**values) for template in templates]


def manylinux_target(glibc: str, platform: str = platforms.DEFAULT) -> str:
    usable = [v for v in UV_MANYLINUX if version_key(v) <= version_key(glibc)]
    if not usable:
        raise UserError(f"glibc {glibc} is older than manylinux 2.17, the oldest torch-capable target")
    return f"{platforms.of(platform).wheel}-manylinux_{usable[-1].replace('.', '_')}"


def _inputs(
    cell: Cell, grid: Matrix, requirements: list[str], overrides: list[str], constraints: str
) -> dict[str, object]:
    index = grid.index(cell.index)
    inputs: dict[str, object] = {
        "requirements": requirements,
        "overrides": overrides,
        "constraints": constraints,
        "index_url": index.url,
        "find_links": index.find_links,  # as written, so a fingerprint is the same on every machine
        "python": cell.python,
        "platform": manylinux_target(cell.base.glibc, cell.platform),
    }
    if index.extra_urls:  # absent and empty are the same input
        inputs["extra_urls"] = index.extra_urls
    return inputs


def _fingerprint(inputs: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def stack_fingerprint(cell: Cell, grid: Matrix) -> str:
    return _fingerprint(_inputs(cell, grid, stack_requirements(cell), stack_overrides(cell), ""))


def flavor_fingerprint(cell: Cell, grid: Matrix, stack_text: str) -> str:
    """The flavor is resolved against the stack lock: its body is one of the flavor's inputs."""
    constraints = hashlib.sha256(stack_text.partition("\n")[2].encode()).hexdigest()
    return _fingerprint(_inputs(cell, grid, flavor_requirements(cell), [], constraints))


def _uv() -> str:
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if not found:
            raise UserError("uv is not installed; `pip install uv` (nox sessions install it)") from None
        return found


def _compile(cell: Cell, grid: Matrix, requirements: list[str], overrides: list[str], constraints: str | None) -> str:
    """uv pip compile for the cell's target. Input files get fixed relative names in a scratch
    directory, so uv's `# via -r requirements.in` comments are the same on every run."""
    index = grid.index(cell.index)
    with tempfile.TemporaryDirectory() as scratch:
        Path(scratch, "requirements.in").write_text("\n".join(requirements) + "\n")
        Path(scratch, "overrides.txt").write_text("\n".join(overrides) + "\n")
        command = [
            _uv(), "pip", "compile", "requirements.in", "--quiet", "--no-header", "--generate-hashes",
            "--only-binary", ":all:", "--python-platform", manylinux_target(cell.base.glibc, cell.platform),
            "--python-version", cell.python, "--override", "overrides.txt",
            "--index-url" if index.url else "--no-index", *([index.url] if index.url else []),
        ]  # fmt: skip
        for url in index.extra_urls:
            command += ["--extra-index-url", url]
        for link in index.find_links:
            directory = expand_env(link)
            if not Path(directory).is_dir():
                # The text as written: an expanded value may come from the environment.
                raise UserError(
                    f"find-links directory {link} does not exist; point the variable it names at a directory "
                    "of wheels, or edit the entry",
                    grid.path,
                    f"indexes.{cell.index}.find_links",
                )
            command += ["--find-links", directory]
        if constraints is not None:
            Path(scratch, "stack.lock").write_text(constraints)
            command += ["--constraint", "stack.lock"]
        # uv's own certificate bundle does not know a site's proxy CA; the host's store does.
        env = {**os.environ, "UV_NATIVE_TLS": "1", "UV_NO_CONFIG": "1"}
        result = subprocess.run(command, capture_output=True, text=True, env=env, check=False, cwd=scratch)
    if result.returncode != 0:
        detail = " ".join(line.strip() for line in result.stderr.splitlines() if line.strip())[:600]
        raise UserError(f"cannot resolve cell {cell.name}: {detail}", grid.path)
    return result.stdout


def require_real_trtllm_wheels(cell: Cell, grid: Matrix) -> None:
    """TensorRT-LLM on PyPI is a stub that downloads at install time: lock only the real wheels."""
    if not cell.trtllm:
        return
    index = grid.index(cell.index)
    found, tried = [], []
    for link in index.find_links:
        directory = Path(expand_env(link))
        tried.append(link)  # as written: the expanded path may come from the environment
        if directory.is_dir():
            found += [f.filename for f in pypi.find_links_files("tensorrt-llm", directory) if f.version == cell.trtllm]
    for url in index.urls:
        try:
            found += [f.filename for f in pypi.index_files("tensorrt-llm", url) if f.version == cell.trtllm]
            tried.append(url)
        except OSError as error:
            tried.append(f"{url} (unreachable: {getattr(error, 'reason', error)})")
    if not found:
        raise UserError(
            f"cell {cell.name}: no real wheel of tensorrt-llm {cell.trtllm} in {'; '.join(tried)} "
            "(PyPI has only a stub that downloads at install time, which a build never runs); "
            f"put tensorrt_llm-{cell.trtllm}-*.whl and the tensorrt wheels in a find_links directory of index "
            f"'{cell.index}', or make NVIDIA's index (https://pypi.nvidia.com) reachable",
            grid.path,
        )


def lock_cell(cell: Cell, grid: Matrix) -> list[Path]:
    """Resolve and write the cell's locks; returns the files written."""
    require_real_trtllm_wheels(cell, grid)
    directory = cell.directory
    directory.mkdir(parents=True, exist_ok=True)
    stack_text = with_header(
        stack_fingerprint(cell, grid),
        _compile(cell, grid, stack_requirements(cell), stack_overrides(cell), None),
    )
    stack = Lockfile(directory / STACK_LOCK, None, parse_lock(stack_text, directory / STACK_LOCK), text=stack_text)
    verify_stack(cell, stack)
    written = [_write(directory / STACK_LOCK, stack_text)]
    extras = flavor_requirements(cell)
    flavor_path = directory / FLAVOR_LOCK
    if extras:
        body = _compile(cell, grid, extras, [], stack_text)
        flavor_text = with_header(flavor_fingerprint(cell, grid, stack_text), body)
        flavor_lock = Lockfile(flavor_path, None, parse_lock(flavor_text, flavor_path), text=flavor_text)
        verify_flavor(cell, stack, flavor_lock)
        written.append(_write(flavor_path, flavor_text))
    elif flavor_path.exists():
        flavor_path.unlink()
    return written


def lock_cells(cells: list[Cell], grid: Matrix, jobs: int = 4) -> Iterator[tuple[Cell, list[Path] | UserError]]:
    """Lock cells concurrently (each writes only its own directory); yields each outcome in order."""

    def attempt(cell: Cell) -> list[Path] | UserError:
        try:
            return lock_cell(cell, grid)
        except UserError as error:
            return error

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        yield from zip(cells, pool.map(attempt, cells), strict=True)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def lock_facts(lock: Lockfile) -> dict[str, str | None]:
    """torch, its CUDA runtime, cuDNN, NCCL and triton as the lock resolved them."""
    toolkit = lock.packages.get("cuda-toolkit")
    runtime = lock.version("nvidia-cuda-runtime")
    cuda = toolkit.version if toolkit else runtime
    torch = lock.packages.get("torch")
    return {
        "torch": torch.version if torch else None,
        "cuda": ".".join(cuda.split(".")[:2]) if cuda else "cpu",
        "cuda_runtime": runtime,
        "cudnn": lock.version("nvidia-cudnn"),
        "nccl": lock.version("nvidia-nccl"),
        "triton": lock.version("triton"),
        "numpy": lock.packages["numpy"].version if "numpy" in lock.packages else None,
    }


def verify_stack(cell: Cell, lock: Lockfile) -> None:
    """The lock must hold exactly the torch build, CUDA, cuDNN and pinned libraries the cell names.
    (That every entry has its sha256 is parse_lock's check, made on every read.)"""
    where = lock.path
    facts = lock_facts(lock)
    if facts["torch"] != cell.torch.version:
        raise UserError(
            f"cell {cell.name}: the lock holds torch {facts['torch']}, not {cell.torch.version} from index "
            f"'{cell.index}'; a different build must never pass for the one asked for; run `python -m builder lock "
            f"{cell.name}`",
            where,
        )
    if facts["cuda"] != cell.cuda:
        raise UserError(
            f"cell {cell.name}: the lock holds CUDA {facts['cuda']} libraries, the cell asks {cell.cuda}", where
        )
    if facts["cudnn"] != cell.cudnn:
        raise UserError(f"cell {cell.name}: the lock holds cuDNN {facts['cudnn']}, the cell asks {cell.cudnn}", where)
    for name, pin in cell.torch.pins.items():
        if name.startswith("nvidia-cudnn"):
            continue  # may be raised above torch's pin; checked against the cell above
        locked = lock.packages.get(name)
        if locked is not None and Version(locked.version) != Version(pin):
            raise UserError(
                f"cell {cell.name}: the lock holds {name} {locked.version}, torch {cell.torch.version} pins {pin}",
                where,
            )


def verify_flavor(cell: Cell, stack: Lockfile, extras: Lockfile) -> None:
    """The flavor's lock adds packages; it may never move one the stack locked."""
    for name, package in extras.packages.items():
        pinned = stack.packages.get(name)
        if pinned is not None and Version(pinned.version) != Version(package.version):
            raise UserError(
                f"cell {cell.name}: {name} {package.version} here, {pinned.version} in {STACK_LOCK}; the flavor may "
                "not move what the torch stack locked",
                extras.path,
            )
