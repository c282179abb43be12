"""A SOCI index for an image's gzip form (`publish.soci: true`): what lets a node running
soci-snapshotter start the image before it has pulled it (docs/using-images.md).

Two forms (`publish.soci_index`): v2 (the default; what soci-snapshotter v0.10 and later load
by default) is a SOCI-enabled image under `<tag>-soci`, as `soci convert` makes it: an OCI index
of the image's manifest, annotated with the SOCI index's digest, and the SOCI index (config type
`...soci.index.v2+json`, no subject), annotated with that manifest's digest. The image's config,
and so its image ID, and its layers are the same; only the manifest's annotations differ. v1
(for snapshotters before v0.10, or later ones with `[pull_modes.soci_v1]`) is a referrer of the
image's own manifest. The zTOCs are the same in both. Soci 0.4.1, the newest packaged, makes v1
only: the v2 form is written here from v1's zTOCs, after soci-snapshotter's own code
(soci/soci_index.go, soci/convert.go).

The index is made by AWS's `soci` CLI (from PATH, else Debian's soci-snapshotter package, pinned
in data/tools.yaml and fetched into the cache by its sha256) from the gzip form as
the registry holds it, so its zTOCs index exactly the bytes a node fetches:
1. the builder fetches that form through its own client (every blob checked by its digest) and
   imports it, unpacked, into a containerd namespace of its own (`ctr images import --no-unpack`);
2. `soci create` writes the index and a zTOC for each layer of 10 MiB or more into soci's
   content store;
3. the builder reads them back (each checked by its digest and the index by its shape: its
   subject is this image, its zTOCs index this image's layers) and pushes them with its own
   client, the index a referrer of the image's manifest. The image itself is not touched.
`ctr`, `soci` and soci's store need root: directly, or through passwordless sudo as hosted
runners have it. The index is not signed: the snapshotter checks each zTOC by the digest the
index names, and the index is found through the image's digest."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
from securesystemslib.signer import SSlibKey

from builder import jsonread
from builder.engine import privilege
from builder.errors import UserError
from builder.oci.registry import (
    DIGEST,
    EMPTY_CONFIG,
    IMAGE_TYPES,
    OCI_INDEX,
    OCI_MANIFEST,
    Manifest,
    Registry,
    sha256_digest,
)
from builder.publish import attachments, provenance
from builder.publish.publication import Publication
from builder.steps import Report
from builder.wheelhouse import tools as pinned_tools

INDEX_TYPE = "application/vnd.amazon.soci.index.v1+json"  # the index's config type: its artifactType
V2_INDEX_TYPE = "application/vnd.amazon.soci.index.v2+json"
INDEX_DIGEST_ANNOTATION = "com.amazon.soci.index-digest"  # on the SOCI-enabled image's manifest
MANIFEST_DIGEST_ANNOTATION = "com.amazon.soci.image-manifest-digest"  # on the SOCI index's descriptor
LAYER_TYPE_ANNOTATION = "com.amazon.soci.image-layer-mediaType"
BUILD_TOOL_ANNOTATION = "com.amazon.soci.build-tool-identifier"
ENABLED_SUFFIX = "-soci"  # the SOCI-enabled image's tag: `<tag>-soci`, as soci's own docs name it
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
ZTOC_TYPE = "application/octet-stream"
LAYER_ANNOTATION = "com.amazon.soci.image-layer-digest"
NAMESPACE = "torch-images-soci"  # containerd's namespace for the images indexed, apart from Docker's
SOCI_STORE = Path("/var/lib/soci-snapshotter-grpc/content/blobs/sha256")  # the soci CLI cannot move it
# Where containerd listens when the engine does not say: a system containerd (Ubuntu's, the
# runners'), then the one Docker 20.10 starts for itself.
CONTAINERD_SOCKETS = (Path("/run/containerd/containerd.sock"), Path("/var/run/docker/containerd/containerd.sock"))
EMPTY_CONFIG_DIGEST = sha256_digest(EMPTY_CONFIG)  # every SOCI index's config
MAX_ZTOC_BYTES = 256 << 20
COMMAND_SECONDS = 3600


@dataclass(frozen=True)
class Tools:
    """What making an index needs on this machine, found before anything is sent."""

    soci: str
    ctr: str
    containerd: str  # containerd's socket
    root: tuple[str, ...]  # () as root, or sudo's prefix

    def run(self, *command: str) -> subprocess.Popen[bytes]:
        """`command` as root, its input a pipe to write, its errors a pipe to read."""
        return subprocess.Popen(
            [*self.root, *command], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

    def output(self, what: str, *command: str) -> bytes:
        """`command`'s output, run as root; a failure is one line naming `what` ran."""
        try:
            done = subprocess.run([*self.root, *command], capture_output=True, timeout=COMMAND_SECONDS, check=False)
        except subprocess.TimeoutExpired:
            raise UserError(f"publish.soci: `{what}` ran past an hour") from None
        if done.returncode != 0:
            said = done.stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"]
            raise UserError(f"publish.soci: `{what}` failed: {said[-1][:300]}")
        return done.stdout

    def soci_command(self, *args: str) -> bytes:
        return self.output(f"soci {' '.join(args[:2])}", self.soci, *self.address_and_namespace, *args)

    def ctr_command(self, *args: str) -> bytes:
        return self.output(f"ctr {' '.join(args[:2])}", self.ctr, *self.address_and_namespace, *args)

    @property
    def address_and_namespace(self) -> tuple[str, ...]:
        return ("--address", self.containerd, "--namespace", NAMESPACE)


