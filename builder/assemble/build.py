"""Build cells on the Docker engine through the Docker SDK.

Before anything reaches the engine, the cell's locks and rendered Dockerfile must match the
matrix, and every wheel must be in the wheelhouse with its locked hash: a stale lock or a
bad file stops the build with nothing built. The build runs with host networking so RUN
steps reach the wheelhouse on loopback; wheel files never enter the build context.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors
import docker.models.images

from builder import confined, jsonread, paths, times
from builder.assemble import backends, size
from builder.assemble.backends import BuildRequest
from builder.assemble.context import build_id
from builder.config import grammar, layout
from builder.config import platform as platforms
from builder.engine import bases, daemon, ids
from builder.errors import UserError
from builder.lock import inputs
from builder.lock.inputs import CellLocks
from builder.plan.cell import Cell
from builder.plan.matrix import Matrix
from builder.render import render
from builder.repro import normalize as repro
from builder.repro import recorded
from builder.steps import Report, Steps
from builder.wheelhouse import aptrepo, served, wheelhouse, wheelserver

BUILD_ID_LABEL = "io.torch-images.build-id"
BUILD_CACHE_REPOSITORY = "torch-images/build-cache"


class BuildState(str, enum.Enum):
    """Where a cell's build ended. Notes (the recorded ID, the self-test's verdict) are kept
    apart, so that adding one never changes the state a later step decides on."""

    PENDING = "pending"
    BUILT = "built"
    UNCHANGED = "unchanged"  # the image with this build ID was in the engine already
    IN_REGISTRY = "in registry"  # `build --skip-existing`: this build ID is published; not built
    FAILED = "failed"
    NOT_RECORDED = "failed: not the recorded image ID"
    OVER_BUDGET = "failed: over budget"
    SELFTEST_FAILED = "failed: self-test"

    @property
    def failed(self) -> bool:
        return self.value.startswith("failed")


@dataclass
class BuildResult:
    cell: str
    reference: str
    image_id: str = ""
    size_bytes: int = 0
    seconds: float = 0.0
    state: BuildState = BuildState.PENDING
    notes: list[str] = field(default_factory=list)  # said after the state: "recorded ID", the self-test's verdict
    detail: str = ""
    build_id: str = ""
    base_id: str = ""  # the config digest of the base it was built on
    intermediate: str = ""  # the engine's image before normalization, when it differs from the result
    layers: list[tuple[str, int]] = field(default_factory=list)  # (step, bytes) of each layer, bottom first
    recorded: bool | None = None  # whether the image is images/<cell>/image-id (None: none recorded)
    # Seconds per phase, in order: base (found or bootstrapped), inputs (wheels and .debs fetched
    # and verified), engine (the build itself), normalize. What the benchmarks break a build into.
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def has_image(self) -> bool:
        """Built, or found unchanged: there is an image to compare and self-test."""
        return self.state in (BuildState.BUILT, BuildState.UNCHANGED)

    @property
    def status(self) -> str:
        """The state and its notes, as the summary table shows them."""
        return ", ".join([self.state.value, *self.notes])


def local_reference(grid: Matrix, cell: Cell) -> str:
    """The engine's tag for the cell's image: its versioned tag, plus `-<arch>` off linux/amd64
    (the platforms of a multi-arch tag are separate images in one engine)."""
    return f"{grid.spec.repository}:{cell.tag + platforms.of(cell.platform).suffix}"  # it fits: plan.MAX_OWN_TAG


def preflight(cell: Cell, grid: Matrix) -> CellLocks:
    """The cell's locks, read once; refuses a cell whose locks or Dockerfile do not match matrix.yaml."""
    locks = inputs.read(cell, grid)
    problems = [*locks.problems, *render.drift_of(locks, grid)]
    if problems:
        raise UserError(problems[0])
    return locks


def _existing_build(
    engine: docker.DockerClient, reference: str, identity: str, normalized_at: str | None
) -> docker.models.images.Image | None:
    """The image tagged `reference` if it was built from exactly these inputs (and normalized,
    when normalized_at names the fixed creation time a normalized image carries)."""
    try:
        image = engine.images.get(reference)
    except docker.errors.ImageNotFound:
        return None
    if (image.labels or {}).get(BUILD_ID_LABEL) != identity:
        return None
    if normalized_at is not None and not str(image.attrs.get("Created", "")).startswith(normalized_at):
        return None
    return image


