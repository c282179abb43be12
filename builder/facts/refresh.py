"""`compat refresh`: read the wheels' own metadata from the indexes and rewrite the facts
(data/torch_wheels.json, data/trtllm.json) for the versions a matrix names."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from builder.facts import compat
from builder.spec.env import expand_env
from builder.spec.schema import MatrixSpec


@dataclass
class Refreshed:
    torch: dict[str, list[compat.TorchBuild]] = field(default_factory=dict)  # index name -> builds read
    trtllm: dict[str, str] = field(default_factory=dict)  # TensorRT-LLM version -> the index URL it came from
    unreachable: list[str] = field(default_factory=list)  # what could not be read, and why


def refresh(spec: MatrixSpec, report: Callable[[str], None]) -> Refreshed:
    """Refresh the torch builds of every index for the matrix's torch versions, and add the
    TensorRT-LLM releases it names that the table lacks. Other matrices share the files, so
    entries of other indexes and versions are kept."""
    done = Refreshed()
    versions = set(spec.axes.torch if spec.axes else []) | {s.torch for s in spec.include if s.torch}
    table = compat.TorchWheels.load().table
    for name, index in spec.indexes.items():
        links = [Path(expand_env(p)) for p in index.find_links]
        builds = compat.read_torch_builds(
            sorted(versions), index.urls, [p for p in links if p.is_dir()], done.unreachable
        )
        table[name] = {**table.get(name, {}), **{b.version: b for b in builds}}
        done.torch[name] = builds
        report(f"{name}: {', '.join(b.version + ' (' + b.cuda + ')' for b in builds)}")
    compat.TorchWheels(table).save()
    report(f"wrote {compat.TORCH_WHEELS}")
    releases = compat.load_trtllm()
    wanted = {s.trtllm for s in spec.include if s.trtllm} - set(releases)
    urls = [url for index in spec.indexes.values() for url in index.urls]
    for version in sorted(wanted):
        for url in urls:
            try:
                releases[version] = compat.read_trtllm_release(version, url)
                done.trtllm[version] = url
                report(f"tensorrt-llm {version}: torch {releases[version].torch}, from {url}")
                break
            except OSError as error:
                done.unreachable.append(f"{url} for tensorrt-llm {version} ({getattr(error, 'reason', error)})")
    if releases:
        compat.save_trtllm(releases)
    for line in sorted(set(done.unreachable)):
        report(f"not read: {line}")
    return done
