"""The one door between publish/ and what a registry keeps about an image's digest: its
attachments (OCI referrers: SBOMs, self-test reports, signed statements, SOCI indexes).

Publish reads them back to decide what a digest still lacks, what a gate may believe and what
prune may delete, and writes them when it attaches. Every such read and write goes through a
`Door`, so that the trust rules of publishing live here and nowhere else:

- A listing is a hint, never proof. The referrers API answers what was pushed with a subject,
  and the referrers tag (`sha256-<hex>`) is a plain tag anyone who can push may rewrite. An
  attachment counts as the digest's only when its own manifest, read by its digest, is of the
  type asked for, carries one document, and names that digest as its subject (`proven`).
- A signed statement counts only when the key verifies it about exactly this digest and image
  ID (`signed`); what the key does not verify is left out, never counted.
- A listing longer than a reader reads is said in one line (`at_most`): a cut list could hide
  the team's own statement behind another party's flood.
- What is deleted is only what was proven (`delete` takes `Attachment`s and nothing else).
- What is attached is what the builder made: `attach` pushes bytes handed to it, with the
  subject's manifest as the registry serves it by digest.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from securesystemslib.signer import CryptoSigner, SSlibKey

from builder import verdict
from builder.errors import UserError
from builder.oci.registry import DIGEST, Manifest, Registry
from builder.publish import cosign_tag, provenance, reports, tags


@dataclass(frozen=True)
class Attachment:
    """An artifact proven to be attached to `subject`: its manifest, read by its own digest,
    is of `artifact_type`, carries one document, and names `subject` as its subject."""

    digest: str
    subject: str
    artifact_type: str
    manifest: dict[str, Any]

    @property
    def layer(self) -> str:
        """The digest of the one document it carries."""
        return str(self.manifest["layers"][0].get("digest", ""))


@dataclass(frozen=True)
class Signed:
    """A proven attestation and the statement its envelope carries: verified with the key where
    one was given, else only decoded (`verified` False)."""

    attachment: Attachment
    envelope: dict[str, Any]
    statement: dict[str, Any]
    verified: bool

    @property
    def predicate_type(self) -> str:
        return str(self.statement.get("predicateType"))

    @property
    def predicate(self) -> dict[str, Any]:
        predicate = self.statement.get("predicate")
        return predicate if isinstance(predicate, dict) else {}


class Door:
    """The registry's attachments in one repository, read with proof and written by digest."""

    def __init__(self, registry: Registry, repository: str) -> None:
        self.registry = registry
        self.repository = repository

    # Listings: hints, for counting and for choosing what to prove.

    def listed(self, subject: str, types: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """The referrer entries of `subject`, of any type or of `types` (unproven)."""
        if types is None:
            return self.registry.referrers(self.repository, subject)
        entries: list[dict[str, Any]] = []
        for artifact_type in types:
            entries += self.registry.referrers(self.repository, subject, artifact_type)
        return entries

    def at_most(self, entries: list[dict[str, Any]], most: int, subject: str, what: str, remedy: str) -> None:
        """Refuse, in one line, a listing longer than a reader reads: never silently cut short."""
        if len(entries) > most:
            raise UserError(f"{subject[:19]} carries {len(entries)} {what}, more than the {most} read; {remedy}")

    # Proof: what counts.

    def prove(self, subject: str, artifact: str, types: Iterable[str]) -> Attachment | None:
        """The artifact as an Attachment of `subject` when its manifest proves it one of `types`;
        None when it does not, or cannot be read (what is not proven is neither read nor deleted)."""
        try:
            return self.read(subject, artifact, types)
        except UserError:
            return None

    def read(self, subject: str, artifact: str, types: Iterable[str]) -> Attachment:
        """The artifact as an Attachment of `subject`, or one line saying why it is not one: not
        a digest, not served, not one document, of another type, or about another digest."""
        if not DIGEST.fullmatch(artifact):
            raise UserError(f"a listed artifact {artifact[:80]!r} is not named by a sha256 digest")
        manifest = self.registry.artifact_manifest(self.repository, artifact)
        named = manifest.get("subject")
        layer = manifest["layers"][0]
        kind = manifest.get("artifactType") or (layer.get("mediaType") if isinstance(layer, dict) else None)
        if not isinstance(named, dict) or named.get("digest") != subject:
            raise UserError(f"artifact {artifact[:19]} belongs to another digest")
        if kind not in set(types):
            raise UserError(f"artifact {artifact[:19]} is not of a type listed for it")
        return Attachment(artifact, subject, str(kind), manifest)

    def proven(self, subject: str, entries: list[dict[str, Any]], types: Iterable[str]) -> list[Attachment]:
        """Those of the listed entries that prove to be `subject`'s attachments of `types`."""
        wanted = tuple(types)
        # A digest proves once, however often a listing (the referrers tag anyone who can push may
        # rewrite) names it: one artifact is never two reports or two votes.
        unique = dict.fromkeys(str(entry.get("digest", "")) for entry in entries)
        found = (self.prove(subject, digest, wanted) for digest in unique)
        return [attachment for attachment in found if attachment is not None]

    def document(self, attachment: Attachment, limit: int) -> dict[str, Any]:
        """The JSON document an attachment carries, at most `limit` bytes, checked by its digest."""
        return self.registry.artifact_document(self.repository, attachment.manifest, limit)

    def carries(self, subject: str, artifact_type: str, payload: bytes, most: int) -> bool:
        """Whether `subject` has an attachment of the type that carries exactly `payload` (the
        first `most` listed are tried: this looks for one of the builder's own, not for all)."""
        wanted = "sha256:" + hashlib.sha256(payload).hexdigest()
        entries = self.listed(subject, [artifact_type])[:most]
        return any(found.layer == wanted for found in self.proven(subject, entries, [artifact_type]))

    def signed(self, subject: str, image_id: str, key: SSlibKey | None, most: int) -> list[Signed]:
        """The attestations proven attached to `subject`, each with its statement: with a key,
        only those it verifies about exactly this digest and image ID; without, each one that
        decodes (for what it says, never for trust). More than `most` listed is refused."""
        entries = self.listed(subject, provenance.SIGNED_TYPES)
        self.at_most(entries, most, subject, "attestations", "remove the ones that are not the team's "
                     "(publish prune)")  # fmt: skip
        found = []
        for attachment in self.proven(subject, entries, provenance.SIGNED_TYPES):
            try:
                document = self.document(attachment, provenance.MAX_ENVELOPE_BYTES)
                envelope = provenance.envelope_of(document, attachment.artifact_type)
                if key is not None:
                    statement = provenance.verified_statement(document, attachment.artifact_type, key, subject,
                                                              image_id)  # fmt: skip
                else:
                    statement = provenance.decoded_statement(envelope, attachment.digest)
            except (UserError, ValueError, LookupError, AttributeError):
                continue
            if isinstance(statement, dict) and isinstance(statement.get("predicate"), dict):
                found.append(Signed(attachment, envelope, statement, key is not None))
        return found

    def verified_kinds(self, subject: str, image_id: str, key: SSlibKey) -> set[str]:
        """The predicate types of the statements `key` signed about exactly this digest and image
        ID: what a digest carries, decided by verifying envelopes, never by what annotations claim."""
        return {found.predicate_type for found in self.signed(subject, image_id, key, provenance.MAX_VERIFIED)}

    def reports(self, subject: str) -> list[dict[str, Any]]:
        """Every self-test report proven attached to `subject` (each capped; more than
        reports.MAX_REPORTS listed is refused), unsigned: what the gate reads without a key."""
        kind = [reports.SELFTEST_TYPE]
        entries = self.listed(subject, kind)
        self.at_most(entries, reports.MAX_REPORTS, subject, "self-test reports",
                     "remove the stale ones (publish prune)")  # fmt: skip
        return [self.document(found, verdict.MAX_REPORT_BYTES) for found in self.proven(subject, entries, kind)]

    # Writes: what the builder made, attached by digest.

    def attach(
        self, subject: Manifest, tag: str, payload: bytes, artifact_type: str, annotations: dict[str, str]
    ) -> str:
        """Push `payload` as an artifact of `subject` (under `tag` too); returns its digest."""
        return self.registry.push_artifact(self.repository, tag, payload, artifact_type, annotations, subject)

    def attach_report(self, subject: Manifest, target: str, report: dict[str, Any], build_id: str, tag: str) -> str:
        """One self-test report attached to `subject`, beside whatever reports it already has."""
        annotations = reports.artifact_annotations(report, build_id, tag)
        name = reports.artifact_tag(target, report)
        return self.attach(subject, name, reports.document_bytes(report), reports.SELFTEST_TYPE, annotations)

    def attach_statement(self, subject: Manifest, tag: str, statement: dict[str, Any], signer: CryptoSigner) -> str:
        """Sign `statement` and attach it as a Sigstore bundle to `subject` (under `tag` too), and
        the bundle's envelope in cosign 2's `.att` manifest of the digest (cosign_tag), so both
        forms say the same thing, signed once. Returns the bundle artifact's digest."""
        predicate_type = str(statement["predicateType"])
        annotations = {
            provenance.PREDICATE_ANNOTATION: predicate_type,
            "dev.sigstore.bundle.content": "dsse-envelope",  # what cosign writes and reads
            provenance.COSIGN_PREDICATE_ANNOTATION: predicate_type,
        }
        bundle = provenance.bundle_document(statement, signer)
        body = json.dumps(bundle, sort_keys=True).encode()
        digest = self.attach(subject, tag, body, provenance.BUNDLE_TYPE, annotations)
        cosign_tag.append(self.registry, self.repository, subject.digest, bundle["dsseEnvelope"], predicate_type)
        return digest

    def attach_signed_report(
        self, subject: Manifest, target: str, about: provenance.Subject, report: dict[str, Any], signer: CryptoSigner
    ) -> str:
        """A self-test report as two signed statements about `about`, attached beside the report:
        the full report (`<tag>.selftest.att`, `<tag>.selftest-gpu-<model>.att`), which the gates
        read, and in-toto's test result naming it by digest (`....result.att`), which policies
        read. Returns the first's digest."""
        name = reports.artifact_tag(target, report)
        result = provenance.test_result_statement(about, report)
        self.attach_statement(subject, tags.fitted(f"{name}.result.att"), result, signer)
        selftest = provenance.selftest_statement(about, report)
        return self.attach_statement(subject, tags.fitted(f"{name}.att"), selftest, signer)

    def attach_manifest(self, subject: str, manifest: Manifest, artifact_type: str) -> None:
        """Put a manifest the builder made whose `subject` is `subject` (a SOCI index), by digest."""
        self.registry.put_referrer(self.repository, manifest, subject, artifact_type, {})

    def delete(self, subject: str, attachments: list[Attachment], envelopes: set[str] | None = None) -> None:
        """Delete proven attachments of `subject`, take them out of its referrers tag, and take
        the `envelopes` (by the digest of their layer) out of cosign 2's `.att` manifest."""
        strangers = [a.digest for a in attachments if a.subject != subject]
        if strangers:
            raise UserError(f"{strangers[0][:19]} is not proven {subject[:19]}'s; nothing deleted")
        for attachment in attachments:
            self.registry.delete_manifest(self.repository, attachment.digest)
        self.registry.drop_from_referrers_tag(self.repository, subject, {a.digest for a in attachments})
        cosign_tag.remove(self.registry, self.repository, subject, envelopes or set())


class DryDoor(Door):
    """A door that reads as Door does and writes nothing: each write it is asked for becomes a line
    (`dry run: would ...`) through `report`, so a dry run makes exactly the decisions a run would."""

    def __init__(self, registry: Registry, repository: str, report: Callable[[str], None]) -> None:
        super().__init__(registry, repository)
        self.report = report

    def attach(
        self, subject: Manifest, tag: str, payload: bytes, artifact_type: str, annotations: dict[str, str]
    ) -> str:
        self.report(f"dry run: would attach {tag} ({artifact_type}) to {subject.digest[:19]}")
        return "sha256:" + hashlib.sha256(payload).hexdigest()

    def attach_statement(self, subject: Manifest, tag: str, statement: dict[str, Any], signer: CryptoSigner) -> str:
        self.report(f"dry run: would sign and attach {tag} ({statement['predicateType']}) to {subject.digest[:19]}")
        return "sha256:" + hashlib.sha256(json.dumps(statement, sort_keys=True).encode()).hexdigest()

    def attach_manifest(self, subject: str, manifest: Manifest, artifact_type: str) -> None:
        self.report(f"dry run: would attach {manifest.digest[:19]} ({artifact_type}) to {subject[:19]}")

    def delete(self, subject: str, attachments: list[Attachment], envelopes: set[str] | None = None) -> None:
        for attachment in attachments:
            self.report(f"dry run: would delete {attachment.digest[:19]} from {subject[:19]}")