def offer_inputs(house: wheelhouse.Wheelhouse, grid: Matrix, locks: CellLocks) -> None:
    """Fetch and verify everything the cell's RUN steps read, and let the wheelhouse server offer
    it: the wheels and their pages, the helper scripts, the apt repositories of its .debs."""
    assert locks.debian is not None  # preflight refuses a cell without its debian.lock
    for packages in (locks.debian.common, locks.flavor_step_pins):
        aptrepo.publish(house, locks.cell.base, locks.debian.files_of(packages))
    house.prepare(locks.cell, grid, locks.python_locks)
    house.publish_files([*served.SUPPORT_FILES, locks.cell.file("spec.json")])


def cell_base(
    engine: docker.DockerClient,
    grid: Matrix,
    locks: CellLocks,
    report: Report = print,
    house: wheelhouse.Wheelhouse | None = None,
    slim: bool = True,
) -> str:
    """The engine's tag of the base the cell builds on: bootstrapped from debian.lock's `base`
    packages (fetched into the cache, or already there) when the engine lacks it, leaving out
    what data/layout.yaml's dpkg rules leave out of every image (slim=False keeps it all: the
    size benchmark's stand-in for the distro's own full image)."""
    cell, pins = locks.cell, locks.debian
    assert pins is not None  # preflight refuses a cell without its debian.lock
    files = pins.files_of(pins.base)
    where = served.apt_repository(files)
    dpkg, key = _locked_base_key(locks, slim)
    found = bases.present_locked(engine, cell.base, key)
    if found is not None:
        return found
    house = house or wheelhouse.Wheelhouse(report=report)
    house.report = report  # its lines (a wait for the wheelhouse address) are this build's
    report(f"{cell.base.name}: fetching and verifying its {len(files)} locked packages")
    aptrepo.publish(house, cell.base, files)
    with wheelserver.serve(house, grid.spec.wheelhouse.listen) as url:
        names = tuple(pin.split("=", 1)[0] for pin in pins.base)
        packages = bases.LockedPackages(names, aptrepo.sources_line(url, where), key, dpkg)
        return bases.bootstrap_locked(engine, cell.base, packages, grid.spec.source_date_epoch, report)


def _locked_base_key(locks: CellLocks, slim: bool = True) -> tuple[tuple[str, ...], str]:
    """The dpkg rules the base is bootstrapped with, and the key that names its package set and those
    rules (the base's engine tag and cached rootfs end with it)."""
    assert locks.debian is not None  # preflight refuses a cell without its debian.lock
    where = served.apt_repository(locks.debian.files_of(locks.debian.base))
    dpkg = layout.load().dpkg_for(None) if slim else ()
    key = where.rstrip("/").rsplit("/", 1)[-1]
    if dpkg:
        key += "-" + hashlib.sha256("\n".join(dpkg).encode()).hexdigest()[:8]
    return dpkg, key


def locked_base_tag(locks: CellLocks) -> str:
    """The engine tag of the base the cell builds on (bootstrapped from its locked packages)."""
    return bases.locked_tag(locks.cell.base, _locked_base_key(locks)[1])


def cell_build_id(
    engine: docker.DockerClient,
    grid: Matrix,
    locks: CellLocks,
    report: Report = print,
    house: wheelhouse.Wheelhouse | None = None,
) -> tuple[str, str]:
    """The base the cell builds on (obtained if missing) and the cell's build ID, without building.

    A base that is not the one the cell's record was made on (images/<cell>/image-id's `base`
    line, for the same locked packages) is never built on: one from the engine or the cache (a
    tag or a rootfs changed since it was made) is removed and bootstrapped again from the locked
    packages; one freshly bootstrapped that still differs stops the build."""
    cell = locks.cell
    base_reference = cell_base(engine, grid, locks, report, house)
    base_id = ids.config_digest(engine, base_reference)
    wrong = recorded.wrong_base(cell, base_id, lambda base: build_id(cell, base))
    if wrong is not None:
        report(f"{cell.name}: {wrong}: removing it from the engine and the cache, and bootstrapping it again")
        bases.forget_locked(engine, base_reference)
        base_reference = cell_base(engine, grid, locks, report, house)
        base_id = ids.config_digest(engine, base_reference)
        wrong = recorded.wrong_base(cell, base_id, lambda base: build_id(cell, base))
        if wrong is not None:
            raise UserError(f"{cell.name}: bootstrapped again from its locked packages, {wrong}; nothing was built")
    return base_reference, build_id(cell, base_id)


