"""`verify --rebuild REF`: check a published tag by building it again from this checkout.

The tag is resolved to its digest (on a multi-arch tag, this host's platform), the image's cell
and build ID are read from its config (and, with a key, its signed provenance must hold for this
checkout: the same build ID and locks), the cell is built here without the engine's cache, and
the builder's image ID is compared with the published config digest. When they differ, the
first layer whose diff ID differs is read from the registry and from the engine, and the paths
whose content, mode or owner differ are named: what a user needs to report it.

Nothing read from the registry is trusted for the verdict: the published image ID is the digest
of the config bytes the registry served (checked against the manifest), and the comparison is
the builder's own canonical bytes against it."""

from __future__ import annotations

import gzip
import re
import tarfile
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

import docker
from securesystemslib.signer import CryptoSigner

from builder import times
from builder.assemble import build
from builder.config import platform as platforms
from builder.engine import bases, daemon
from builder.errors import UserError
from builder.oci.registry import INDEX_TYPES, Manifest, Registry, json_object
from builder.plan.cell import Cell
from builder.plan.matrix import Matrix
from builder.publish import attachments, multiarch, provenance, publish, tags, trust
from builder.publish.verify import CELL_LABEL, Reference
from builder.repro import layers, manifests
from builder.steps import Report
from builder.wheelhouse import wheelhouse

REBUILD_REPOSITORY = "torch-images/rebuild"  # the engine's tag of a rebuilt image: never the product's
MAX_PATHS = 20


@dataclass
class Published:
    """The image a reference names, as the registry serves it."""

    served: Manifest  # the image manifest, as the registry served it (its digest checked)
    image_id: str
    config: dict[str, Any]
    manifest: dict[str, Any]
    platform: str  # where a multi-arch tag was narrowed to this host's platform
    index: str = ""

    @property
    def digest(self) -> str:
        return self.served.digest

    @property
    def labels(self) -> dict[str, Any]:
        found = self.config.get("config")
        labels = found.get("Labels") if isinstance(found, dict) else None
        return labels if isinstance(labels, dict) else {}

    @property
    def diff_ids(self) -> list[str]:
        rootfs = self.config.get("rootfs")
        found = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
        return [str(d) for d in found] if isinstance(found, list) else []


@dataclass
class Rebuilt:
    published: Published
    cell: str
    image_id: str = ""
    inputs: int = 0
    differing_layer: int | None = None
    paths: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # The same image in the registry's other staged or published forms (zstd beside gzip): a
    # rebuild statement goes to each, since promote gates each form on its own digest.
    forms: list[Manifest] = field(default_factory=list)

    @property
    def same(self) -> bool:
        return self.image_id == self.published.image_id


def resolve(registry: Registry, reference: Reference) -> Published:
    """The image `reference` names: its manifest and config, read by digest; on a multi-arch
    tag, the image of this host's platform."""
    manifest = registry.manifest(reference.repository, reference.reference)
    if manifest is None:
        raise UserError(f"{reference}: not in {registry.host}")
    if reference.digest and manifest.digest != reference.digest:
        raise UserError(f"{reference}: the registry answered {manifest.digest}, not the digest asked for")
    index, platform = "", ""
    if manifest.media_type in INDEX_TYPES:
        host = platforms.host()
        entries = json_object(manifest.body, f"{reference}: its index").get("manifests")
        chosen = next(
            (e for e in entries if isinstance(e, dict) and isinstance(e.get("platform"), dict)
             and f"{e['platform'].get('os')}/{e['platform'].get('architecture')}" == host.name),
            None,
        ) if isinstance(entries, list) else None  # fmt: skip
        if chosen is None:
            raise UserError(f"{reference}: its index has no {host.name} image, this host's platform; rebuild it there")
        index, platform = manifest.digest, host.name
        found = registry.manifest(reference.repository, str(chosen.get("digest")))
        if found is None:
            raise UserError(f"{reference}: its index lists {chosen.get('digest')}, which the registry does not serve")
        manifest = found
    return _published(registry, reference.repository, manifest, platform, index)


def _published(registry: Registry, repository: str, manifest: Manifest, platform: str, index: str) -> Published:
    document = json_object(manifest.body, f"the manifest {manifest.digest[:19]}")
    config = document.get("config")
    image_id = str(config.get("digest")) if isinstance(config, dict) else ""
    body = registry.blob(repository, image_id)  # checked against its digest by the client
    return Published(manifest, image_id, json_object(body, f"the image config {image_id[:19]}"), document,
                     platform, index)  # fmt: skip


