"""`python -m builder publish VERB`: one verb a command (bashbrew's build / push / put-shared).

- `push`: push self-tested cells from this engine, their SBOM and report, then aliases (one machine).
- `stage`, `sign`, `gpu-test`, `promote`: CI's steps across jobs (docs/ci.md): stage pushes under a
  staging tag with no key; sign, in a job that runs no build code and no image, signs what the run
  staged; gpu-test self-tests a staged image on a GPU; promote moves the tags once the gate holds.
- `prune`: delete superseded reports.

Each verb builds its Publisher here, from the options it has, and hands it down whole.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
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
from builder.plan.matrix import Matrix
from builder.publish import provenance, prune, publish, rebuilds, signing, staging, trust
from builder.publish.publication import Publication
from builder.publish.publisher import Publisher

CREDENTIALS = (
    "Credentials as docker finds them (~/.docker/config.json: auths, credHelpers, credsStore; `docker login` "
    "writes them), else TORCH_IMAGES_REGISTRY_USER and TORCH_IMAGES_REGISTRY_PASSWORD."
)


def add(register: Register) -> None:
    publish_cmd = register(
        "publish",
        "publish cells: push from this engine, or CI's stage / sign / gpu-test / promote, or prune reports",
        "One verb a command; `publish VERB --help` lists its own options. " + CREDENTIALS,
    )
    verbs = publish_cmd.add_subparsers(
        dest="verb", metavar="VERB", required=True, help="what to do (one verb a command)"
    )
    for name, summary, options, run in (
        ("push", "push self-tested cells, their SBOM and report, then their aliases (needs the engine); "
         "writes published/<cell>.json beside the matrix", (_sign_key, _compression, _dry_run), _push),
        ("stage", "CI, per cell: push the self-tested image under <tag>.staging-RUN with its SBOM and report "
         "attached, signing nothing; moves no versioned tag or alias",
         (_run, _staged_record_out, _compression, _dry_run), _stage),
        ("sign", "CI, in a job that runs no build code and no image: sign with the team's key what the run staged "
         "(provenance, and the documents its jobs recorded attaching), read from the registry",
         (_run, _staged_record_in, _sign_key, _compression, _dry_run), _sign),
        ("stage-rebuild", "CI's rebuild job, after `build --no-cache --fresh-base`: push this engine's image of each "
         "cell under <tag>.staging-RUN.rebuild beside the staged one, signing nothing; exits 1, naming the first "
         "differing layer, where it is another image", (_run, _rebuild_record_out, _dry_run), _stage_rebuild),
        ("sign-rebuild", "CI, in a job that runs no build code and no image: where the run's rebuild in the registry "
         "is exactly the staged image, sign a rebuild statement about each staged form with a rebuilder's own key",
         (_run, _rebuild_record_in, _rebuild_key, _key, _compression, _dry_run), _sign_rebuild),
        ("gpu-test", "CI's GPU stage, on a runner with GPUs and the NVIDIA container toolkit: self-test each CUDA "
         "cell's staged image with every GPU and keep the report for the sign job (or --attach it), signing nothing",
         (_run, _staged_record_out, _attach, _key, _compression, _dry_run), _gpu_test),
        ("promote", "CI, once every job passed: gate on the registry alone, then point the versioned tags at the "
         "staged images and move the aliases", (_run, _staged_record_in, _key, _compression, _dry_run), _promote),
        ("prune", "on each cell's published images: delete the self-test reports of another image and each "
         "device's older passes, with their signed statements", (_key, _compression, _dry_run), _prune),
    ):  # fmt: skip
        verb = verbs.add_parser(name, help=summary, description=summary)
        verb.add_argument("cells", nargs="*", help="cells (default: the flagship)")
        verb.add_argument("--all", action="store_true", help="every buildable cell")
        registry_options(verb, "this registry instead of matrix.yaml's: HOST[:PORT][/REPOSITORY]")
        for option in options:
            option(verb)
        verb.set_defaults(func=run)


def _run(verb: argparse.ArgumentParser) -> None:
    verb.add_argument("--run", default="local", help="the run ID that ties a run's jobs (CI's run number)")


def _record_folder(help_text: str, default: Path | None = None) -> Callable[[argparse.ArgumentParser], None]:
    """`--staged-record DIR`: where CI's jobs keep what they did for the next job (an artifact)."""

    def add(verb: argparse.ArgumentParser) -> None:
        verb.add_argument("--staged-record", type=Path, metavar="DIR", default=default, help=help_text)

    return add


