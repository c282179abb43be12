"""What every publish step works with, carried as one object (as BuildOptions is for a build).

A publish, a stage, a GPU stage and a promote each talk to one registry about one matrix's
repository, report progress to one place, and may sign with the team's key or trust only what
it signed. Those travel together as a `Publisher`; the registry's attachments are reached only
through its `door` (attachments.py), where the trust rules live.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import docker
from securesystemslib.signer import CryptoSigner, SSlibKey

from builder.errors import UserError
from builder.oci.registry import Registry
from builder.plan.matrix import Matrix
from builder.publish import attachments
from builder.steps import Report


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class Publisher:
    """The registry and matrix a publish step works on, where it reports, and its keys.

    engine: the engine holding the images (None where a step reads the registry alone: promote).
    signer: the team's private key: signs only what the builder made and pushed (None: unsigned).
    key: the public key the gates trust (None: they read unsigned reports, and say so).
    dry_run: its door reads and writes nothing, saying each write it would make instead."""

    registry: Registry
    grid: Matrix
    report: Report = _quiet
    engine: docker.DockerClient | None = None
    signer: CryptoSigner | None = None
    key: SSlibKey | None = None
    dry_run: bool = False

    @property
    def repository(self) -> str:
        return self.grid.spec.repository

    @property
    def door(self) -> attachments.Door:
        """The one way to the repository's attachments (referrers)."""
        if self.dry_run:
            return attachments.DryDoor(self.registry, self.repository, self.report)
        return attachments.Door(self.registry, self.repository)

    @property
    def signing(self) -> bool:
        return self.signer is not None

    @property
    def images(self) -> docker.DockerClient:
        """The engine, for a step that needs the images themselves."""
        if self.engine is None:
            raise UserError("this publish step needs the engine that holds the images, and was given none")
        return self.engine


@dataclass(frozen=True)
class Records:
    """Where a publish writes what it did: one JSON record per tag (default: published/ beside
    the matrix) and the table of published tags in the README beside it."""

    directory: Path | None = None
    readme: Path | None = None

    def folder(self, grid: Matrix) -> Path:
        return self.directory or grid.path.resolve().parent / "published"

    def table(self, grid: Matrix) -> Path:
        return self.readme or grid.path.resolve().parent / "README.md"
