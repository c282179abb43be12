"""CI's rebuild across two jobs, so that no job which builds holds a key (SLSA Build L3's shape).

`publish stage-rebuild --run ID`, in the rebuild job, after `build --no-cache --fresh-base` of
the cell on a fresh runner and only then a login: pushes this engine's image of the cell under
`<staging tag>.rebuild`, beside the staged one, signing nothing, and records which engine built
it (`<rebuild tag>.json`). Where its image ID is not the staged one, it still pushes (the evidence)
and names the first layer that differs, and exits 1.

`publish sign-rebuild --run ID`, in a job that runs no build code and no image and holds a
rebuilder's own key (TORCH_IMAGES_REBUILD_KEY, never the team's): reads both tags from the
registry, and where the rebuilt manifest's config digest is exactly the staged image ID, signs
a rebuild statement (SLSA's verification summary) about every staged form of that image. The
image IDs compared are the config digests the registry serves; the record only says which
engine the rebuild job ran on, as that job reported it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import docker

from builder import confined, jsonread, times
from builder.assemble import build
from builder.engine import daemon, ids
from builder.errors import UserError
from builder.oci.registry import IMAGE_TYPES, Manifest
from builder.plan.cell import Cell
from builder.publish import existing, provenance, publish, rebuild, staging, tags, trust
from builder.publish.publisher import Publisher
from builder.publish.verify import Reference
from builder.terminal import printable

RECORD_BYTES = 16 << 10
MAX_BUILDER = 200  # characters of the engine a rebuild record names


def rebuild_tag(publisher: Publisher, cell: Cell, run: str) -> str:
    """Where a run's rebuild of `cell` is pushed: beside its (gzip) staging tag."""
    staged = staging.staging_tag(publisher.grid, cell, run)
    return tags.exact(f"{staged}.rebuild", "the rebuild tag", "give a shorter --run")


def _image(publisher: Publisher, cell: Cell, tag: str, what: str) -> tuple[Manifest, str]:
    """The image manifest under `tag` and its image ID (the config digest the registry serves)."""
    manifest = publisher.registry.manifest(publisher.repository, tag)
    if manifest is None or manifest.media_type not in IMAGE_TYPES:
        raise UserError(f"{cell.name}: {tag} is not one image in {publisher.grid.spec.registry}; {what}")
    config = json.loads(manifest.body).get("config")
    digest = config.get("digest") if isinstance(config, dict) else None
    if not isinstance(digest, str) or not publisher.registry.is_digest(digest):
        raise UserError(f"{cell.name}: {tag} names no config digest; {what}")
    return manifest, digest


def stage_rebuild(publisher: Publisher, cells: list[Cell], run: str, record_dir: Path) -> list[str | None]:
    """Push each cell's image this engine built under its rebuild tag and record the engine;
    returns, per cell, None where its image ID is the staged one, else why not."""
    staging.check_run(run)
    engine, grid, report = publisher.images, publisher.grid, publisher.report
    results: list[str | None] = []
    for cell in cells:
        staged_tag = staging.staging_tag(grid, cell, run)
        staged, staged_id = _image(publisher, cell, staged_tag, "stage it first")
        local = build.local_reference(grid, cell)
        try:
            rebuilt_id = ids.config_digest(engine, local)
        except docker.errors.NotFound:
            raise UserError(
                f"{cell.name}: this engine holds no build of it; run `python -m builder build --no-cache --fresh-base "
                f"{cell.name}` first"
            ) from None
        tag = rebuild_tag(publisher, cell, run)
        if publisher.dry_run:
            same = "the staged one" if rebuilt_id == staged_id else f"not the staged {staged_id[7:19]}"
            report(f"dry run: would push {tag} (image {rebuilt_id[7:19]}, {same}) and record it; nothing was pushed")
            results.append(
                None if rebuilt_id == staged_id else f"rebuilt image {rebuilt_id[7:19]}, staged {staged_id[7:19]}"
            )
            continue
        digest = publish.push_engine_image(engine, publisher.registry, publisher.repository, local, tag, report)
        # the engine and backend this machine's build recorded (the image is this engine's)
        builder_name = build.built_by(rebuilt_id) or daemon.description(engine)
        record = {"tag": tag, "digest": digest, "cell": cell.name, "builder": builder_name}
        record_dir.mkdir(parents=True, exist_ok=True)
        confined.write_text(record_dir / f"{tag}.json", json.dumps(record, sort_keys=True) + "\n")
        if rebuilt_id == staged_id:
            report(f"{cell.name}: rebuilt image {rebuilt_id[7:19]} is the staged one; pushed as {tag} for sign-rebuild")
            results.append(None)
            continue
        why = f"rebuilt image {rebuilt_id[7:19]}, staged {staged_id[7:19]}"
        reference = Reference(grid.spec.registry, publisher.repository, staged_tag, staged.digest)
        found = rebuild.Rebuilt(rebuild.resolve(publisher.registry, reference), cell.name, rebuilt_id)
        rebuild.compare_layers(engine, publisher.registry, publisher.repository, found.published, local, found)
        where = f"layer {found.differing_layer + 1}" if found.differing_layer is not None else "no layer"
        report(printable(f"{cell.name}: {why}: the first that differs is {where}"))
        for line in found.paths + found.notes:
            report(printable(f"  {line}"))
        results.append(why)
    return results