@dataclass(frozen=True)
class BuildOptions:
    """How a build runs, chosen once (by the command line or a caller) and handed down whole."""

    no_cache: bool = False  # build every step again, and never take an image found unchanged
    normalize: bool = True  # rewrite the engine's image into the builder's canonical bytes
    backend: str = "sdk"  # "sdk" (the classic builder through the Docker SDK) or "buildkit"
    published: Callable[[str], bool] | None = None  # `build --skip-existing`: is this build ID in the registry?
    reference: str | None = None  # the engine tag to build under (default: the cell's own, local_reference)


def build_cell(
    engine: docker.DockerClient,
    grid: Matrix,
    locks: CellLocks,
    house: wheelhouse.Wheelhouse,
    report: Report,
    options: BuildOptions = BuildOptions(),
) -> BuildResult:
    """Build one cell. An image already tagged options.reference with the same build ID is left as it
    is (status "unchanged") unless options.no_cache, and one whose build ID is options.published (in
    the registry: `build --skip-existing`) is not built at all (status "in registry"). The engine's
    pre-normalization image is returned as `intermediate` for the caller to remove (see
    discard_intermediates). `locks` are the cell's inputs as `preflight` read and checked them,
    once per cell and run: nothing here reads them again. Each phase is a step (builder/steps.py):
    its line, its seconds in `result.phases`, and a fold in a CI log."""
    steps = Steps.of(report)
    began = steps.clock()
    result = _build_cell(engine, grid, locks, house, steps, options)
    result.seconds = steps.clock() - began
    return result


def _build_cell(
    engine: docker.DockerClient,
    grid: Matrix,
    locks: CellLocks,
    house: wheelhouse.Wheelhouse,
    steps: Steps,
    options: BuildOptions,
) -> BuildResult:
    cell = locks.cell
    reference = options.reference or local_reference(grid, cell)
    result = BuildResult(cell.name, reference)
    with steps.step(f"{cell.name}: the base image", "base", result.phases):
        base_reference, result.build_id = cell_build_id(engine, grid, locks, steps, house)
        result.base_id = ids.config_digest(engine, base_reference)
    if options.published is not None and options.published(result.build_id):
        steps(f"{cell.name}: build ID {result.build_id[:12]} is already in the registry; not built")
        result.state = BuildState.IN_REGISTRY
        record_in_registry(cell, result.build_id)
        return result
    normalized_at = times.iso_utc(grid.spec.source_date_epoch).removesuffix("Z") if options.normalize else None
    existing = None if options.no_cache else _existing_build(engine, reference, result.build_id, normalized_at)
    if existing is not None:
        steps(f"{cell.name}: unchanged since its last build (build ID {result.build_id[:12]})")
        result.image_id, result.size_bytes, result.state = (
            ids.config_digest(engine, reference),
            int(existing.attrs["Size"]),
            BuildState.UNCHANGED,
        )
        return _within_budget(engine, grid, cell, result)
    house.report = steps
    with steps.step(f"{cell.name}: fetching and verifying wheels", "inputs", result.phases):
        offer_inputs(house, grid, locks)
    epoch = grid.spec.source_date_epoch
    request = BuildRequest(cell, reference, base_reference, epoch, options.no_cache, {BUILD_ID_LABEL: result.build_id})
    step_images: list[str] = []
    tagged_before = _tagged(engine, reference)
    try:
        with (
            steps.step(f"{cell.name}: the engine's steps ({options.backend})", "engine", result.phases),
            wheelserver.serve(house, grid.spec.wheelhouse.listen),
        ):
            if options.backend == "buildkit":
                error = backends.buildkit_build(engine, request, steps)
            else:
                error = backends.classic_build(engine, request, steps, step_images)
    except BaseException:
        # Interrupted (SIGINT, SIGTERM) or the engine gone: the steps that finished are removed as
        # a failed build's are, so a cancelled CI job leaves no gigabytes of step images behind.
        _remove_steps(engine, step_images)
        raise
    if error:
        # The steps that succeeded are the engine's cache, removed with the run's others.
        result.intermediate = step_images[-1] if step_images else ""
        result.state, result.detail = BuildState.FAILED, error
        return result
    raw_id = engine.images.get(reference).id
    if options.normalize:
        steps_of_file = repro.dockerfile_steps(cell.file("Dockerfile").read_text())
        try:
            with steps.step(f"{cell.name}: the canonical pass", "normalize", result.phases):
                canonical = repro.normalize_image(engine, reference, epoch, steps_of_file, base_reference, steps)
        except UserError as refused:
            result.intermediate = _untag_raw(engine, reference, raw_id)
            result.state, result.detail = BuildState.FAILED, refused.line()
            return result
        except BaseException:
            # Interrupted in the canonical pass: the tag goes back to what it named before the
            # build (the engine moved it to the raw image, which nothing checked), and the raw
            # image goes with its steps.
            _put_tag_back(engine, reference, tagged_before)
            _remove_steps(engine, [*step_images, raw_id])
            raise
        result.phases.update({f"normalize.{name}": seconds for name, seconds in canonical.seconds.items()})
    image = engine.images.get(reference)
    if image.id != raw_id:
        result.intermediate = raw_id
    result.image_id, result.size_bytes = ids.config_digest(engine, reference), int(image.attrs["Size"])
    result.state = BuildState.BUILT
    record_builder(engine, result.image_id, options.backend)
    return _within_budget(engine, grid, cell, result)


