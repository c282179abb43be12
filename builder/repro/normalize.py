"""The builder owns its image bytes: a built image rewritten into the canonical encoding, on any engine.

The engine builds; its layers hold the right files with the engine's own tar encoding and entry
set (engine/canonical.py says how they differ). After the build, one pass over `docker save`
(Docker's own format or an OCI layout, gzip-compressed blobs too) rewrites every layer in the
canonical encoding, headers only, the file contents copied through, and the config is made
from the builder's own fields: its history comes from the Dockerfile, not from how an engine
words it. The result goes back under the same tag as a complete archive (every image store
accepts one), and its image ID is the sha256 of the builder's config bytes on every engine.

The RUN steps themselves keep the tree the same from build to build: every rendered RUN ends
with settle-layer.sh (mtimes clamped to SOURCE_DATE_EPOCH; logs, caches and /tmp emptied), and
bytecode is written hash-based under SOURCE_DATE_EPOCH.

Everything streams through files on disk: a layer of several GB is never held in memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import docker
import docker.errors
import docker.models.images

from builder import times
from builder.digests import canonical_json
from builder.engine import archive, canonical, contentstore, ids, layerdirs
from builder.errors import UserError
from builder.repro import manifests
from builder.steps import Report

LAYER_INSTRUCTIONS = ("RUN", "COPY", "ADD")
# The config's `config` fields an image carries; everything else there describes the build host
# or the engine (Hostname, Image, the container's stdin settings) and is left out.
KEPT_CONFIG = ("User", "ExposedPorts", "Env", "Cmd", "Healthcheck", "Volumes", "WorkingDir", "Entrypoint",
               "OnBuild", "Labels", "StopSignal", "Shell")  # fmt: skip


def _mapping_file() -> Path:
    return manifests.cache_dir() / "normalized.json"


def _read_mapping(path: Path) -> dict[str, str]:
    """The cache's raw -> normalized mapping; a link, or anything but a JSON object, is none."""
    try:
        loaded = json.loads(path.read_text()) if path.is_file() and not path.is_symlink() else {}
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in loaded.items() if isinstance(v, str)} if isinstance(loaded, dict) else {}


def _known_normalized(engine: docker.DockerClient, raw: docker.models.images.Image) -> str | None:
    """The normalized image the cache remembers for this raw build, when the engine still has it
    and it carries the raw image's labels (its build ID among them): the mapping is a cache entry,
    and one pointed at another image is not taken on its word."""
    known = _read_mapping(_mapping_file()).get(str(raw.id))
    if not known:
        return None
    try:
        image = engine.images.get(known)
    except docker.errors.ImageNotFound:
        return None
    labels = (image.attrs.get("Config") or {}).get("Labels")
    return str(image.id) if labels and labels == (raw.attrs.get("Config") or {}).get("Labels") else None


def _remember(raw_id: str, normalized_id: str) -> None:
    path = _mapping_file()
    mapping = _read_mapping(path)
    mapping[raw_id] = normalized_id
    temporary = path.with_suffix(f".{os.getpid()}.tmp")  # two processes at once never share one
    temporary.write_text(json.dumps(mapping, indent=1))
    os.replace(temporary, path)


def dockerfile_steps(text: str) -> list[str]:
    """The instructions of a Dockerfile's last stage, as history lines: `INSTRUCTION arguments`,
    continuation lines joined, comments left out. The builder's history of an image, the same
    whichever builder (classic or BuildKit) ran the steps."""
    steps: list[str] = []
    pending: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        continued = line.endswith("\\")
        pending.append(line.removesuffix("\\").strip())
        if not continued:
            step = " ".join(part for part in pending if part)
            pending = []
            if step.split(None, 1)[0].upper() == "FROM":
                steps = []
            else:
                steps.append(step)
    return steps


def canonical_history(base_history: list[dict[str, Any]], steps: list[str], epoch: int) -> list[dict[str, Any]]:
    """The base's history entries (the builder's already), then one entry per Dockerfile step."""
    created = times.iso_utc(epoch)
    history = [
        {
            "created": created,
            "created_by": entry.get("created_by", ""),
            **({"empty_layer": True} if entry.get("empty_layer") else {}),
        }
        for entry in base_history
    ]
    for step in steps:
        makes_layer = step.split(None, 1)[0].upper() in LAYER_INSTRUCTIONS
        history.append({"created": created, "created_by": step, **({} if makes_layer else {"empty_layer": True})})
    return history