def reported_builder(record_dir: Path, tag: str) -> str:
    """The engine the rebuild job says it built on (its record): a name in a statement, never
    what decides; a record that is not the rebuild job's is refused."""
    path = record_dir / f"{tag}.json"
    if not path.exists() and not path.is_symlink():
        raise UserError(f"--staged-record {record_dir}: no {path.name}; give the folder `publish stage-rebuild` wrote")
    record = jsonread.loads(confined.read_bytes(path, RECORD_BYTES), str(path))
    builder = record.get("builder") if isinstance(record, dict) and record.get("tag") == tag else None
    if not isinstance(builder, str) or not builder or len(builder) > MAX_BUILDER or not builder.isprintable():
        raise UserError(f"{path}: not a rebuild record of {tag}; write what `publish stage-rebuild` wrote")
    return builder


def sign_rebuilds(publisher: Publisher, cells: list[Cell], run: str, record_dir: Path) -> list[str]:
    """Sign, with a rebuilder's key, a rebuild statement about each staged form of each cell
    whose run's rebuild (in the registry) has exactly the staged image ID."""
    staging.check_run(run)
    signer = publisher.signer
    if signer is None:
        raise UserError(
            f"publish sign-rebuild signs with a rebuilder's own key: give it (--sign-key, or "
            f"{provenance.REBUILD_KEY_ENVIRONMENT})"
        )
    if publisher.key is not None and signer.public_key.keyid == publisher.key.keyid:
        raise UserError("the signing key is the team's; a rebuild counts only under a rebuilder's own key")
    said = []
    for cell in cells:
        tag = rebuild_tag(publisher, cell, run)
        gzip_manifest, image_id = _image(publisher, cell, staging.staging_tag(publisher.grid, cell, run), "stage it")
        rebuilt, rebuilt_id = _image(publisher, cell, tag, "run publish stage-rebuild first")
        if rebuilt_id != image_id:
            raise UserError(f"{cell.name}: the rebuild ({tag}) is image {rebuilt_id[7:19]}, the staged one "
                            f"{image_id[7:19]}: they disagree; nothing signed")  # fmt: skip
        engine = f"{reported_builder(record_dir, tag)}; CI run {run}, rebuilt as {rebuilt.digest[:19]}"
        signed = [_sign_form(publisher, cell, compression, run, image_id, engine)
                  for compression in publish.compressions(publisher.grid)]  # fmt: skip
        said.append(f"{cell.name}: the rebuild gave image {image_id[7:19]}; {', '.join(signed)} "
                    f"({gzip_manifest.digest[:19]})")  # fmt: skip
    return said


def _sign_form(publisher: Publisher, cell: Cell, compression: str, run: str, image_id: str, engine: str) -> str:
    signer = publisher.signer
    assert signer is not None
    tag = staging.staging_tag(publisher.grid, cell, run, compression)
    manifest, form_id = _image(publisher, cell, tag, "stage it")
    if form_id != image_id:
        raise UserError(f"{cell.name}: {tag} is image {form_id[7:19]}, not {image_id[7:19]}; nothing signed for it")
    door = publisher.door
    mine = [trust.Rebuilder("this key", signer.public_key)]
    if trust.agreeing_rebuilds(door, manifest.digest, image_id, mine):
        return f"{compression} already signed"
    build_id = existing.published_build_id(publisher.registry, publisher.repository, manifest.digest) or ""
    about = provenance.Subject(f"{publisher.grid.spec.registry}/{publisher.repository}", manifest.digest, image_id,
                               build_id)  # fmt: skip
    statement = provenance.rebuild_statement(about, engine, provenance.builder_version(), times.iso_utc(time.time()))
    door.attach_statement(manifest, tags.fitted(f"{tag}.rebuild.att"), statement, signer)
    return f"{compression} {'would be signed (dry run)' if publisher.dry_run else 'signed'}"