MAX_BUILDER_NAME = 200


def _builder_record(image_id: str) -> Path:
    return paths.cache_dir("builds") / f"{image_id.removeprefix('sha256:')}.json"


def record_builder(engine: docker.DockerClient, image_id: str, backend: str) -> None:
    """Which engine and backend built `image_id` here (the builder's cache, `builds/`), for a
    rebuild's statement to name (`publish stage-rebuild`)."""
    name = daemon.description(engine) + (", BuildKit" if backend == "buildkit" else "")
    confined.write_text(_builder_record(image_id), json.dumps({"image_id": image_id, "builder": name}) + "\n")


def built_by(image_id: str) -> str | None:
    """The engine and backend that built `image_id` on this machine, or None where no build here
    recorded it (or the record is not one)."""
    path = _builder_record(image_id)
    if not path.is_file() or path.is_symlink():
        return None
    try:
        record = jsonread.loads(confined.read_bytes(path, 4096), str(path))
    except UserError:
        return None
    name = record.get("builder") if isinstance(record, dict) and record.get("image_id") == image_id else None
    ok = isinstance(name, str) and 0 < len(name) <= MAX_BUILDER_NAME and name.isprintable()
    return name if ok else None


STEPS_GONE_S = 60  # how long an interrupted build waits for its engine to let go of the step in flight


def _remove_steps(engine: docker.DockerClient, step_images: list[str]) -> None:
    """Remove the images an unfinished build's steps made, and any untagged step the engine
    committed after the last one the stream named, newest first; errors are not ours to raise here.

    After an interruption the engine is still stopping the step in flight (measured: a removal
    in the same second as the signal found the step's container being made, and the steps below
    it stayed), so what is left is tried again, twice a second, until it is gone or a minute passed."""
    if not step_images:
        return
    deadline = time.monotonic() + STEPS_GONE_S
    while left := _untagged_present(engine, [*_untagged_descendants(engine, step_images[-1]), *reversed(step_images)]):
        for image in left:
            with contextlib.suppress(docker.errors.APIError, OSError):
                engine.images.remove(image, force=True, noprune=False)
        if time.monotonic() > deadline:
            return
        time.sleep(0.5)


def _untagged_present(engine: docker.DockerClient, images: list[str]) -> list[str]:
    """Those of `images` the engine still holds and no tag names: a tagged image is someone's (the
    base a FROM names, say), never a step's."""
    present = []
    for image in images:
        with contextlib.suppress(docker.errors.APIError, OSError):
            if not engine.images.get(image).tags:
                present.append(image)
    return present


def _untagged_descendants(engine: docker.DockerClient, image: str) -> list[str]:
    """The untagged images made on top of `image`, deepest first (the classic builder records
    each step's parent)."""
    children: dict[str, list[str]] = {}
    tagged: set[str] = set()
    with contextlib.suppress(docker.errors.APIError, OSError):
        for listed in engine.images.list(all=True):
            children.setdefault(str(listed.attrs.get("ParentId", "")), []).append(str(listed.id))
            if listed.tags:
                tagged.add(str(listed.id))
    found: list[str] = []
    below = [image if image.startswith("sha256:") else _full_id(engine, image)]
    while below:
        parent = below.pop()
        for child in children.get(parent, []):
            if child not in tagged:
                found.append(child)
                below.append(child)
    return list(reversed(found))


def _full_id(engine: docker.DockerClient, short: str) -> str:
    try:
        return str(engine.images.get(short).id)
    except (docker.errors.APIError, OSError):
        return short