def tools(engine: docker.DockerClient) -> Tools:
    """ctr, root, containerd's socket and the soci CLI, or one line saying what is missing."""
    ctr = shutil.which("ctr")
    if ctr is None:
        raise UserError("matrix.yaml publish.soci: true needs containerd's `ctr` on PATH; install containerd")
    root = privilege.root_prefix()
    if root is None:
        raise UserError(
            "matrix.yaml publish.soci: true runs `soci create` as root (its store is /var/lib/soci-snapshotter-grpc): "
            "run publish as root or where sudo needs no password, or set publish.soci: false"
        )
    soci = pinned_tools.binary("soci", "soci-snapshotter")  # from PATH, else Debian's package (data/tools.yaml)
    return Tools(soci, ctr, containerd_socket(engine), root)


def containerd_socket(engine: docker.DockerClient) -> str:
    """The containerd the engine names (Docker 29 does), else the first socket that exists."""
    named = (engine.info().get("Containerd") or {}).get("Address")
    if isinstance(named, str) and named.startswith("/"):
        return named
    for socket in CONTAINERD_SOCKETS:
        if socket.is_socket():
            return str(socket)
    raise UserError(
        "matrix.yaml publish.soci: true needs a running containerd; none answers at "
        + " or ".join(str(s) for s in CONTAINERD_SOCKETS)
    )


MAX_LISTED_INDEXES = 16  # indexes read to find one of this image; more is someone's flood


def attached(door: attachments.Door, item: Publication, key: SSlibKey | None) -> str | None:
    """The digest of a SOCI index attached to the image's digest that the team's `key` signed a
    statement naming (publish made it) and that still proves to be one of this image (check_index:
    SOCI's config, this image as its subject, each zTOC naming one of its layers and present in
    the repository), if any. Without a key none is kept: another party's well-formed index would
    stand in for the team's, so publish makes the image's own (the same bytes again: a put of the
    same digest adds nothing)."""
    if key is None:
        return None
    registry, repository = door.registry, door.repository
    image = registry.manifest(repository, item.digest)
    if image is None:
        return None
    signed = {
        provenance.soci_index_named(found.predicate)
        for found in door.signed(item.digest, item.image_id, key, provenance.MAX_VERIFIED)
        if found.predicate_type == provenance.SOCI_INDEX
    }
    # An index is an image manifest with a config of its own (not one document), so check_index,
    # not the door's one-document proof, proves it this image's.
    for entry in door.listed(item.digest, [INDEX_TYPE])[:MAX_LISTED_INDEXES]:
        digest = str(entry.get("digest", ""))
        if digest not in signed:
            continue
        index = registry.manifest(repository, digest) if DIGEST.fullmatch(digest) else None
        if index is None or index.media_type != OCI_MANIFEST:
            continue
        try:
            ztocs = check_index(jsonread.loads(index.body, f"SOCI index {digest[:19]}"), image)
        except UserError:
            continue
        if all(registry.has_blob(repository, ztoc) for ztoc in ztocs):
            return digest
    return None


def attach_index(door: attachments.Door, digest: str, found: Tools, report: Report) -> str:
    """Make the v1 SOCI index of the image `repository@digest` and push it, a referrer of the
    image's manifest; returns the index's digest."""
    image = door.registry.manifest(door.repository, digest)
    if image is None:
        raise UserError(f"{door.repository}@{digest[:19]}: not in the registry; no index made")
    index, ztocs = made_index(door.registry, door.repository, image, found, report)
    attach_v1(door, digest, index, ztocs, report)
    return index.digest


