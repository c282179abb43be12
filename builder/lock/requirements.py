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
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from builder import confined
from builder.config import flavor, grammar
from builder.config import platform as platforms
from builder.config.env import expand_env
from builder.errors import Location, UserError
from builder.facts import pypi
from builder.facts.compat import version_key
from builder.lock import header
from builder.lock.header import read_text, split, with_header
from builder.plan.cell import Cell
from builder.plan.matrix import Matrix

STACK_LOCK = "requirements.lock"
FLAVOR_LOCK = "flavor.lock"
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
        fields, _ = split(text)
        return cls(path, fields.fingerprint, parse_lock(text, path), fields.content_matches, text)

    @property
    def sha256(self) -> str:
        """The file's sha256 (read_text decoded it from UTF-8, so encoding gives the same bytes)."""
        return hashlib.sha256(self.text.encode()).hexdigest()

    def version(self, prefix: str) -> str | None:
        """Version of the first locked package whose name starts with prefix."""
        return next((p.version for n, p in sorted(self.packages.items()) if n.startswith(prefix)), None)


def layer_lock(lock: Lockfile, names: list[str], layer: str) -> Lockfile:
    """The part of a lock one layer installs: the named entries with their hashes, in the lock's
    own grammar (no header, no comments), as `requirements.<layer>.lock` beside it. A layer's RUN
    step names this file by its sha256, so the step's text, and the engine's cache key for it,
    moves only when one of its own packages moves, not when another layer's does."""
    missing = [name for name in names if name not in lock.packages]
    if missing:
        raise UserError(f"not in the lock: {', '.join(missing)}; run `python -m builder lock` again", lock.path)
    part = {name: lock.packages[name] for name in names}
    text = "".join(entry_text(package.name, package.version, package.hashes) for package in part.values())
    path = lock.path.with_name(f"{lock.path.stem}.{layer}{lock.path.suffix}")
    return Lockfile(path, None, part, True, text)


def entry_text(name: str, version: str, hashes: Iterable[str]) -> str:
    """One entry as `lock` writes it: `name==version \\`, then a `--hash` line per file."""
    lines = " \\\n".join(f"    --hash=sha256:{digest}" for digest in hashes)
    return f"{name}=={version} \\\n{lines}\n"


# The only lines `lock` writes (uv pip compile --generate-hashes --no-header, and the header): a lock
# is read by this grammar, line by line, and anything else is refused. pip's reader differs from any
# other (a comment ending in a backslash joins the next line for some readers and not for pip; `#`
# starts a comment only after whitespace; five pip versions, 20.3 to 25.1, are in the images), so
# the builder does not try to read what pip would: it accepts only lines every reader reads alike.
LOCK_ENTRY = re.compile(r"(?P<name>[a-z0-9][a-z0-9._-]*)==(?P<version>[A-Za-z0-9.!+_-]+) \\")
LOCK_HASH = re.compile(r"    --hash=sha256:(?P<sha256>[0-9a-f]{64})(?P<more> \\)?")
LOCK_VIA = re.compile(
    r"    # via(?: -r requirements\.in| [a-z0-9][a-z0-9._-]*)?"
    r"|    #   (?:-r requirements\.in|-c stack\.lock|[a-z0-9][a-z0-9._-]*)"
)
FROZEN = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)")
LOCK_SHAPES = "`name==version \\`, `    --hash=sha256:<64 hex>` lines and uv's `    # via` comments"


def _refuse_line(path: Path, number: int, line: str, why: str) -> UserError:
    return UserError(
        f"{line[:60]!r} {why}; a lock holds only what `lock` writes ({LOCK_SHAPES}); run `python -m builder lock` "
        "to write it again",
        Location(path, number),
    )


def parse_lock(text: str, path: Path) -> dict[str, LockedPackage]:
    """The entries of a lock, read by the grammar of what `lock` writes; any other line is a UserError.

    The header (checked by lock.header), then entries: `name==version \\`, one or more
    `    --hash=sha256:<hex>` lines each but the last ending in ` \\`, then uv's `# via` comments.
    Only `\\n` ends a line; no other control character, no non-ASCII text, no blank line.
    """
    if not text.endswith("\n"):
        raise UserError("does not end with a line break, as every file `lock` writes does", path)
    lines = text[:-1].split("\n")
    packages: dict[str, LockedPackage] = {}
    current: tuple[str, str, int] | None = None  # the entry whose hashes are being read
    hashes: list[str] = []
    for number, line in enumerate(lines, 1):
        if number == 1 and header.FIELDS.fullmatch(line):
            continue  # the header: whether its fields match is lock.header's to say
        if not line.isascii() or not line.isprintable():
            raise _refuse_line(path, number, line, "holds a control or non-ASCII character")
        if current is not None:
            found = LOCK_HASH.fullmatch(line)
            if found is None:
                raise _refuse_line(path, number, line, "is not the next `    --hash=sha256:<64 hex>` line of its entry")
            hashes.append(found.group("sha256"))
            if found.group("more"):
                continue
            name, version, start = current
            if name in packages:
                raise UserError(
                    f"{name} is locked twice; run `python -m builder lock` to write it again", Location(path, start)
                )
            packages[name] = LockedPackage(name, version, tuple(hashes))
            current, hashes = None, []
            continue
        entry = LOCK_ENTRY.fullmatch(line)
        if entry is not None:
            name, version = entry.group("name"), entry.group("version")
            if not grammar.PYTHON_VERSION.matches(version):
                raise _refuse_line(
                    path, number, line, f"names version {version[:40]!r}, not {grammar.PYTHON_VERSION.hint}"
                )
            current = (re.sub(r"[-_.]+", "-", name), version, number)
            continue
        if LOCK_VIA.fullmatch(line) is None or not packages:
            raise _refuse_line(path, number, line, "is not a line `lock` writes")
    if current is not None:
        raise _refuse_line(path, len(lines), lines[-1], "ends the file inside an entry")
    return packages