def contradicts_record(engine: docker.DockerClient, result: BuildResult, said: str) -> None:
    """A built image that is not its cell's recorded image ID from the same inputs: the build
    fails, and the image loses the cell's tag (a `publish` or `FROM` after it cannot pick it up);
    it goes with the run's other intermediates (`--keep-build-cache` keeps it to compare)."""
    result.state, result.detail = BuildState.NOT_RECORDED, said
    if result.intermediate:  # the raw image goes first, then the normalized one
        with contextlib.suppress(docker.errors.ImageNotFound, docker.errors.APIError):
            engine.images.remove(result.intermediate, force=False, noprune=False)
    result.intermediate = _untag_raw(engine, result.reference, engine.images.get(result.reference).id)


IN_REGISTRY_DIR = "in-registry"  # under the cache: the build ID `build --skip-existing` found published


def record_in_registry(cell: Cell, build_id: str) -> None:
    """Keep the build ID a build found in the registry, for the stage that follows it in the same
    job (publish stage): it reads it here instead of bootstrapping the base again to compute it."""
    (paths.cache_dir(IN_REGISTRY_DIR) / cell.name).write_text(build_id + "\n")


def recorded_in_registry(cell: Cell) -> str | None:
    """The build ID `build --skip-existing` last found published for the cell, if any."""
    path = paths.cache_dir(IN_REGISTRY_DIR) / cell.name
    text = confined.read_bytes(path, 256).decode(errors="replace").strip() if path.exists() else ""
    return text if grammar.BUILD_ID.matches(text) else None


def _tagged(engine: docker.DockerClient, reference: str) -> str | None:
    try:
        return str(engine.images.get(reference).id)
    except docker.errors.ImageNotFound:
        return None


def _put_tag_back(engine: docker.DockerClient, reference: str, image_id: str | None) -> None:
    """`reference` names `image_id` again (or nothing, where it named nothing); errors are not
    ours to raise here, on the way out of an interruption."""
    with contextlib.suppress(docker.errors.APIError, OSError):
        engine.api.remove_image(reference, noprune=True)
        if image_id:
            engine.images.get(image_id).tag(*reference.rsplit(":", 1))


def _untag_raw(engine: docker.DockerClient, reference: str, raw_id: str) -> str:
    """Take the cell's tag off the engine's image that the pass after the build failed on: it is
    not the product (nothing checked it). Returns what is left of it for discard_intermediates
    to remove with the run's other steps: the image, or its parent step where the tag was its
    only name (the engine deletes such an image with its tag)."""
    parent = str(engine.images.get(raw_id).attrs.get("Parent") or "")
    engine.api.remove_image(reference, noprune=True)
    try:
        engine.images.get(raw_id)
        return raw_id
    except docker.errors.ImageNotFound:
        return parent


def _within_budget(engine: docker.DockerClient, grid: Matrix, cell: Cell, result: BuildResult) -> BuildResult:
    """Record the layers' sizes; an image over its flavor's budget (matrix.yaml `budgets:`) fails."""
    result.layers = size.layer_sizes(engine, result.reference)
    budget = grid.spec.budgets.get(cell.flavor)
    problem = size.over_budget(engine, result.reference, cell.flavor, budget, result.layers) if budget else ""
    if problem:
        result.state, result.detail = BuildState.OVER_BUDGET, problem
    return result


def discard_intermediates(engine: docker.DockerClient, results: list[BuildResult]) -> None:
    """Remove the engine's pre-normalization images, with the step images only they use.

    They are the classic builder's cache: kept until every cell of one run is built, so cells
    that share steps (a runtime and its devel sibling) reuse them, then removed so that the
    engine holds only the images asked for. An unchanged cell needs no cache (its build ID
    matches); a changed one is built again from its base, with the wheels from the wheelhouse.
    """
    for result in results:
        if result.intermediate:
            # On the way out of a failure too: an engine that went away (OSError) is said by that failure.
            with contextlib.suppress(docker.errors.APIError, OSError):
                engine.images.remove(result.intermediate, force=False, noprune=False)
            result.intermediate = ""


def keep_intermediates(engine: docker.DockerClient, results: list[BuildResult]) -> list[str]:
    """Tag the pre-normalization images as torch-images/build-cache:<cell> (`build --keep-build-cache`)."""
    kept = []
    for result in results:
        if result.intermediate:
            engine.images.get(result.intermediate).tag(BUILD_CACHE_REPOSITORY, result.cell)
            kept.append(f"{BUILD_CACHE_REPOSITORY}:{result.cell}")
    return kept


def remove_image(engine: docker.DockerClient, reference: str) -> None:
    with contextlib.suppress(docker.errors.ImageNotFound):
        engine.images.remove(reference, force=True)