def attach_v1(door: attachments.Door, digest: str, index: Manifest, ztocs: list[str], report: Report) -> None:
    """The v1 index (its zTOCs already pushed), a referrer of the image's manifest."""
    door.attach_manifest(digest, index, INDEX_TYPE)
    report(f"{door.repository}@{digest[:19]}: SOCI index {index.digest[:19]} attached ({len(ztocs)} layers indexed)")


def made_index(
    registry: Registry, repository: str, image: Manifest, found: Tools, report: Report
) -> tuple[Manifest, list[str]]:
    """soci's v1 index of `image` (as the registry serves it), checked to be this image's, with its
    zTOCs (and the index's empty config) pushed to the repository; the index itself is not."""
    digest = image.digest
    layers = json.loads(image.body).get("layers", [])
    if image.media_type not in IMAGE_TYPES or not all("gzip" in str(layer.get("mediaType")) for layer in layers):
        raise UserError(f"{repository}@{digest[:19]}: not in the registry as a gzip image manifest; no index made")
    report(f"making the SOCI index of {repository}@{digest[:19]}: fetching its gzip form")
    name = f"torch-images.invalid/{repository}@{digest}"  # a name in containerd only, never pulled
    with tempfile.TemporaryDirectory(prefix="torch-images-soci-") as folder:
        layout = _fetch_layout(registry, repository, image, Path(folder), name)
        with _imported(found, layout, name):
            report(f"{repository}@{digest[:19]}: soci create")
            found.soci_command("create", name)
            index_digest = _made_index(found, name)
            try:
                index = Manifest(_read_store(found, index_digest, MAX_ZTOC_BYTES), OCI_MANIFEST, index_digest)
                ztocs = check_index(jsonread.loads(index.body, f"soci's index {index_digest[:19]}"), image)
                for ztoc in ztocs:
                    registry.upload_blob(repository, _read_store(found, ztoc, MAX_ZTOC_BYTES))
            finally:
                found.soci_command("index", "rm", index_digest)
    registry.upload_blob(repository, EMPTY_CONFIG)  # the index's config
    return index, ztocs


# ---------------------------------------------------------------- v2: the SOCI-enabled image


def enabled_tag(target: str) -> str:
    """The tag of the SOCI-enabled form of the image under `target`."""
    return target + ENABLED_SUFFIX


def v2_index(v1_index: Manifest, image: Manifest) -> Manifest:
    """The v2 SOCI index with v1's zTOCs: the config of v2's type, no subject, and each zTOC
    naming its layer's media type as well as its digest (soci_index.go's buildSociLayer)."""
    index, layer_types = json.loads(v1_index.body), _layer_types(image)
    ztocs = []
    for entry in index["layers"]:
        annotations = dict(entry.get("annotations") or {})
        annotations[LAYER_TYPE_ANNOTATION] = layer_types[annotations[LAYER_ANNOTATION]]
        ztocs.append({"mediaType": ZTOC_TYPE, "digest": entry["digest"], "size": entry["size"],
                      "annotations": annotations})  # fmt: skip
    tool = (index.get("annotations") or {}).get(BUILD_TOOL_ANNOTATION, "torch-images")
    document = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": V2_INDEX_TYPE, "digest": EMPTY_CONFIG_DIGEST, "size": len(EMPTY_CONFIG)},
        "layers": ztocs,
        "annotations": {BUILD_TOOL_ANNOTATION: str(tool)},
    }
    return Manifest.of(_canonical(document), OCI_MANIFEST)


def enabled_manifest(image: Manifest, index: Manifest) -> Manifest:
    """The image's manifest as soci convert writes it into the SOCI-enabled image: OCI media
    types, and an annotation naming the SOCI index. Its config and layers are the image's."""
    document = json.loads(image.body)
    document["mediaType"] = OCI_MANIFEST
    document["config"] = {**document["config"], "mediaType": OCI_CONFIG}
    document["annotations"] = {**(document.get("annotations") or {}), INDEX_DIGEST_ANNOTATION: index.digest}
    return Manifest.of(_canonical(document), OCI_MANIFEST)


