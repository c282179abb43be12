"""Publish: gated, verified pushes of versioned tags, then aliases, then a record.

Order of events, so that a failure anywhere leaves the registry consistent:
1. the gate: every image must have a passing self-test report for its exact image ID, and the
   registry must answer and accept the credentials, before anything is pushed;
2. each versioned tag is pushed by the engine and its digest read back from the registry;
3. the SBOM and the self-test report are pushed beside the image as OCI artifacts;
4. only then do aliases move, each by putting the verified manifest under the alias; if one
   fails, the aliases already moved are put back where they were;
5. a publish record is written and the README's table of published tags regenerated.
An image whose tags and aliases already point at its digest is left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors

from builder import times
from builder.build import smoke
from builder.build.build import local_reference
from builder.errors import UserError
from builder.lock import requirements as lock
from builder.plan.cell import Cell
from builder.plan.matrix import Matrix
from builder.publish import sbom
from builder.publish.registry import Manifest, Registry

TABLE_START, TABLE_END = "<!-- published-tags:start -->", "<!-- published-tags:end -->"
Report = Callable[[str], None]


@dataclass
class Publication:
    cell: Cell
    image_id: str
    report: dict[str, Any]
    digest: str = ""
    unchanged: bool = False
    moved_aliases: list[str] = field(default_factory=list)


def credentials() -> tuple[str | None, str | None]:
    return os.environ.get("TORCH_IMAGES_REGISTRY_USER"), os.environ.get("TORCH_IMAGES_REGISTRY_PASSWORD")


def gate(engine: docker.DockerClient, grid: Matrix, cells: list[Cell]) -> list[Publication]:
    """Every image must exist and have passed its self-test for exactly this image ID."""
    ready, refused = [], []
    for cell in cells:
        reference = local_reference(grid, cell)
        try:
            image_id = engine.images.get(reference).id
        except docker.errors.ImageNotFound:
            refused.append(f"{cell.name}: not built ({reference}); run `python -m builder build {cell.name}`")
            continue
        report = smoke.passing_report(image_id)
        if report is None:
            refused.append(
                f"{cell.name}: no passing self-test for image {image_id[7:19]}; "
                f"run `python -m builder smoke {cell.name}`"
            )
            continue
        ready.append(Publication(cell, image_id, report))
    if refused:
        raise UserError("refused, nothing pushed: " + " | ".join(refused))
    return ready


def _engine_push(engine: docker.DockerClient, repository: str, tag: str, auth: dict[str, str] | None) -> str:
    """Push one tag through the engine; returns the digest the engine reports."""
    digest, error = "", ""
    for chunk in engine.api.push(repository, tag=tag, stream=True, decode=True, auth_config=auth):
        if "error" in chunk:
            error = chunk["error"]
        if "aux" in chunk and "Digest" in chunk["aux"]:
            digest = chunk["aux"]["Digest"]
    if error:
        if re.search(r"unauthorized|authentication required|denied", error, re.I):
            raise UserError(f"registry refused the credentials while pushing {repository}:{tag}: {error}")
        raise UserError(f"push of {repository}:{tag} failed: {error}")
    return digest


def _push_versioned(
    engine: docker.DockerClient, registry: Registry, grid: Matrix, item: Publication, report: Report
) -> None:
    repository = f"{grid.spec.registry}/{grid.spec.repository}"
    tag = item.cell.tag
    current = registry.manifest(grid.spec.repository, tag)
    repo_digests = engine.images.get(item.image_id).attrs.get("RepoDigests") or []
    if current and f"{repository}@{current.digest}" in repo_digests:
        item.digest, item.unchanged = current.digest, True
        return
    engine.images.get(item.image_id).tag(repository, tag)
    user, password = credentials()
    auth = {"username": user, "password": password or ""} if user else None
    report(f"pushing {repository}:{tag}")
    pushed = ""
    for attempt in range(3):  # the engine retries layers itself; this covers a dropped connection
        try:
            pushed = _engine_push(engine, repository, tag, auth)
            break
        except UserError as error:
            if "credentials" in error.message or attempt == 2:
                raise
            report(f"push interrupted ({error.message}); retrying")
    verified = registry.manifest(grid.spec.repository, tag)
    if verified is None or (pushed and verified.digest != pushed):
        raise UserError(
            f"{repository}:{tag}: the registry holds {verified.digest if verified else 'nothing'}, "
            f"the engine pushed {pushed}; aliases left where they were"
        )
    item.digest = verified.digest


def _push_metadata(engine: docker.DockerClient, registry: Registry, grid: Matrix, item: Publication) -> None:
    locks = [p for p in (item.cell.directory / lock.STACK_LOCK, item.cell.directory / lock.FLAVOR_LOCK) if p.exists()]
    document = sbom.build_sbom(engine, item.image_id, item.cell, locks, item.cell.tag)
    annotations = {"org.opencontainers.image.ref.name": item.cell.tag, "io.torch-images.subject": item.digest}
    registry.push_artifact(
        grid.spec.repository, f"{item.cell.tag}.sbom", json.dumps(document, sort_keys=True).encode(),
        "application/vnd.cyclonedx+json", annotations,
    )  # fmt: skip
    selftest = {k: v for k, v in item.report.items() if k != "table"}
    registry.push_artifact(
        grid.spec.repository, f"{item.cell.tag}.selftest", json.dumps(selftest, sort_keys=True).encode(),
        "application/vnd.torch-images.selftest.v1+json", annotations,
    )  # fmt: skip


def _move_aliases(registry: Registry, grid: Matrix, items: list[Publication], report: Report) -> None:
    repository = grid.spec.repository
    previous: list[tuple[str, Manifest | None]] = []
    try:
        for item in items:
            target = registry.manifest(repository, item.cell.tag)
            if target is None or target.digest != item.digest:
                raise UserError(f"{repository}:{item.cell.tag} changed while publishing; aliases left where they were")
            for alias in item.cell.aliases:
                before = registry.manifest(repository, alias)
                if before and before.digest == item.digest:
                    continue
                registry.put_manifest(repository, alias, target)
                previous.append((alias, before))  # only aliases that did move need putting back
                item.moved_aliases.append(alias)
                report(f"moved {alias} -> {item.digest[:19]}")
    except UserError:
        for alias, before in reversed(previous):
            if before is not None:
                with contextlib.suppress(UserError):  # put back as many as the registry takes
                    registry.put_manifest(repository, alias, before)
        raise


def publish(
    engine: docker.DockerClient,
    grid: Matrix,
    cells: list[Cell],
    report: Report = print,
    records_dir: Path | None = None,
    readme: Path | None = None,
) -> list[Publication]:
    """Publish the cells; records go to published/ beside the matrix file, and the table of
    published tags into the README.md beside it (where that README has the table's markers)."""
    records_dir = records_dir or grid.path.resolve().parent / "published"
    readme = readme or grid.path.resolve().parent / "README.md"
    items = gate(engine, grid, cells)
    registry = Registry(grid.spec.registry, *credentials())
    registry.check()
    for item in items:
        _push_versioned(engine, registry, grid, item, report)
    for item in items:
        if not item.unchanged:
            _push_metadata(engine, registry, grid, item)
    _move_aliases(registry, grid, items, report)
    for item in items:
        if not item.unchanged or item.moved_aliases:
            write_record(grid, item, records_dir)
    update_readme_table(readme, records_dir)
    return items


def write_record(grid: Matrix, item: Publication, records_dir: Path) -> Path:
    checks = item.report.get("checks", [])
    record = {
        "cell": item.cell.name,
        "repository": f"{grid.spec.registry}/{grid.spec.repository}",
        "tags": [item.cell.tag, *item.cell.aliases],
        "digest": item.digest,
        "image_id": item.image_id,
        "selftest": {
            "status": item.report.get("status"),
            "device": item.report.get("device"),
            "passed": sum(1 for c in checks if c["status"] == "pass"),
            "checks": len(checks),
        },
        "sbom": f"{item.cell.tag}.sbom",
        "published": times.iso_utc(time.time()),
    }
    records_dir.mkdir(parents=True, exist_ok=True)
    path = records_dir / f"{item.cell.name}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def update_readme_table(readme: Path, records_dir: Path) -> None:
    if not readme.exists() or TABLE_START not in readme.read_text():
        return
    records = [json.loads(p.read_text()) for p in sorted(records_dir.glob("*.json"))] if records_dir.is_dir() else []
    if not records:
        return
    rows = ["| tag | aliases | digest | self-test |", "|---|---|---|---|"]
    for record in records:
        tag, *aliases = record["tags"]
        selftest = record["selftest"]
        rows.append(
            f"| `{record['repository']}:{tag}` | {', '.join(f'`{a}`' for a in aliases) or '-'} | "
            f"`{record['digest'][:19]}` | {selftest['status']} "
            f"({selftest['passed']}/{selftest['checks']} on {selftest['device']}) |"
        )
    text = readme.read_text()
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    readme.write_text(text[:start] + "\n" + "\n".join(rows) + "\n" + text[end:])
