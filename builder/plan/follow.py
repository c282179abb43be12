"""The matrix's `follow:` policy applied to torch's releases: which versions axes.torch should
name, and the edit to matrix.yaml that says so (its text kept, comments and all, but for that
one list)."""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml
from packaging.version import Version

from builder.config.schema import MatrixSpec
from builder.errors import UserError
from builder.facts.compat import TorchBuild, TorchWheels


@dataclass(frozen=True)
class TorchChange:
    """One release the policy asks for, why, and the axis versions it replaces (none: beside them)."""

    build: TorchBuild
    reasons: tuple[str, ...]
    replaces: tuple[str, ...] = ()

    @property
    def version(self) -> str:
        return self.build.public_version

    def line(self) -> str:
        pythons = ", ".join(self.build.pythons) or "none listed"
        instead = f", replacing {', '.join(self.replaces)}" if self.replaces else ", beside the others"
        return f"torch {self.version} (CUDA {self.build.cuda}; Pythons {pythons}): {'; '.join(self.reasons)}{instead}"


@dataclass
class TorchProposal:
    before: list[str]
    changes: list[TorchChange] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def after(self) -> list[str]:
        """axes.torch with the changes made: the replaced versions out, the new ones in, oldest first."""
        replaced = {version for change in self.changes for version in change.replaces}
        kept = [version for version in self.before if version not in replaced]
        added = [change.version for change in self.changes if change.version not in kept]
        return sorted(dict.fromkeys([*kept, *added]), key=Version)


def followed_index(spec: MatrixSpec) -> str:
    """The index whose releases the policy reads."""
    assert spec.follow is not None
    name = spec.follow.index or spec.defaults.index
    if name is None:
        raise UserError("follow: name the index whose torch releases to read (follow.index), or set defaults.index")
    return name


def propose_torch(spec: MatrixSpec, wheels: TorchWheels, releases: list[TorchBuild]) -> TorchProposal:
    """What `follow.torch` asks of axes.torch, given the index's releases (newer than the oldest
    version the axis names) and data/torch_wheels.json for the versions it names."""
    assert spec.follow is not None
    index = followed_index(spec)
    before = list(spec.axes.torch) if spec.axes else []
    proposal = TorchProposal(before)
    read = {build.public_version: build for build in releases}
    line_of: dict[str, str] = {}
    for version in before:
        builds = wheels.builds(index, version) or ([read[version]] if version in read else [])
        if builds:
            line_of[version] = builds[0].cuda
        else:
            proposal.notes.append(
                f"torch {version}: its build on {index} is neither read nor in data/ (compat refresh)"
            )
    wanted: dict[str, TorchChange] = {}

    def want(build: TorchBuild, reason: str, replaces: tuple[str, ...] = ()) -> None:
        known = wanted.get(build.public_version)
        if known is None:
            wanted[build.public_version] = TorchChange(build, (reason,), replaces)
        else:
            wanted[build.public_version] = TorchChange(build, (*known.reasons, reason), (*known.replaces, *replaces))

    if "newest-per-cuda" in spec.follow.torch:
        for cuda in sorted(set(line_of.values()) - {"cpu"}):
            of_line = tuple(v for v in before if line_of.get(v) == cuda)
            newest = _newest([b for b in releases if b.cuda == cuda])
            if newest is not None and Version(newest.public_version) > max(Version(v) for v in of_line):
                want(newest, f"the newest build for CUDA {cuda}", of_line)
    if "newest" in spec.follow.torch:
        newest = _newest(releases)
        if newest is not None and newest.public_version not in before:
            want(newest, "the newest release")
    proposal.changes = sorted(wanted.values(), key=lambda change: Version(change.version))
    return proposal


def _newest(builds: list[TorchBuild]) -> TorchBuild | None:
    return max(builds, key=lambda build: Version(build.public_version), default=None)


def with_torch_axis(text: str, versions: list[str], where: str) -> str:
    """matrix.yaml's text with axes.torch written as `versions` (a flow list in place of the old
    list, wherever and however it was written); everything else, comments included, as it was."""
    node = _torch_axis_node(text, where)
    start, end = node.start_mark.index, node.end_mark.index
    if not node.flow_style:  # a block list ends where the next key starts: cut after its last item
        end = node.value[-1].end_mark.index
    if text[start] not in "[-":
        raise UserError(
            "axes.torch is not written as a list where it stands (an alias?); write it as a list so that "
            "update --releases can change it",
            where,
        )
    return text[:start] + "[" + ", ".join(f'"{version}"' for version in versions) + "]" + text[end:]


def _torch_axis_node(text: str, where: str) -> yaml.SequenceNode:
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    axes = _value_of(root, "axes")
    torch = _value_of(axes, "torch") if axes is not None else None
    if not isinstance(torch, yaml.SequenceNode) or not torch.value:
        raise UserError("the matrix has no axes.torch list to follow releases in; add `axes: {torch: [...]}`", where)
    return torch


def _value_of(node: yaml.Node | None, key: str) -> yaml.Node | None:
    if not isinstance(node, yaml.MappingNode):
        return None
    return next((value for name, value in node.value if isinstance(name, yaml.ScalarNode) and name.value == key), None)
