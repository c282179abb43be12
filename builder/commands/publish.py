"""`python -m builder publish`: push self-tested cells, their SBOM and report, then aliases."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder.commands.common import (
    Register,
    cells_of,
    console,
    grid_of,
    registry_of,
    registry_options,
    use_registry_option,
)
from builder.engine import daemon
from builder.errors import UserError
from builder.publish import provenance, prune, publish, staging, trust
from builder.publish.publisher import Publisher


def add(register: Register) -> None:
    publish_cmd = register(
        "publish",
        "push cells whose self-test passed for that exact image ID, then their SBOM and report, then aliases",
        "Needs the engine and the registry; credentials as docker finds them (~/.docker/config.json: auths, "
        "credHelpers, credsStore; `docker login` writes them), else TORCH_IMAGES_REGISTRY_USER and "
        "TORCH_IMAGES_REGISTRY_PASSWORD; token and basic authentication. Writes published/<cell>.json beside "
        "the matrix.",
    )
    publish_cmd.add_argument("cells", nargs="*", help="cells to publish (default: the flagship)")
    publish_cmd.add_argument("--all", action="store_true", help="every buildable cell")
    registry_options(publish_cmd, "push here instead of matrix.yaml's registry: HOST[:PORT][/REPOSITORY]")
    stages = publish_cmd.add_mutually_exclusive_group()
    stages.add_argument(
        "--stage",
        action="store_true",
        help="CI, per cell: push the self-tested image under <tag>.staging-RUN with its SBOM and report attached; "
        "moves no versioned tag or alias (a cell --skip-existing did not build is staged from the registry)",
    )
    stages.add_argument(
        "--promote",
        action="store_true",
        help="CI, once every cell passed: gate on the reports attached in the registry (no engine or image needed), "
        "then point the versioned tags at the staged images and move the aliases",
    )
    stages.add_argument(
        "--gpu-test",
        action="store_true",
        help="CI's GPU stage, on a runner with GPUs and the NVIDIA container toolkit: pull each CUDA cell's staged "
        "image, self-test it with every GPU, and attach the report to its digest beside the others",
    )
    stages.add_argument(
        "--prune-reports",
        action="store_true",
        help="on each cell's published images: delete the self-test reports of another image and each device's "
        "older passes (a failed report of the image is never deleted), with their signed statements",
    )
    publish_cmd.add_argument(
        "--sign-key",
        type=Path,
        metavar="FILE",
        help="sign each image's provenance (in-toto, SLSA v1) and self-test reports with this private key (PEM, "
        f"Ed25519 or ECDSA P-256) and attach them as DSSE envelopes; default: the PEM in {provenance.KEY_ENVIRONMENT} "
        "if set, else unsigned",
    )
    publish_cmd.add_argument(
        "--key",
        type=Path,
        metavar="FILE",
        help="with --promote and --gpu-test: the team's public key (PEM); only reports and provenance it signed "
        "about the staged digest open the gate. Default: the PEM in "
        f"{trust.KEY_ENVIRONMENT}, else the public half of the signing key, else unsigned reports (said so)",
    )
    publish_cmd.add_argument(
        "--compression",
        choices=["gzip", "zstd"],
        help="zstd: also push each image with zstd layers under <tag>-zstd and <alias>-zstd (the same image ID; "
        "containerd >= 1.5 and Docker >= 23 pull it); gzip stays under the plain tags. Default: matrix.yaml's "
        "publish.compression, else gzip",
    )
    publish_cmd.add_argument(
        "--staged-record",
        type=Path,
        metavar="DIR",
        help="with --stage: write there what was staged (<tag>.json: tag and digest; CI carries it to promote as an "
        "artifact); with --promote: move only staging tags that still point at what those files name",
    )
    publish_cmd.add_argument(
        "--run", default="local", help="with --stage and --promote: the run ID that ties them (CI's run number)"
    )
    publish_cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    grid = grid_of(args)
    use_registry_option(grid, args)
    if args.compression:
        chosen = grid.spec.publish.model_copy(update={"compression": args.compression})
        grid.spec = grid.spec.model_copy(update={"publish": chosen})
    cells, say = cells_of(args, grid), lambda text: console.print(text)
    if args.key is not None and not (args.promote or args.gpu_test or args.prune_reports):
        raise UserError(
            "--key: only --promote, --gpu-test and --prune-reports read reports from the registry; drop it here"
        )
    if args.staged_record is not None and not (args.stage or args.promote):
        raise UserError("--staged-record: --stage writes it and --promote reads it; drop it here")
    if args.prune_reports:
        if args.sign_key is not None or args.staged_record is not None:
            raise UserError("--prune-reports reads and deletes reports only; drop --sign-key and --staged-record")
        # With --key, which passes the team signed is checked; without, any statement counts as signed.
        prune.prune(registry_of(grid, args), grid, cells, say, trust.trust_key(args.key, None))
        return 0
    signer = provenance.load_signer(args.sign_key)
    key = trust.trust_key(args.key, signer)
    if args.stage or args.promote or args.gpu_test:
        staging.check_run(args.run)
        registry = registry_of(grid, args)
        if args.gpu_test:
            publisher = Publisher(registry, grid, say, daemon.client(), signer, key)
            failures = staging.gpu_test(publisher, cells, args.run)
            return 0 if all(why is None for why in failures) else 1
        if args.stage:
            items = staging.stage(Publisher(registry, grid, say, daemon.client(), signer), cells, args.run)
            for item in items:
                console.print(f"{item.cell.name}: staged {grid.spec.registry}/{grid.spec.repository}:{item.target}")
            if args.staged_record is not None:
                staging.write_staged(args.staged_record, grid, args.run, items)
            return 0
        publisher = Publisher(registry, grid, say, key=key)
        items = staging.promote(publisher, cells, args.run, staged_record=args.staged_record)
    else:
        options = publish.PublishOptions(ca_file=args.registry_ca, insecure=args.insecure_registry, signer=signer)
        items = publish.publish(daemon.client(), grid, cells, say, options)
    for item in items:
        state = "unchanged" if item.unchanged and not item.moved_aliases else "published"
        where = f" ({item.cell.platform} {item.target} {item.digest})" if item.tag_digest else ""
        console.print(
            f"{item.cell.name}: {state} {grid.spec.registry}/{grid.spec.repository}:{item.cell.tag} "
            f"{item.points_to}{where}"
        )
    return 0