def enabled_image(manifest: Manifest, index: Manifest, platform: dict[str, str]) -> Manifest:
    """The OCI index soci convert makes of a single-platform image: the annotated manifest, then
    the SOCI index, each with the image's platform and naming the other."""
    document = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [
            {"mediaType": OCI_MANIFEST, "digest": manifest.digest, "size": len(manifest.body),
             "annotations": {INDEX_DIGEST_ANNOTATION: index.digest}, "platform": platform},
            {"mediaType": OCI_MANIFEST, "artifactType": V2_INDEX_TYPE, "digest": index.digest,
             "size": len(index.body), "annotations": {MANIFEST_DIGEST_ANNOTATION: manifest.digest},
             "platform": platform},
        ],
    }  # fmt: skip
    return Manifest.of(_canonical(document), OCI_INDEX)


def push_enabled(
    registry: Registry, repository: str, image: Manifest, v1_index: Manifest, platform: dict[str, str], tag: str
) -> str:
    """Push the SOCI-enabled image of `image` (whose zTOCs `v1_index` names, already pushed)
    under `tag`: the SOCI index and the annotated manifest by digest, then the index under the
    tag, last, so the tag never names a part that is not there. Returns the index's digest."""
    index = v2_index(v1_index, image)
    manifest = enabled_manifest(image, index)
    registry.put_manifest(repository, index.digest, index)
    registry.put_manifest(repository, manifest.digest, manifest)
    enabled = enabled_image(manifest, index, platform)
    registry.put_manifest(repository, tag, enabled)
    return enabled.digest


def enabled_ztocs(registry: Registry, repository: str, tag: str, image: Manifest) -> list[str] | None:
    """The zTOCs of the SOCI-enabled image under `tag` where it is one of `image` (its manifest
    entry has the image's config and layers and names the SOCI index, whose zTOCs each index one
    of those layers and are in the repository), else None."""
    enabled = registry.manifest(repository, tag)
    try:
        if enabled is None:
            return None
        entries = jsonread.loads(enabled.body, f"{repository}:{tag}").get("manifests")
        [manifest_entry, index_entry] = entries
        manifest = registry.manifest(repository, str(manifest_entry["digest"]))
        index = registry.manifest(repository, str(index_entry["digest"]))
        if manifest is None or index is None or index_entry.get("artifactType") != V2_INDEX_TYPE:
            return None
        ztocs = check_enabled(jsonread.loads(manifest.body, tag), jsonread.loads(index.body, tag), image, index)
    except (UserError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return ztocs if all(registry.has_blob(repository, ztoc) for ztoc in ztocs) else None


def check_enabled(manifest: Any, index: Any, image: Manifest, index_manifest: Manifest) -> list[str]:
    """The zTOC digests of a SOCI-enabled image's two parts, once shown to be `image`'s: the
    manifest has the image's config and layers and names this SOCI index; the index is v2's
    (config, no subject) and each zTOC indexes one of the image's layers, naming its type."""
    where = f"the SOCI-enabled form of {image.digest[:19]}"
    original = json.loads(image.body)
    if not isinstance(manifest, dict) or (manifest.get("config") or {}).get("digest") != original["config"]["digest"]:
        raise UserError(f"{where}: its manifest has another config than the image")
    if [layer.get("digest") for layer in manifest.get("layers") or []] != [
        layer["digest"] for layer in original["layers"]
    ]:
        raise UserError(f"{where}: its manifest has other layers than the image")
    if (manifest.get("annotations") or {}).get(INDEX_DIGEST_ANNOTATION) != index_manifest.digest:
        raise UserError(f"{where}: its manifest does not name its SOCI index")
    if not isinstance(index, dict) or "subject" in index:
        raise UserError(f"{where}: its SOCI index has a subject, which v2's has not")
    # v1's checks but for the config's type and the subject, which v2 replaces by the annotations
    as_v1 = {
        **index,
        "config": {**(index.get("config") or {}), "mediaType": INDEX_TYPE},
        "subject": {"digest": image.digest},
    }
    if (index.get("config") or {}).get("mediaType") != V2_INDEX_TYPE:
        raise UserError(f"{where}: its SOCI index's config is not {V2_INDEX_TYPE}")
    ztocs = check_index(as_v1, image)
    types = _layer_types(image)
    for entry in index["layers"]:
        annotations = entry["annotations"]
        if annotations.get(LAYER_TYPE_ANNOTATION) != types[annotations[LAYER_ANNOTATION]]:
            raise UserError(f"{where}: a zTOC names another media type than its layer's")
    return ztocs


def _layer_types(image: Manifest) -> dict[str, str]:
    return {str(layer["digest"]): str(layer["mediaType"]) for layer in json.loads(image.body)["layers"]}


def _canonical(document: dict[str, Any]) -> bytes:
    """One encoding of a document this module writes: its digest is the same on every run."""
    return json.dumps(document, separators=(",", ":")).encode()


def _fetch_layout(registry: Registry, repository: str, image: Manifest, folder: Path, name: str) -> Path:
    """The image as an OCI layout in `folder`: its manifest, config and layers, each checked."""
    layout = folder / "layout"
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    document = json.loads(image.body)
    for descriptor in [document["config"], *document["layers"]]:
        digest = str(descriptor["digest"])
        registry.download_blob(repository, digest, blobs / digest.removeprefix("sha256:"))
    (blobs / image.digest.removeprefix("sha256:")).write_bytes(image.body)
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    entry = {
        "mediaType": image.media_type,
        "digest": image.digest,
        "size": len(image.body),
        "annotations": {"io.containerd.image.name": name},
    }
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))
    return layout


