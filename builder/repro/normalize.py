"""Bit-for-bit reproducible images: normalize a built image (build/twice.py proves it by
building twice, repro/verify.py compares the two).

The engine's classic builder stamps the build time on every file it writes and on the
config. Most of that is undone inside the build: every rendered RUN step ends with
settle-layer.sh (mtimes clamped to SOURCE_DATE_EPOCH, logs, caches and /tmp emptied), and
the engine then writes such a layer the same way every time (directory order, numeric
times, root owners). The rendered images have no COPY step, so when the engine's history shows
every layer came from such a RUN, only the config is rewritten: rebuilt from inspect and
history (`config_from_engine`), loaded with no layer. Otherwise (a Dockerfile of another
shape), one streaming pass over `docker save` checks each layer entry by entry. Settled
layers are kept byte for byte; an unsettled one (a COPY step stamps the build time on the
directories it writes into) is rewritten: entries sorted by name, mtimes clamped, numeric
owners, hard links kept valid, volatile files dropped. The
config gets fixed times and loses the fields that name the build host, and the result is
loaded back under the same tag, sending the engine only the layers it does not have.
Bytecode is already deterministic: under SOURCE_DATE_EPOCH py_compile writes hash-based .pyc.

Everything streams through files on disk: a layer of several GB is never held in memory.
A rewritten layer's file manifest (path, type, mode, size, sha256) is kept (repro/manifests.py)
to name the paths that differ between two builds.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import docker

from builder.engine import archive
from builder.repro import manifests
from builder.repro.layers import normalize_config, normalize_layer, unsettled

Report = Callable[[str], None]
# Layers up to this size are kept aside while scanning, so that rewriting the small layers a
# build leaves unsettled (its COPY steps, last in the rendered images) needs no second pass.
SMALL_LAYER = 64 << 20


def _mapping_file() -> Path:
    return manifests.cache_dir() / "normalized.json"


def _known_normalized(engine: docker.DockerClient, raw_id: str) -> str | None:
    path = _mapping_file()
    mapping = json.loads(path.read_text()) if path.exists() else {}
    known = mapping.get(raw_id)
    if known:
        try:
            engine.images.get(known)
            return str(known)
        except docker.errors.ImageNotFound:
            return None
    return None


def _remember(raw_id: str, normalized_id: str) -> None:
    path = _mapping_file()
    mapping = json.loads(path.read_text()) if path.exists() else {}
    mapping[raw_id] = normalized_id
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(mapping, indent=1))
    os.replace(temporary, path)


@dataclass
class LayerScan:
    member: str  # its name in the `docker save` archive
    problem: str | None  # the first unsettled entry, None when the layer is settled
    copy: Path | None = None  # the layer as saved, when it was kept aside


def _scan_layer(handle: IO[bytes], epoch: int, copy: IO[bytes] | None) -> str | None:
    source: IO[bytes] = io.BufferedReader(archive.Tee(handle, copy.write), buffer_size=1 << 20) if copy else handle
    problem = None
    with tarfile.open(fileobj=source, mode="r|") as layer:
        for info in layer:
            problem = problem or unsettled(info, epoch)
    archive.read_to_end(source)
    return problem


@dataclass
class SavedImage:
    config: dict[str, Any]
    layers: list[LayerScan]  # in the image's order


def _scan_image(
    engine: docker.DockerClient, image_id: str, epoch: int, workdir: Path, keep_aside: Callable[[str, int], bool]
) -> SavedImage:
    """One pass over `docker save`: which layers are settled, keeping aside those asked for."""
    kept: list[Path] = []

    def scan(name: str, size: int, handle: IO[bytes]) -> LayerScan:
        if not keep_aside(name, size):
            return LayerScan(name, _scan_layer(handle, epoch, None))
        copy = workdir / f"raw-{len(kept)}.tar"
        kept.append(copy)
        with copy.open("wb") as sink:
            return LayerScan(name, _scan_layer(handle, epoch, sink), copy)

    config, scans = archive.scan_saved(engine, image_id, scan)
    return SavedImage(config, scans)


# How a RUN step of the rendered Dockerfiles ends (templates/partials/settle.j2): such a layer is
# settled when the engine writes it.
SETTLED_RUN_END = "&& sh /opt/torch-images/settle-layer.sh"
NOP = "#(nop) "


def _makes_layer(created_by: str) -> bool:
    """Whether a classic-builder history entry made a layer: RUN, COPY and ADD do; the other
    instructions (`#(nop)` ENV, LABEL, ARG, CMD ...) are `empty_layer` entries."""
    if NOP not in created_by:
        return True
    return created_by.split(NOP, 1)[1].lstrip().startswith(("COPY ", "ADD "))


def config_from_engine(engine: docker.DockerClient, image_id: str, keep: int) -> dict[str, Any] | None:
    """The image's config as `docker save` would give it, rebuilt from the engine's inspect and
    history answers, when every layer above the first `keep` came from a RUN step that ended
    with settle-layer.sh; None otherwise (a COPY step, or a history that does not add up).

    The fields normalization keeps are all there: inspect's Config is the config's `config`
    (plus `Image`, which normalization drops), and the history's instructions say which entries
    made no layer. A test checks the rebuilt config of a normalized image hashes to its ID."""
    attrs = engine.api.inspect_image(image_id)
    diff_ids: list[str] = attrs["RootFS"]["Layers"]
    history = list(reversed(engine.api.history(image_id)))  # the API lists the newest first
    layered = [entry for entry in history if _makes_layer(entry["CreatedBy"])]
    if len(layered) != len(diff_ids):
        return None
    if not all(entry["CreatedBy"].rstrip().endswith(SETTLED_RUN_END) for entry in layered[keep:]):
        return None
    config: dict[str, Any] = {"architecture": attrs["Architecture"], "os": attrs["Os"], "config": attrs["Config"]}
    if attrs.get("Variant"):
        config["variant"] = attrs["Variant"]
    config["history"] = [
        {
            "created_by": entry["CreatedBy"],
            **({} if _makes_layer(entry["CreatedBy"]) else {"empty_layer": True}),
            **({"comment": entry["Comment"]} if entry.get("Comment") else {}),
        }
        for entry in history
    ]
    config["rootfs"] = {"type": "layers", "diff_ids": diff_ids}
    return config


def normalize_image(
    engine: docker.DockerClient, reference: str, epoch: int, keep: int = 0, report: Report = print
) -> str:
    """Normalize the image tagged `reference` and move the tag to the result; returns its ID.

    The first `keep` layers (the base image's) are inputs and stay as they are. Of the others,
    a settled layer (see `unsettled`) is kept byte for byte; the first unsettled one and every
    layer above it go back to the engine, the unsettled ones rewritten. The rendered images
    end every RUN with settle-layer.sh and put their COPY layers last, so only those few small
    layers are rewritten and `docker load` skips every layer the engine already has.
    """
    raw = engine.images.get(reference)
    known = _known_normalized(engine, raw.id)
    if known:
        engine.images.get(known).tag(*reference.rsplit(":", 1))
        return known
    report(f"normalizing {reference}")
    diff_ids: list[str] = raw.attrs["RootFS"]["Layers"]
    settled = config_from_engine(engine, raw.id, keep)
    if settled is not None:  # every layer as the engine wrote it: only the config changes
        config_bytes = normalize_config(settled, diff_ids, epoch)
        loaded = archive.load(engine, config_bytes, [(d, None) for d in diff_ids], reference, epoch)
        _remember(raw.id, loaded[0].id)
        return str(loaded[0].id)
    with tempfile.TemporaryDirectory(dir=manifests.cache_dir()) as scratch:
        workdir = Path(scratch)
        saved = _scan_image(engine, raw.id, epoch, workdir, lambda _, size: size <= SMALL_LAYER)
        start = next((i for i, scan in enumerate(saved.layers) if i >= keep and scan.problem), len(diff_ids))
        needed = {scan.member for scan in saved.layers[start:]}
        if any(scan.copy is None for scan in saved.layers[start:]):
            report(f"layer {start + 1} is not settled ({saved.layers[start].problem}): rewriting the layers above it")
            saved = _scan_image(engine, raw.id, epoch, workdir, lambda member, _: member in needed)
        layers: list[tuple[str, Path | None]] = []  # (diff_id, file to load, or None: the engine has it)
        for index, scan in enumerate(saved.layers):
            if index < start:
                layers.append((diff_ids[index], None))
            elif scan.problem is None:
                assert scan.copy is not None
                layers.append((diff_ids[index], scan.copy))
            else:
                assert scan.copy is not None
                with scan.copy.open("rb") as source:
                    diff_id, path, files = normalize_layer(source, epoch, workdir)
                manifests.save_manifest(diff_id, files)
                layers.append((diff_id, path))
        config_bytes = normalize_config(saved.config, [d for d, _ in layers], epoch)
        loaded = archive.load(engine, config_bytes, layers, reference, epoch)
    normalized_id: str = loaded[0].id
    _remember(raw.id, normalized_id)
    return normalized_id
