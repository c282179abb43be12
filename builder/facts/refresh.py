"""`compat refresh`: read the wheels' own metadata from the indexes and rewrite the facts
(data/torch_wheels.json, data/trtllm.json) for the versions a matrix names."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from builder.config.env import expand_env
from builder.config.schema import MatrixSpec
from builder.facts import compat


@dataclass
class Refreshed:
    torch: dict[str, list[compat.TorchBuild]] = field(default_factory=dict)  # index name -> builds read
    trtllm: dict[str, str] = field(default_factory=dict)  # TensorRT-LLM version added -> the index URL it came from
    unreachable: list[str] = field(default_factory=list)  # what could not be read, and why


def refresh(spec: MatrixSpec, report: Callable[[str], None]) -> Refreshed:
    """Refresh the torch builds of every index for the matrix's torch versions and, where the
    matrix uses the trtllm flavor, read every TensorRT-LLM release the table lacks. Other
    matrices share the files, so entries of other indexes and versions are kept."""
    done = Refreshed()
    versions = set(spec.axes.torch if spec.axes else []) | {s.torch for s in spec.include if s.torch}
    wheels = compat.TorchWheels.load()
    for name, index in spec.indexes.items():
        links = [Path(expand_env(p)) for p in index.find_links]
        unread: dict[str, str] = {}
        builds = compat.read_torch_builds(sorted(versions), index.urls, [p for p in links if p.is_dir()], unread)
        wheels.table[name] = {**wheels.table.get(name, {}), **{b.key: b for b in builds}}
        wheels.unread[name] = sorted(unread)
        done.torch[name] = builds
        done.unreachable += [f"{url} ({why})" for url, why in unread.items()]
        report(f"{name}: {', '.join(f'{b.key} ({b.cuda})' for b in builds)}")
    wheels.save()
    report(f"wrote {compat.TORCH_WHEELS}")
    if spec.uses_flavor("trtllm"):
        _refresh_trtllm(spec, done, report)
    for line in sorted(set(done.unreachable)):
        report(f"not read: {line}")
    return done


def _refresh_trtllm(spec: MatrixSpec, done: Refreshed, report: Callable[[str], None]) -> None:
    """Every release of every index the matrix names: a release never changes, so only those
    the table lacks are read (about 150 small stubs the first time)."""
    table = compat.load_trtllm_table()
    for url in dict.fromkeys(url for index in spec.indexes.values() for url in index.urls):
        try:
            added = compat.read_trtllm_releases(url, table)
        except OSError as error:
            done.unreachable.append(f"{url} for tensorrt-llm ({getattr(error, 'reason', error)})")
            continue
        done.trtllm.update(dict.fromkeys((v for v in added if v in table.releases), url))
        if added:
            report(f"tensorrt-llm: read {len(added)} releases from {url}")
    compat.save_trtllm(table)
    for prerelease, kind in ((False, "newest stable"), (True, "newest pre-release")):
        if newest := table.newest(prerelease):
            report(f"tensorrt-llm {kind}: {newest.summary()}")