@contextlib.contextmanager
def _imported(found: Tools, layout: Path, name: str) -> Iterator[None]:
    """The layout in containerd's namespace, not unpacked, for as long as the index is made."""
    importing = found.run(found.ctr, *found.address_and_namespace, "images", "import", "--no-unpack", "-")
    assert importing.stdin is not None and importing.stderr is not None
    try:
        with importing.stdin as pipe, tarfile.open(fileobj=pipe, mode="w|") as archive:
            archive.add(str(layout), arcname=".")
    except BrokenPipeError:
        pass  # ctr stopped reading: its own error follows
    errors = importing.stderr.read()
    if importing.wait(timeout=COMMAND_SECONDS) != 0:
        line = errors.decode("utf-8", "replace").strip().splitlines() or ["no output"]
        raise UserError(f"publish.soci: containerd did not import the image: {line[-1][:300]}")
    try:
        yield
    finally:
        found.ctr_command("images", "rm", name)  # its content goes with containerd's next collection


def _made_index(found: Tools, name: str) -> str:
    listed = [line.strip() for line in found.soci_command("index", "list", "--quiet", "--ref", name).decode().split()]
    digests = [line for line in listed if DIGEST.fullmatch(line)]
    if len(digests) != 1:
        raise UserError(f"publish.soci: `soci index list` names {len(digests)} indexes for the image, not one")
    return digests[0]


def _read_store(found: Tools, digest: str, limit: int) -> bytes:
    """A blob of soci's store (root's), checked against its digest."""
    if not DIGEST.fullmatch(digest):
        raise UserError(f"publish.soci: {digest[:80]!r} is not a sha256 digest")
    body = found.output("cat soci's store", "cat", str(SOCI_STORE / digest.removeprefix("sha256:")))
    if len(body) > limit or sha256_digest(body) != digest:
        raise UserError(f"publish.soci: soci's store holds other bytes than {digest[:19]} names; nothing pushed")
    return body


def check_index(index: Any, image: Manifest) -> list[str]:
    """The zTOC digests of a SOCI index, once it is shown to be an index of `image`: its config
    is SOCI's, its subject is the image, and each zTOC indexes one of the image's layers."""
    layers = {str(layer.get("digest")) for layer in json.loads(image.body).get("layers", [])}
    where = f"the SOCI index of {image.digest[:19]}"
    if not isinstance(index, dict) or index.get("mediaType") != OCI_MANIFEST:
        raise UserError(f"{where}: not an OCI image manifest; nothing pushed")
    config, subject, entries = index.get("config"), index.get("subject"), index.get("layers")
    if (
        not isinstance(config, dict)
        or config.get("mediaType") != INDEX_TYPE
        or config.get("digest") != EMPTY_CONFIG_DIGEST
    ):
        raise UserError(f"{where}: its config is not SOCI's empty {INDEX_TYPE}; nothing pushed")
    if not isinstance(subject, dict) or subject.get("digest") != image.digest:
        raise UserError(f"{where}: its subject is not the image; nothing pushed")
    if not isinstance(entries, list) or not entries:
        raise UserError(f"{where}: it indexes no layer (none of 10 MiB or more?); nothing pushed")
    ztocs = []
    for entry in entries:
        annotations = entry.get("annotations") if isinstance(entry, dict) else None
        if not isinstance(annotations, dict) or annotations.get(LAYER_ANNOTATION) not in layers:
            raise UserError(f"{where}: a zTOC names a layer the image does not have; nothing pushed")
        if entry.get("mediaType") != ZTOC_TYPE or not DIGEST.fullmatch(str(entry.get("digest"))):
            raise UserError(f"{where}: a zTOC entry is not a sha256 blob of {ZTOC_TYPE}; nothing pushed")
        ztocs.append(str(entry["digest"]))
    return ztocs
