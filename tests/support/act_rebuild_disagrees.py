"""The act test's stand-in for a rebuild that disagrees: in place of the rebuild job's step, sign
with the rebuilder's key (TORCH_IMAGES_REBUILD_KEY) a rebuild statement about each staged digest
that names another image ID than the staged one. Promote must then refuse, and no tag move.

Run as the step would: `.nox/builder/bin/python tests/support/act_rebuild_disagrees.py`, with
IMAGE (REGISTRY/REPOSITORY), REGISTRY_USER and REGISTRY_PASSWORD set, in the job's checkout
where `staged/` holds what the cell job staged."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from builder.oci.registry import Registry
from builder.publish import attachments, provenance

OTHER_IMAGE = "sha256:" + "d" * 64


def main() -> int:
    host, _, repository = os.environ["IMAGE"].partition("/")
    registry = Registry(host, os.environ["REGISTRY_USER"], os.environ["REGISTRY_PASSWORD"], retries=1, backoff_s=0.1)
    signer = provenance.load_signer(None, provenance.REBUILD_KEY_ENVIRONMENT)
    assert signer is not None, "TORCH_IMAGES_REBUILD_KEY is not set"
    for record in sorted(Path("staged").glob("*.json")):
        staged = json.loads(record.read_text())
        manifest = registry.manifest(repository, staged["tag"])
        assert manifest is not None and manifest.digest == staged["digest"], staged
        about = provenance.Subject(f"{host}/{repository}", manifest.digest, OTHER_IMAGE, "0" * 32)
        statement = provenance.rebuild_statement(about, "act stand-in (disagrees)", "test", "2026-12-07T00:00:00Z")
        attachments.Door(registry, repository).attach_statement(
            manifest, f"{staged['tag']}.rebuild-disagrees", statement, signer
        )
        print(f"signed a rebuild of {manifest.digest[:19]} that names image {OTHER_IMAGE[:19]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