_staged_record_out = _record_folder(
    "write there what was staged (<tag>.json: the digest and the sha256 of each document attached) or the GPU "
    "report (<tag>.gpu-report.json), for CI to carry to the sign and promote jobs as an artifact"
)
_staged_record_in = _record_folder(
    "what stage and gpu-test wrote: promote moves only staging tags that still point at the digests named there; "
    "sign signs only documents with the sha256 named there attached to that digest, and the GPU report kept there "
    "where it is about the staged image"
)
_rebuild_record_out = _record_folder(
    "write there which engine rebuilt each cell (<rebuild tag>.json), for sign-rebuild (default: rebuilt)",
    Path("rebuilt"),
)
_rebuild_record_in = _record_folder(
    "what stage-rebuild wrote: only the engine the statement names comes from there; the image IDs compared come "
    "from the registry (default: rebuilt)",
    Path("rebuilt"),
)


def _rebuild_key(verb: argparse.ArgumentParser) -> None:
    verb.add_argument(
        "--sign-key",
        type=Path,
        metavar="FILE",
        help=f"a rebuilder's own private key (PEM), never the team's; default: the PEM in "
        f"{provenance.REBUILD_KEY_ENVIRONMENT}",
    )


def _attach(verb: argparse.ArgumentParser) -> None:
    verb.add_argument(
        "--attach",
        action="store_true",
        help="attach the report to the staged digest here, unsigned (a team with no key; CI's GPU job holds no write "
        "token and leaves it to the sign job)",
    )


def _sign_key(verb: argparse.ArgumentParser) -> None:
    verb.add_argument(
        "--sign-key",
        type=Path,
        metavar="FILE",
        help="the team's private key (PEM, Ed25519 or ECDSA P-256): signs provenance (in-toto, SLSA v1), reports "
        f"and SBOM as DSSE envelopes; default: the PEM in {provenance.KEY_ENVIRONMENT} if set, else unsigned",
    )


def _key(verb: argparse.ArgumentParser) -> None:
    verb.add_argument(
        "--key",
        type=Path,
        metavar="FILE",
        help="the team's public key (PEM): only what it signed about the staged digest counts. Default: the PEM "
        f"in {trust.KEY_ENVIRONMENT}, else unsigned reports (said so)",
    )


def _dry_run(verb: argparse.ArgumentParser) -> None:
    verb.add_argument(
        "--dry-run",
        action="store_true",
        help="read the registry and decide as the verb would, say what it would move or delete, and write nothing",
    )


def _compression(verb: argparse.ArgumentParser) -> None:
    verb.add_argument(
        "--compression",
        choices=["gzip", "zstd"],
        help="zstd: each image also under <tag>-zstd and <alias>-zstd (the same image ID); default: matrix.yaml's "
        "publish.compression, else gzip",
    )


def _setting(args: argparse.Namespace) -> tuple[Matrix, Callable[[str], None]]:
    """The matrix with --registry and --compression applied, and where lines go."""
    grid = grid_of(args)
    use_registry_option(grid, args)
    if getattr(args, "compression", None):  # the verbs that handle each compressed form take it
        chosen = grid.spec.publish.model_copy(update={"compression": args.compression})
        grid.spec = grid.spec.model_copy(update={"publish": chosen})
    return grid, lambda text: console.print(text)