def parse_requirements(text: str) -> dict[str, LockedPackage]:
    """`name==version` lines such as `pip freeze` prints (no hashes): what an image holds."""
    packages = {}
    for line in text.splitlines():
        found = FROZEN.fullmatch(line.strip())
        if found:
            key = re.sub(r"[-_.]+", "-", found.group("name")).lower()
            packages[key] = LockedPackage(key, found.group("version"), ())
    return packages


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
        templates += spec.cuda_requirements(cell.torch.cuda_toolkit, cell.torch.cuda_major) or ()
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


class Resolutions:
    """uv's answer for each set of inputs, within one `lock` run: cells that share a stack (a
    runtime and its devel sibling: the same requirements, index, Python and platform) resolve
    it once. Keyed by the inputs' fingerprint, the one lock headers carry; one cell at a time
    resolves a given key, so no two threads run uv for the same inputs."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._answers: dict[str, str] = {}
        self.resolved = 0  # how many times uv ran

    def answer(self, key: str, resolve: Callable[[], str]) -> str:
        with self._guard:
            key_lock = self._locks.setdefault(key, threading.Lock())
        with key_lock:
            if key not in self._answers:
                self._answers[key] = resolve()
                with self._guard:
                    self.resolved += 1
            return self._answers[key]


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
        # The target Python (--python-version) needs no interpreter of that version: without
        # UV_PYTHON_DOWNLOADS=never uv tries to download one for every cell whose Python the host
        # lacks (10 s of retries each where GitHub is out of reach, a download where it is not).
        env = {**os.environ, "UV_NATIVE_TLS": "1", "UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never"}
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


def lock_cell(cell: Cell, grid: Matrix, resolutions: Resolutions | None = None) -> list[Path]:
    """Resolve and write the cell's locks; returns the files written. With `resolutions`,
    inputs another cell of the run resolved already are not resolved again."""
    require_real_trtllm_wheels(cell, grid)
    resolutions = resolutions or Resolutions()
    directory = cell.directory
    cell.file(STACK_LOCK)  # neither the folder nor the lock may be a link
    directory.mkdir(parents=True, exist_ok=True)
    stack_key = stack_fingerprint(cell, grid)
    stack_text = with_header(
        stack_key,
        resolutions.answer(
            stack_key, lambda: _compile(cell, grid, stack_requirements(cell), stack_overrides(cell), None)
        ),
    )
    stack = Lockfile(directory / STACK_LOCK, None, parse_lock(stack_text, directory / STACK_LOCK), text=stack_text)
    verify_stack(cell, stack)
    written = [_write(directory / STACK_LOCK, stack_text)]
    extras = flavor_requirements(cell)
    flavor_path = cell.file(FLAVOR_LOCK)
    if extras:
        flavor_key = flavor_fingerprint(cell, grid, stack_text)
        body = resolutions.answer(flavor_key, lambda: _compile(cell, grid, extras, [], stack_text))
        flavor_text = with_header(flavor_key, body)
        flavor_lock = Lockfile(flavor_path, None, parse_lock(flavor_text, flavor_path), text=flavor_text)
        verify_flavor(cell, stack, flavor_lock)
        written.append(_write(flavor_path, flavor_text))
    elif flavor_path.exists():
        flavor_path.unlink()
    return written


def lock_cells(
    cells: list[Cell], grid: Matrix, jobs: int = 4, resolutions: Resolutions | None = None
) -> Iterator[tuple[Cell, list[Path] | UserError]]:
    """Lock cells concurrently (each writes only its own directory), each distinct set of
    inputs resolved once; yields each outcome in order."""
    shared = resolutions or Resolutions()

    def attempt(cell: Cell) -> list[Path] | UserError:
        try:
            return lock_cell(cell, grid, shared)
        except UserError as error:
            return error

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        yield from zip(cells, pool.map(attempt, cells), strict=True)


def _write(path: Path, text: str) -> Path:
    confined.write_text(path, text)
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
