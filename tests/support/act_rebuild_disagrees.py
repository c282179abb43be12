"""The act test's stand-in for a rebuild that disagrees: in place of the rebuild job's
`publish stage-rebuild` step, push under the run's rebuild tag an image that is not the staged
one (the staged layers under another config, as a nondeterministic or tampered build would give),
and write the record stage-rebuild writes. sign-rebuild, which builds nothing and holds the
rebuilder's key, must then refuse to sign, and no tag move.

Run as the step would: `.nox/builder/bin/python tests/support/act_rebuild_disagrees.py CELL`, with
IMAGE (REGISTRY/REPOSITORY), GITHUB_RUN_ID, REGISTRY_USER and REGISTRY_PASSWORD set, in the job's
checkout."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from builder.oci.registry import Manifest, Registry
from builder.plan import matrix
from builder.publish import staging
from builder.publish.publisher import Publisher
from builder.publish.rebuilds import rebuild_tag


def main(cell_name: str) -> int:
    host, _, repository = os.environ["IMAGE"].partition("/")
    registry = Registry(
        host, Registry.login(os.environ["REGISTRY_USER"], os.environ["REGISTRY_PASSWORD"]), retries=1, backoff_s=0.1
    )
    grid = matrix.load_matrix(Path("matrix.yaml"))
    cell, run = grid.cell(cell_name), os.environ["GITHUB_RUN_ID"]
    staged = registry.manifest(repository, staging.staging_tag(grid, cell, run))
    assert staged is not None, "the cell job staged nothing"
    document = json.loads(staged.body)
    config = json.loads(registry.blob(repository, document["config"]["digest"]))
    config.setdefault("config", {}).setdefault("Labels", {})["act.stand-in"] = "another image"
    body = json.dumps(config, sort_keys=True).encode()
    document["config"] = {**document["config"], "digest": registry.upload_blob(repository, body), "size": len(body)}
    tag = rebuild_tag(Publisher(registry, grid), cell, run)
    pushed = Manifest.of(json.dumps(document).encode(), staged.media_type)
    registry.put_manifest(repository, tag, pushed)
    record = {"tag": tag, "digest": pushed.digest, "cell": cell.name, "builder": "act stand-in (disagrees)"}
    Path("rebuilt").mkdir(exist_ok=True)
    Path("rebuilt", f"{tag}.json").write_text(json.dumps(record) + "\n")
    print(f"pushed as {tag} an image that is not the staged one: {document['config']['digest'][:19]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