def _push(args: argparse.Namespace) -> int:
    grid, say = _setting(args)
    options = publish.PublishOptions(
        ca_file=args.registry_ca,
        insecure=args.insecure_registry,
        signer=provenance.load_signer(args.sign_key),
        dry_run=args.dry_run,
    )
    _print_published(grid, publish.publish(daemon.client(), grid, cells_of(args, grid), say, options))
    return 0


def _stage(args: argparse.Namespace) -> int:
    grid, say = _setting(args)
    staging.check_run(args.run)
    publisher = Publisher(registry_of(grid, args), grid, say, daemon.client())
    items = staging.stage(publisher, cells_of(args, grid), args.run, args.dry_run)
    if args.dry_run:
        return 0
    for item in items:
        console.print(f"{item.cell.name}: staged {grid.spec.registry}/{grid.spec.repository}:{item.target}")
    if args.staged_record is not None:
        staging.write_staged(publisher, args.run, items, args.staged_record)
    return 0


def _sign(args: argparse.Namespace) -> int:
    grid, say = _setting(args)
    signer = provenance.load_signer(args.sign_key)
    publisher = Publisher(registry_of(grid, args), grid, say, signer=signer, dry_run=args.dry_run)
    for line in signing.sign(publisher, cells_of(args, grid), args.run, args.staged_record or Path("staged")):
        console.print(line)
    return 0


def _stage_rebuild(args: argparse.Namespace) -> int:
    grid, say = _setting(args)
    publisher = Publisher(registry_of(grid, args), grid, say, daemon.client(), dry_run=args.dry_run)
    failures = rebuilds.stage_rebuild(publisher, cells_of(args, grid), args.run, args.staged_record)
    return 0 if all(why is None for why in failures) else 1


def _sign_rebuild(args: argparse.Namespace) -> int:
    grid, say = _setting(args)
    signer = provenance.load_signer(args.sign_key, provenance.REBUILD_KEY_ENVIRONMENT)
    team = trust.trust_key(args.key, None)
    note = trust.rebuilder_key_note(grid, signer, team) if signer is not None else None
    if note:
        console.print(note)
    publisher = Publisher(registry_of(grid, args), grid, say, signer=signer, key=team, dry_run=args.dry_run)
    for line in rebuilds.sign_rebuilds(publisher, cells_of(args, grid), args.run, args.staged_record):
        console.print(line)
    return 0


def _gpu_test(args: argparse.Namespace) -> int:
    grid, say = _setting(args)
    staging.check_run(args.run)
    key = trust.trust_key(args.key, None)
    publisher = Publisher(registry_of(grid, args), grid, say, daemon.client(), key=key, dry_run=args.dry_run)
    failures = staging.gpu_test(publisher, cells_of(args, grid), args.run, args.staged_record, args.attach)
    return 0 if all(why is None for why in failures) else 1


def _promote(args: argparse.Namespace) -> int:
    grid, say = _setting(args)
    staging.check_run(args.run)
    publisher = Publisher(registry_of(grid, args), grid, say, key=trust.trust_key(args.key, None))
    promoted = staging.promote(
        publisher, cells_of(args, grid), args.run, staged_record=args.staged_record, dry_run=args.dry_run
    )
    _print_published(grid, promoted)
    return 0


def _prune(args: argparse.Namespace) -> int:
    grid, say = _setting(args)
    # With --key, which passes the team signed is checked; without, any statement counts as signed.
    prune.prune(registry_of(grid, args), grid, cells_of(args, grid), say, trust.trust_key(args.key, None), args.dry_run)
    return 0


def _print_published(grid: Matrix, items: list[Publication]) -> None:
    for item in items:
        state = "unchanged" if item.unchanged and not item.moved_aliases else "published"
        where = f" ({item.cell.platform} {item.target} {item.digest})" if item.tag_digest else ""
        console.print(
            f"{item.cell.name}: {state} {grid.spec.registry}/{grid.spec.repository}:{item.cell.tag} "
            f"{item.points_to}{where}"
        )