def canonical_config(
    engine_config: dict[str, Any], diff_ids: list[str], history: list[dict[str, Any]], epoch: int
) -> bytes:
    """The image config, the builder's: the fields an image carries, from the engine's config,
    with fixed times, the builder's history and the canonical diff IDs."""
    inner = engine_config.get("config") or {}
    config: dict[str, Any] = {
        "architecture": engine_config.get("architecture", ""),
        "os": engine_config.get("os", ""),
        "created": times.iso_utc(epoch),
        "config": {key: inner[key] for key in KEPT_CONFIG if inner.get(key) not in (None, "", [], {})},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": history,
    }
    if engine_config.get("variant"):
        config["variant"] = engine_config["variant"]
    return canonical_json(config)


def base_history(engine: docker.DockerClient, base_reference: str) -> list[dict[str, Any]]:
    """The base image's history entries, oldest first: the builder bootstraps every base, one
    history entry per layer (engine/archive.image_config)."""
    return [{"created_by": entry.get("CreatedBy", "")} for entry in reversed(engine.api.history(base_reference))]


@dataclass
class Pass:
    """What the pass after the build did, for the bench and the build summary."""

    image_id: str = ""
    seconds: dict[str, float] = field(default_factory=dict)  # save (where it ran), rewrite, load
    dropped: int = 0  # entries that changed nothing (unchanged directories, empty opaque markers)
    source: str = "docker save"  # where the engine's layers were read


def _spool_saved(engine: docker.DockerClient, raw_id: str, workdir: Path) -> tuple[dict[str, Any], list[Path]]:
    """`docker save`'s layers as uncompressed files, in the image's order (an OCI layout saves its
    blobs in digest order, and a layer's canonical form depends on the layers below it)."""
    count = 0

    def spool(_: str, __: int, handle: IO[bytes]) -> Path:
        nonlocal count
        path = workdir / f"saved-{count}.tar"
        count += 1
        with path.open("wb") as sink:
            shutil.copyfileobj(handle, sink, 1 << 20)
        return path

    return archive.scan_saved(engine, raw_id, spool)


@dataclass(frozen=True)
class LayerSource:
    """One of the engine's layers and how it is read: as a tar (a blob of the content store, or a
    spool file of ours, removed once read: the disk holds one copy of the image, not two), or
    from the folder of its files."""

    tar: Callable[[], IO[bytes]] | None = None
    spooled: Path | None = None
    folder: layerdirs.LayerFolder | None = None

    def rewrite(self, target: Path, lower: canonical.LowerTree, epoch: int) -> canonical.CanonicalLayer:
        if self.folder is not None:
            return canonical.rewrite_gathered(self.folder.gathered(epoch), target, lower)
        assert self.tar is not None, "a layer source is a tar or a folder"
        result = canonical.rewrite_layer(self.tar, target, lower, epoch)
        if self.spooled is not None:
            self.spooled.unlink()
        return result


def _inspected_config(engine: docker.DockerClient, raw_id: str) -> dict[str, Any]:
    """The fields of the engine's config the builder's config takes (canonical_config), from the
    engine's answer to `inspect`: the same values its config holds, without saving the image."""
    attrs = engine.api.inspect_image(raw_id)
    config: dict[str, Any] = {"architecture": attrs.get("Architecture", ""), "os": attrs.get("Os", "")}
    config["config"] = attrs.get("Config") or {}
    if attrs.get("Variant"):
        config["variant"] = attrs["Variant"]
    return config


def _spooled(path: Path) -> LayerSource:
    return LayerSource(tar=lambda: path.open("rb"), spooled=path)


def _rewrite(
    sources: list[LayerSource],
    workdir: Path,
    epoch: int,
    stop: threading.Event,
    made: Callable[[tuple[str, Path]], None],
) -> int:
    """Each layer, in the image's order, rewritten into a canonical file and handed to `made`;
    returns the entries dropped as changing nothing."""
    lower = canonical.LowerTree()
    dropped = 0
    for index, source in enumerate(sources):
        if stop.is_set():
            raise UserError("the load of the canonical image stopped; its rewrite stopped with it")
        target = workdir / f"canonical-{index}.tar"
        result = source.rewrite(target, lower, epoch)
        made((result.diff_id, target))
        dropped += result.dropped
    return dropped


