"""What a gate may believe when the team's key is in play: only statements that key signed.

Anyone who can push to the registry can attach a report (a made-up GPU pass, a staged image
swapped for another); nobody without the private key can sign one. So with a key, promote and
the GPU stage read a staged image's evidence from the DSSE envelopes on its digest alone: each
must verify with the key, name exactly that manifest digest and image ID as its subject, and the
signed provenance must name the image's build ID and this checkout's locks. Unsigned reports
and envelopes from other keys are ignored, not counted.

Rebuilds are the exception: the team's key never vouches for a rebuild (a compromised stage could
sign its own). Each rebuilder of publish.rebuilders signs with a key of its own, and the quorum
counts distinct keys whose rebuild gave the staged image's ID (agreeing_rebuilds).

The key: `--key FILE` (a PEM public key), else TORCH_IMAGES_VERIFY_KEY (the PEM text, a CI
variable), else the public half of the signing key when one is set (whoever signs trusts its
own signatures).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from securesystemslib.signer import CryptoSigner, SSlibKey

from builder import confined, terminal
from builder.errors import UserError
from builder.oci.registry import Manifest
from builder.plan.cell import Cell
from builder.plan.matrix import Matrix
from builder.publish import attachments, existing, provenance

KEY_ENVIRONMENT = "TORCH_IMAGES_VERIFY_KEY"  # a PEM public key, for CI's variables


def trust_key(path: Path | None, signer: CryptoSigner | None) -> SSlibKey | None:
    """The key the gates trust: --key, else TORCH_IMAGES_VERIFY_KEY, else the signer's own
    public key; None when none of them is set (the gates then read unsigned reports, and say so)."""
    if path is not None:
        return provenance.load_public_key(path)
    text = os.environ.get(KEY_ENVIRONMENT)
    if text:
        return provenance.public_key_from_pem(text.encode(), KEY_ENVIRONMENT)
    if signer is not None:
        return signer.public_key
    return None


@dataclass(frozen=True)
class Rebuilder:
    """A party of the rebuild quorum: its name in publish.rebuilders and its public key."""

    name: str
    key: SSlibKey


def rebuilders(grid: Matrix, team: SSlibKey | None) -> list[Rebuilder]:
    """publish.rebuilders with their keys, read from the checkout (never through a link). The team's
    own key among them is refused, as is one key under two names: either would let one party count
    for two."""
    found: list[Rebuilder] = []
    for name, relative in grid.spec.publish.rebuilders.items():
        where = f"publish.rebuilders.{name}"
        path = confined.inside(grid.path.resolve().parent, relative, where)
        data = confined.read_bytes(path, provenance.MAX_KEY_BYTES)
        key = provenance.public_key_from_pem(data, f"{where} ({relative})")
        if team is not None and key.keyid == team.keyid:
            raise UserError(f"{where} is the team's own key; a rebuild counts only under a rebuilder's own key")
        twin = next((r.name for r in found if r.key.keyid == key.keyid), None)
        if twin is not None:
            raise UserError(f"{where} is the same key as publish.rebuilders.{twin}; one key counts once")
        found.append(Rebuilder(name, key))
    return found


def rebuilder_key_note(grid: Matrix, signer: CryptoSigner, team: SSlibKey | None) -> str | None:
    """A rebuild is signed with a rebuilder's own key: the team's is refused; one that
    publish.rebuilders does not list gets a note (promote will not count it), else None."""
    mine = signer.public_key.keyid
    if team is not None and mine == team.keyid:
        raise UserError("the signing key is the team's; a rebuild counts only under a rebuilder's own key "
                        "(publish.rebuilders)")  # fmt: skip
    if all(r.key.keyid != mine for r in rebuilders(grid, team)):
        return "note: the signing key is not in publish.rebuilders: promote will not count this rebuild until it is"
    return None


def agreeing_rebuilds(door: attachments.Door, digest: str, image_id: str, quorum: list[Rebuilder]) -> dict[str, str]:
    """Rebuilder name -> the builder its signed rebuild names, for each rebuilder whose own key
    signed a rebuild of exactly this digest that gave `image_id`. One key counts once, however
    many statements or engine names it signed."""
    agreed: dict[str, str] = {}
    for rebuilder in quorum:
        for signed in door.signed(digest, image_id, rebuilder.key, provenance.MAX_VERIFIED):
            engine = provenance.rebuild_engine(signed.predicate, image_id)
            if signed.predicate_type == provenance.REBUILD and engine is not None:
                agreed[rebuilder.name] = engine
                break
    return agreed


def agreement_line(agreed: dict[str, str]) -> str:
    """Who agreed, for promote's and verify's lines: `alice (Docker 29 …), bob (…)`."""
    return ", ".join(f"{name} ({terminal.quoted(engine, 80)})" for name, engine in sorted(agreed.items())) or "none"


@dataclass
class Evidence:
    """The statements `key` signed about one image: its self-test reports, and whether its
    provenance holds for this checkout (None when it does, else why not)."""

    reports: list[dict[str, Any]] = field(default_factory=list)
    provenance_problem: str | None = "no signed provenance from the trusted key"


def signed_evidence(door: attachments.Door, manifest: Manifest, image_id: str, cell: Cell | None,
                    key: SSlibKey) -> Evidence:  # fmt: skip
    """Read and check every attestation attached to `manifest`; one that does not verify, or is
    about another image, is left out. The build ID the provenance must name is the label of
    this manifest's own config (read by digest, so a tag moved meanwhile cannot change it).
    More attestations than the gates read is refused, not cut short: a cut list could hide the
    team's own behind another party's."""
    evidence = Evidence()
    build_id = existing.published_build_id(door.registry, door.repository, manifest.digest) or ""
    for signed in door.signed(manifest.digest, image_id, key, provenance.MAX_VERIFIED):
        predicate = signed.predicate
        if signed.predicate_type == provenance.SELFTEST:
            evidence.reports.append(predicate)
        elif signed.predicate_type == provenance.PROVENANCE:
            problem = provenance.provenance_problem(predicate, build_id, cell)
            if evidence.provenance_problem is not None:  # one signed provenance that holds is enough
                evidence.provenance_problem = problem
    return evidence
