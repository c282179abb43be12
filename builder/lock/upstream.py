"""`update --releases`: what upstream released that the matrix's `follow:` policy asks for, as a
proposal a pull request carries: torch versions for axes.torch (the matrix edited, its new cells
listed with what each needs) and bases for new distro releases (text only, never added unasked)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path

from packaging.version import Version

from builder.config.schema import MatrixSpec
from builder.errors import UserError
from builder.facts import compat, pypi, releases
from builder.facts.compat import TorchWheels
from builder.lock import distros
from builder.plan import follow, matrix
from builder.plan.cell import Cell


@dataclass
class Proposal:
    """What the policy asks for, and the matrix text that says it."""

    torch: follow.TorchProposal | None = None
    matrix_text: str | None = None  # the edited matrix.yaml; None: it stays as it is
    new_cells: list[Cell] = field(default_factory=list)
    not_buildable: list[matrix.Rejected] = field(default_factory=list)
    bases: list[distros.ProposedBase] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)  # what could not be read, and why

    @property
    def changes_matrix(self) -> bool:
        return self.matrix_text is not None

    def lines(self) -> list[str]:
        """The proposal, a line each: for the terminal, and the pull request's items."""
        found = [change.line() for change in self.torch.changes] if self.torch else []
        if self.torch and self.torch.changes:
            found.append(f"axes.torch: {', '.join(self.torch.before)} -> {', '.join(self.torch.after)}")
        found += [f"new cell {_needs(cell)}" for cell in self.new_cells]
        found += [f"not buildable: {rejected.name}: {rejected.reason}" for rejected in self.not_buildable]
        found += [
            f"new base proposed (not added): {b.release.distro} {b.release.version} {b.release.codename}, glibc "
            f"{b.glibc}, Python {b.python}"
            for b in self.bases
        ]
        found += [f"note: {note}" for note in self.torch.notes] if self.torch else []
        found += [f"not read: {what}" for what in self.unread]
        return found

    def markdown(self) -> str:
        """The pull request's text: what is new, what each new cell needs, and each proposed base's
        entry to paste into matrix.yaml."""
        if not self.lines():
            return "No new upstream release that `follow:` asks for.\n"
        text = ["`update --releases` found these upstream releases that the matrix's `follow:` policy asks for.", ""]
        text += [f"- {line}" for line in self.lines()]
        for base in self.bases:
            text += ["", f"A base for {base.release.codename}, to add to `bases:` and name in cells if wanted:", "",
                     "```yaml", base.yaml(), "```"]  # fmt: skip
        if self.changes_matrix:
            text += ["", "Merging builds, tests and publishes the new cells as usual; no tag moved here."]
        return "\n".join(text) + "\n"


def _needs(cell: Cell) -> str:
    cuda = "CPU" if cell.torch.cuda == "cpu" else f"CUDA {cell.torch.cuda}"
    torch = f"torch {cell.torch.public_version} ({cuda})"
    return f"{cell.name}: {torch}, Python {cell.python}, base {cell.base.name}, {cell.flavor}"


MetadataReader = Callable[[pypi.WheelFile], Message]


def propose(
    path: Path,
    spec: MatrixSpec,
    metadata_of: MetadataReader = pypi.wheel_metadata,
    read_distros: bool = True,
) -> Proposal:
    """Read upstream as the matrix's `follow:` says and propose; nothing is written."""
    assert spec.follow is not None
    proposal = Proposal()
    if spec.follow.torch:
        _propose_torch(path, spec, proposal, metadata_of)
    if spec.follow.distros and read_distros:
        _propose_bases(spec, proposal)
    return proposal


def _propose_torch(path: Path, spec: MatrixSpec, proposal: Proposal, metadata_of: MetadataReader) -> None:
    index_name = follow.followed_index(spec)
    index = spec.indexes[index_name]
    wheels = TorchWheels.load()
    known = {build.key: build for build in wheels.table.get(index_name, {}).values()}
    before = list(spec.axes.torch) if spec.axes else []
    oldest = min(before, key=Version) if before else "0"
    read: list[compat.TorchBuild] = []
    for url in index.urls:
        try:
            read = releases.read_releases(url, known, oldest, metadata_of)
            break
        except OSError as error:
            proposal.unread.append(f"{url} ({getattr(error, 'reason', error)})")
    proposal.torch = follow.propose_torch(spec, wheels, read)
    if not proposal.torch.changes:
        return
    text = path.read_text()
    proposal.matrix_text = follow.with_torch_axis(text, proposal.torch.after, str(path))
    wheels.table[index_name] = {**wheels.table.get(index_name, {}), **{b.key: b for b in read}}
    _list_new_cells(path, proposal, wheels)


def _list_new_cells(path: Path, proposal: Proposal, wheels: TorchWheels) -> None:
    """The edited matrix planned with the releases' facts: its cells of the new versions, and
    those of its combinations that cannot be built, with why."""
    assert proposal.torch is not None and proposal.matrix_text is not None
    added = {change.version for change in proposal.torch.changes}
    with tempfile.TemporaryDirectory(prefix="torch-images-follow-") as scratch:
        edited = Path(scratch) / path.name
        edited.write_text(proposal.matrix_text)
        try:
            grid = matrix.load_matrix(edited, wheels)
        except UserError as error:
            raise UserError(f"the proposed matrix does not plan: {error.message}", path) from None
    proposal.new_cells = [cell for cell in grid.cells if cell.torch.public_version in added]
    proposal.not_buildable = [r for r in grid.rejected if r.selector.get("torch") in added]


def _propose_bases(spec: MatrixSpec, proposal: Proposal) -> None:
    """For each followed distro: its newest release, where no base of it names that suite and it
    is newer than every base of it the matrix has."""
    assert spec.follow is not None
    for distro in spec.follow.distros:
        named = {name: base for name, base in spec.bases.items() if base.distro == distro}
        if not named:
            proposal.unread.append(f"{distro}: no base of the matrix is one, so none says how to read its archive")
            continue
        template = matrix.base_image(*max(named.items(), key=lambda item: Version(item[1].glibc)))
        try:
            release = distros.newest_release(template)
            if release.codename in {base.suite for base in named.values()}:
                continue
            proposal.bases.append(distros.propose(template, release))
        except UserError as error:
            proposal.unread.append(f"{distro} ({error.line()})")