def _engine_layers(
    engine: docker.DockerClient, raw_id: str, workdir: Path, done: Pass
) -> tuple[dict[str, Any], list[LayerSource]]:
    """The engine's config and a way to open each of its layers: from containerd's content store
    where the engine keeps its images there and the builder may read it (engine/contentstore.py),
    else spooled from `docker save`."""
    blobs = contentstore.locate(engine)
    stored = contentstore.read_image(engine, raw_id, blobs) if blobs is not None else None
    if stored is not None:
        done.source = "containerd's content store"
        return json.loads(stored.config), [LayerSource(tar=blob.open) for blob in stored.layers]
    folders = layerdirs.locate(engine, raw_id)
    if folders is not None:
        done.source = "the overlay2 driver's layer folders"
        return _inspected_config(engine, raw_id), [LayerSource(folder=f) for f in folders]
    mark = time.monotonic()
    engine_config, saved = _spool_saved(engine, raw_id, workdir)
    done.seconds["save"] = time.monotonic() - mark
    return engine_config, [_spooled(path) for path in saved]


def normalize_image(
    engine: docker.DockerClient,
    reference: str,
    epoch: int,
    steps: list[str],
    base_reference: str,
    report: Report = print,
) -> Pass:
    """Rewrite the image tagged `reference` into the canonical encoding and move the tag to it;
    `steps` are the Dockerfile's instructions after FROM (dockerfile_steps) and `base_reference`
    the image it was built FROM. Returns the pass, whose image_id is the canonical config's digest."""
    done = Pass()
    raw = engine.images.get(reference)
    known = _known_normalized(engine, raw)
    if known:
        engine.images.get(known).tag(*reference.rsplit(":", 1))
        done.image_id = ids.config_digest(engine, known)
        return done
    report(f"normalizing {reference}")
    history = canonical_history(base_history(engine, base_reference), steps, epoch)
    layered = sum(1 for entry in history if not entry.get("empty_layer"))
    with tempfile.TemporaryDirectory(dir=manifests.cache_dir()) as scratch:
        workdir = Path(scratch)
        engine_config, sources = _engine_layers(engine, raw.id, workdir, done)
        report(f"normalizing {reference}: the engine's layers read from {done.source}")
        if layered != len(sources):
            raise UserError(
                f"{reference}: the Dockerfile's steps make {layered} layers with the base's, the engine's image has "
                f"{len(sources)}; a step that changed nothing makes no layer with BuildKit: make it change a file"
            )
        configs: list[bytes] = []

        def config_of(diff_ids: list[str]) -> bytes:
            configs.append(canonical_config(engine_config, diff_ids, history, epoch))
            return configs[-1]

        mark = time.monotonic()
        with _rewriting(sources, workdir, epoch, done) as layers:
            loaded = archive.load_as_made(engine, layers, config_of, reference, epoch)
        read = f"read from {done.source}, " if done.source != "docker save" else ""
        done.seconds[f"{read}rewrite and load, overlapped"] = time.monotonic() - mark
    done.image_id = ids.remember(loaded[0].id, configs[-1])
    _remember(raw.id, loaded[0].id)
    return done


@contextlib.contextmanager
def _rewriting(
    sources: list[LayerSource], workdir: Path, epoch: int, done: Pass
) -> Iterator[Iterator[tuple[str, Path | None]]]:
    """The canonical layers, each handed on as soon as it is written: the rewrite runs in a
    thread of its own, so the engine reads one layer while the next is rewritten. A failure on
    either side stops the other."""
    made: queue.Queue[tuple[str, Path] | BaseException | None] = queue.Queue(maxsize=2)
    stop = threading.Event()

    def rewrite_all() -> None:
        try:
            done.dropped = _rewrite(sources, workdir, epoch, stop, made.put)
            made.put(None)
        except BaseException as error:  # handed to the reader
            made.put(error)

    def handed_on() -> Iterator[tuple[str, Path | None]]:
        while (item := made.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item

    worker = threading.Thread(target=rewrite_all, daemon=True)
    worker.start()
    try:
        yield handed_on()
    finally:
        stop.set()
        while worker.is_alive():  # let a rewrite blocked on a full queue see the stop
            with contextlib.suppress(queue.Empty):
                made.get(timeout=0.1)
        worker.join()