def rebuild(
    engine: docker.DockerClient,
    registry: Registry,
    reference: Reference,
    grid: Matrix,
    options: RebuildOptions,
    report: Report,
) -> Rebuilt:
    """Build the image `reference` names again here, and compare."""
    published = resolve(registry, reference)
    if published.platform:
        report(f"{reference}: a multi-arch tag; rebuilding its {published.platform} image, this host's platform")
    cell_name = str(published.labels.get(CELL_LABEL, ""))
    names = {cell.name for cell in grid.cells}
    if cell_name not in names:
        raise UserError(
            f"{reference}: its image names cell {cell_name[:80]!r}, which this checkout's matrix does not build; "
            "check out the commit it was published from"
        )
    cell = grid.cell(cell_name)
    found = Rebuilt(published, cell.name)
    label_build_id = str(published.labels.get(build.BUILD_ID_LABEL, ""))
    if options.key is not None:
        door = attachments.Door(registry, reference.repository)
        evidence = trust.signed_evidence(door, published.served, published.image_id, cell, options.key)
        if evidence.provenance_problem is not None:
            raise UserError(f"{reference}: {evidence.provenance_problem}; check out the commit it was published from")
        found.notes.append("its signed provenance names this checkout's locks and build ID")
    else:
        found.notes.append("unsigned (no --key): going on from the image's labels, which anyone who can push writes")
    locks = build.preflight(cell, grid)
    house = wheelhouse.Wheelhouse(offline=options.offline)
    # Independent of whatever built it first: the base is never loaded from a restored cache (a
    # rebuild on a fresh CI runner bootstraps it again from its hashed .debs; wheels are checked by
    # sha256 on use). A base the engine already holds is used only where it is the one the cell's
    # record names (cell_build_id); the engine's tag is not removed, since another build on the
    # same engine may be using it.
    bases.forget_cached_rootfs(build.locked_base_tag(locks))
    _, local_build_id = build.cell_build_id(engine, grid, locks, report, house)
    if local_build_id != label_build_id:
        raise UserError(
            f"{reference}: built from build ID {label_build_id[:12] or '(none)'}, this checkout's {cell.name} is "
            f"{local_build_id[:12]}: its inputs differ (locks, templates or scripts); check out the commit it was "
            "published from; nothing built"
        )
    found.inputs = len(provenance.build_inputs(cell))
    target = f"{REBUILD_REPOSITORY}:{cell.name}"
    result = build.build_cell(
        engine, grid, locks, house, report, build.BuildOptions(no_cache=True, backend=options.backend, reference=target)
    )
    build.discard_intermediates(engine, [result])
    if not result.has_image:
        raise UserError(f"{reference}: the rebuild of {cell.name} failed: {result.detail}")
    found.image_id = result.image_id
    if not found.same:
        compare_layers(engine, registry, reference.repository, published, target, found)
    found.forms = other_forms(registry, reference, grid, cell, published)
    return found


def other_forms(
    registry: Registry, reference: Reference, grid: Matrix, cell: Cell, published: Published
) -> list[Manifest]:
    """The image's other compressed forms under the sibling tag (`<tag>-zstd[.staging-RUN]` beside
    `<tag>[.staging-RUN]`), each only where its config is exactly the published image ID."""
    gzip_tag = multiarch.image_tag(grid, cell, "gzip")
    if reference.tag is None or not reference.tag.startswith(gzip_tag):
        return []
    forms = []
    for compression in publish.compressions(grid):
        sibling = multiarch.image_tag(grid, cell, compression) + reference.tag.removeprefix(gzip_tag)
        manifest = registry.manifest(reference.repository, sibling) if sibling != reference.tag else None
        if manifest is None or manifest.media_type in INDEX_TYPES:
            continue
        config = json_object(manifest.body, f"the manifest of {sibling}").get("config")
        if isinstance(config, dict) and config.get("digest") == published.image_id:
            forms.append(manifest)
    return forms


@dataclass(frozen=True)
class RebuildOptions:
    key: Any = None  # SSlibKey: the signed provenance must hold for this checkout
    offline: bool = False  # download nothing: the cache (or an imported bundle) holds every input
    backend: str = "sdk"  # the builder that runs the steps: "sdk" (classic) or "buildkit"


