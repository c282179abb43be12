"""`python -m builder verify REF`: before `FROM REF`, check what the registry attached to it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from builder.commands.common import Register, console, progress, registry_options
from builder.engine import daemon
from builder.errors import UserError
from builder.oci.registry import Registry
from builder.plan import matrix
from builder.publish import provenance, rebuild, trust, verify
from builder.terminal import printable


def add(register: Register) -> None:
    verify_cmd = register(
        "verify",
        "check an image in its registry before you build FROM it: SBOM, self-test reports, GPU proof, build ID",
        "Needs no engine, only the registry (credentials as `publish` finds them). Lists each attached artifact "
        "and which checks passed on which device; exits 1 when any is missing, failed, or belongs to another "
        "digest. A CUDA image needs a passing GPU report unless this checkout's matrix makes its gate optional.",
    )
    verify_cmd.add_argument("reference", help="REGISTRY/REPOSITORY:TAG or REGISTRY/REPOSITORY@sha256:...")
    verify_cmd.add_argument(
        "--key",
        type=Path,
        metavar="PUB",
        help="also check the signed attestations with this public key (PEM): each signature, that each is about "
        "this digest and image, and that the provenance's locks and build ID match this checkout",
    )
    verify_cmd.add_argument(
        "--rebuild",
        action="store_true",
        help="also build the image again here, without the engine's cache, from this checkout (it must hold the "
        "inputs the image was built from: its build ID, and with --key the locks its provenance names), and "
        "compare the image ID with the published one; names the first differing layer and its paths. Needs the "
        "engine; minutes for a CPU cell, more for a CUDA one",
    )
    verify_cmd.add_argument(
        "--offline", action="store_true", help="with --rebuild: download nothing; the cache holds every input"
    )
    verify_cmd.add_argument(
        "--backend",
        choices=["sdk", "buildkit"],
        default="sdk",
        help="with --rebuild: the builder that runs the steps (default: sdk, the classic builder); another than "
        "the first build's makes the rebuild a second, independent one",
    )
    verify_cmd.add_argument(
        "--sign-key",
        type=Path,
        metavar="PEM",
        help="with --rebuild: when the rebuild gives the published image ID, attach a signed statement of it "
        "(SLSA's verification summary, naming this engine) to the digest; promote counts them for "
        "publish.require_rebuilds where its public key is in publish.rebuilders. Needs push rights. A rebuilder's "
        "own key, never the team's. Default: TORCH_IMAGES_REBUILD_KEY where it is set",
    )
    registry_options(verify_cmd, argparse.SUPPRESS)
    verify_cmd.set_defaults(func=run)


def run_rebuild(args: argparse.Namespace, reference: verify.Reference, registry: Registry, key: Any) -> int:
    if not Path(args.matrix).is_file():
        raise UserError(f"--rebuild builds from this checkout: {args.matrix} is not there; run it in the checkout")
    grid = matrix.load_matrix(Path(args.matrix))
    engine = daemon.client()
    # --sign-key, else the environment's; refused before the build
    signer = provenance.load_signer(args.sign_key, provenance.REBUILD_KEY_ENVIRONMENT)
    if signer is not None:
        note = trust.rebuilder_key_note(grid, signer, key)
        if note:
            print(note)
    with progress(f"{reference}: rebuilding") as report:
        options = rebuild.RebuildOptions(key, args.offline, args.backend)
        found = rebuild.rebuild(engine, registry, reference, grid, options, report)
    for note in found.notes:
        print(printable(f"  {note}"))
    if found.same:
        print(f"rebuilt {reference}: the same image ID {found.image_id}, from {found.inputs} inputs "
              f"(cell {found.cell}; the rebuilt image is {rebuild.REBUILD_REPOSITORY}:{found.cell})")  # fmt: skip
        if signer is not None:
            engine_name = rebuild.attest(registry, reference, found, engine, signer, args.backend)
            print(printable(f"signed and attached the rebuild on {engine_name} to {found.published.digest[:19]}"))
        return 0
    layer = f"layer {found.differing_layer + 1}" if found.differing_layer is not None else "no layer"
    print(printable(f"rebuilt {reference}: differs: published image ID {found.published.image_id}, rebuilt "
                    f"{found.image_id}; the first that differs is {layer}"))  # fmt: skip
    for path in found.paths:
        print(printable(f"  {path}"))
    return 1


def run(args: argparse.Namespace) -> int:
    reference = verify.parse_reference(args.reference)
    if args.registry:
        raise UserError("verify reads the registry from the reference; write REGISTRY/REPOSITORY:TAG")
    grid = matrix.load_matrix(Path(args.matrix)) if Path(args.matrix).is_file() else None
    # The environment's credentials are the team's, for its own registry: another one never gets them.
    configured = grid.spec.registry if grid is not None else ""
    registry = Registry.for_publishing(reference.registry, args.registry_ca, args.insecure_registry, configured)
    registry.check()
    key = provenance.load_public_key(args.key) if args.key else None
    if (args.offline or args.sign_key or args.backend != "sdk") and not args.rebuild:
        raise UserError("--offline, --backend and --sign-key are for --rebuild; drop them or add --rebuild")
    if args.rebuild:
        return run_rebuild(args, reference, registry, key)
    images = verify.verify(registry, reference, grid, key)
    failed = False
    if images and images[0].index:  # a multi-arch tag: the digest to pin is the index's
        print(f"{reference} -> {images[0].index} (an index of {len(images)} platforms; each node pulls its own)")
    for image in images:
        where = f" [{image.platform}]" if image.platform else ""
        cell = f", cell {image.cell}" if image.cell else ""
        # Report and registry text: control characters and escape sequences shown, never sent.
        print(printable(f"{reference}{where} -> {image.digest} (image {image.image_id[7:19]}{cell})"))
        for line in image.lines:
            print(printable(f"  {line}"))
        for problem in image.problems:
            print(printable(f"  PROBLEM: {problem}"))
        failed = failed or bool(image.problems)
    if key is None:
        how = "unsigned: what is attached was checked, not who attached it (anyone who can push could); --key PUB"
        how += " also checks the signed attestations"
    else:
        how = f"signed: each attestation above was checked against the key {key.keyid[:16]} from {args.key}"
    console.print(f"{reference}: {'NOT verified' if failed else 'verified'} ({how})", markup=False, soft_wrap=True)
    return 1 if failed else 0