def compare_layers(
    engine: docker.DockerClient, registry: Registry, repository: str, published: Published, local: str, found: Rebuilt
) -> None:
    """Name the first layer whose diff ID differs, and the paths in it that differ."""
    ours = [str(d) for d in engine.images.get(local).attrs["RootFS"]["Layers"]]
    theirs = published.diff_ids
    index = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
    if index is None and len(theirs) > len(ours):  # a layer appended to the published image (docker commit)
        index = len(ours)
        found.notes.append(f"the published image has {len(theirs) - len(ours)} layer(s) more than the rebuild")
    if index is None:
        found.notes.append(f"the layers agree; the configs differ ({len(ours)} layers here, {len(theirs)} published)")
        return
    found.differing_layer = index
    mine: list[list[Any]] = []
    if index < len(ours):
        manifests.record_manifests(engine, local)
        mine = manifests.layer_manifest(ours[index]) or []
    layers_listed = published.manifest.get("layers")
    descriptor = layers_listed[index] if isinstance(layers_listed, list) and index < len(layers_listed) else None
    if not isinstance(descriptor, dict):
        found.notes.append(f"the published manifest lists no layer {index + 1}, which its config names")
        return
    media_type = str(descriptor.get("mediaType", ""))
    if "gzip" not in media_type and not media_type.endswith(".tar"):
        found.notes.append(f"the published layer is {media_type[:60]}: compare the gzip tag to see its paths")
        return
    with tempfile.TemporaryDirectory(prefix="torch-images-rebuild-") as scratch:
        blob = Path(scratch) / "layer"
        registry.download_blob(repository, str(descriptor.get("digest")), blob)
        try:
            with blob.open("rb") as raw:
                stream = gzip.GzipFile(fileobj=raw) if "gzip" in media_type else raw
                published_rows = layers.file_manifest(cast(IO[bytes], stream))
        except (OSError, EOFError, tarfile.TarError, zlib.error) as error:
            found.notes.append(f"the published layer {index + 1} is not a {media_type[:60]} archive ({error})"[:200])
            return
    found.paths = differing(published_rows, mine)


def differing(published: list[list[Any]], rebuilt: list[list[Any]], limit: int = MAX_PATHS) -> list[str]:
    """The paths whose content, mode, owner or kind differ between the published layer and the
    rebuilt one, each with what differs and the sizes, at most `limit`."""
    left = {row[0]: row for row in published}
    right = {row[0]: row for row in rebuilt}
    lines = []
    for name in sorted(set(left) | set(right)):
        a, b = left.get(name), right.get(name)
        if a == b:
            continue
        if a is None or b is None:
            lines.append(f"{name}: only in the {'rebuilt' if a is None else 'published'} layer")
            continue
        what = [kind for kind, column in (("kind", 1), ("mode", 2), ("content", 4), ("owner", 5))
                if column < len(a) and column < len(b) and a[column] != b[column]]  # fmt: skip
        lines.append(f"{name}: {', '.join(what) or 'entry'} differs (published {a[3]} bytes, rebuilt {b[3]} bytes)")
    return lines[:limit] + ([f"... and {len(lines) - limit} more"] if len(lines) > limit else [])


def attest(
    registry: Registry, reference: Reference, found: Rebuilt, engine: docker.DockerClient, signer: CryptoSigner,
    backend: str = "sdk",
) -> str:  # fmt: skip
    """Attach a rebuild that gave the published image ID as a signed statement about its digest
    (SLSA's verification summary, naming the engine); returns the engine named."""
    if not found.same:
        raise UserError(f"{reference}: the rebuild differs; no statement is signed for it")
    published = found.published
    engine_name = daemon.description(engine) + (", BuildKit" if backend == "buildkit" else "")
    build_id = str(published.labels.get(build.BUILD_ID_LABEL, ""))
    slug = re.sub(r"[^a-z0-9]+", "-", engine_name.lower()).strip("-")
    door = attachments.Door(registry, reference.repository)
    for served in (published.served, *found.forms):
        about = provenance.Subject(f"{reference.registry}/{reference.repository}", served.digest,
                                   published.image_id, build_id)  # fmt: skip
        statement = provenance.rebuild_statement(
            about, engine_name, provenance.builder_version(), times.iso_utc(time.time())
        )
        tag = tags.fitted(f"sha256-{served.digest.removeprefix('sha256:')[:32]}.rebuild-{slug}.att")
        door.attach_statement(served, tag, statement, signer)
    return engine_name
