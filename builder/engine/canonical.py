"""The builder's one tar encoding for image layers: what makes an image ID the same on every engine.

Docker 20.10, Docker 29 with overlay2 and Docker 29 with the containerd image store write the same
files into a layer, in the same order, with different tar headers (type bits in the mode field or
not, user and group names or not) and different entry sets (overlay2's differ writes the
unchanged parent directories of a changed file and an opaque marker for every directory made
afresh; containerd's differ writes neither). This module rewrites a layer into one encoding,
streaming: the file contents are copied through untouched, only headers and the entry set change.
docs/reproducible-builds.md states the encoding; in short:

- entries in walk order: depth first, a directory's entries in byte order of their names (the
  order every engine's differ walks in; a layer in another order is sorted, through a spool file);
- one 512-byte ustar header per entry, preceded by a pax header ("././@PaxHeader") only where a
  value needs one (a name or link target over 100 bytes, an extended attribute, a size, id or
  time too large for its field), its records sorted by key;
- the mode's permission bits only (07777), numeric owner ids, no user or group names, the
  modification time in whole seconds clamped to SOURCE_DATE_EPOCH, no access or change times;
- a directory that the layers below already hold with the same mode, owners, time and extended
  attributes is left out, and so is an opaque marker (`.wh..wh..opq`) of a directory that the
  layers below do not hold anything under: neither changes the file system the layers make;
- no root entry; the archive ends with two zero blocks.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NamedTuple

from builder.errors import UserError

BLOCK = 512
CHUNK = 1 << 20
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
# Entry types kept: regular file, hard link, symbolic link, character and block device, directory, FIFO.
REGULAR, HARDLINK, SYMLINK, CHARDEV, BLOCKDEV, DIRECTORY, FIFO = b"0", b"1", b"2", b"3", b"4", b"5", b"6"
KINDS = {REGULAR, HARDLINK, SYMLINK, CHARDEV, BLOCKDEV, DIRECTORY, FIFO}
XATTR = "SCHILY.xattr."


class OutOfOrder(Exception):
    """A layer whose entries are not in walk order: sorted through a spool file instead."""


class LinkTargetsDropped(Exception):
    """A layer whose hard links name files it left out as unchanged (a step linked a file of a
    lower layer, which the engine copied up unchanged): written again with those files kept."""

    def __init__(self, names: frozenset[str]) -> None:
        super().__init__(", ".join(sorted(names)))
        self.names = names


Metadata = tuple[bytes, int, int, int, int, tuple[tuple[str, bytes], ...], int, str, int, int, str]


@dataclass
class Entry:
    """One layer entry, its header fields already in canonical form."""

    name: str  # relative, no "./" and no trailing "/"
    kind: bytes
    mode: int
    uid: int
    gid: int
    mtime: int
    size: int = 0
    linkname: str = ""
    devmajor: int = 0
    devminor: int = 0
    xattrs: dict[str, bytes] = field(default_factory=dict)

    @property
    def key(self) -> tuple[bytes, ...]:
        """Walk order: component by component, each in byte order."""
        return tuple(part.encode("utf-8", "surrogateescape") for part in self.name.split("/"))

    def metadata(self, sha256: str = "") -> Metadata:
        """Everything that makes this entry what it is, a regular file's content by its sha256."""
        return (self.kind, self.mode, self.uid, self.gid, self.mtime, tuple(sorted(self.xattrs.items())), self.size,
                self.linkname, self.devmajor, self.devminor, sha256)  # fmt: skip


# ---- reading: ustar, pax and GNU long names; gzip-compressed layers are decompressed on the way


class Gunzip(io.RawIOBase):
    """A gzip stream, decompressed in large chunks (a saved layer may come compressed)."""

    def __init__(self, source: IO[bytes]) -> None:
        self.source, self.pending = source, b""
        self.inflate = zlib.decompressobj(wbits=31)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self.pending:
            chunk = self.source.read(CHUNK)
            if not chunk:
                self.pending = self.inflate.flush()
                if not self.pending:
                    return 0
                break
            try:
                self.pending = self.inflate.decompress(chunk)
                while self.inflate.eof and self.inflate.unused_data:  # concatenated gzip members
                    rest = self.inflate.unused_data
                    self.inflate = zlib.decompressobj(wbits=31)
                    self.pending += self.inflate.decompress(rest)
            except zlib.error as error:
                raise UserError(f"a layer's gzip stream is corrupt ({error})") from None
        count = min(len(buffer), len(self.pending))
        buffer[:count], self.pending = self.pending[:count], self.pending[count:]
        return count


def uncompressed(source: IO[bytes]) -> IO[bytes]:
    """The layer's tar: gzip is recognised by its magic bytes (a tar never starts with them)."""
    buffered = source if isinstance(source, io.BufferedReader) else io.BufferedReader(source, CHUNK)  # type: ignore[type-var]
    if buffered.peek(2)[:2] == b"\x1f\x8b":
        return io.BufferedReader(Gunzip(buffered), CHUNK)
    return buffered


def _number(field: bytes) -> int:
    if field[:1] and field[0] & 0x80:  # base-256, as GNU and Go write values too large for octal
        value = int.from_bytes(field[1:], "big")
        return value - (1 << (8 * len(field) - 1)) if field[0] & 0x40 else value
    text = field.split(b"\0", 1)[0].strip(b" ")
    return int(text, 8) if text else 0


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


# The one extended attribute an image layer carries (file capabilities: ping, newuidmap); the
# overlay2 folders' reader keeps only it too. Others (trusted.overlay.*, user.*) are the engine's
# or the build host's, not the image's.
KEPT_XATTRS = ("security.capability",)
KEPT_PAX_XATTRS = tuple(XATTR + name for name in KEPT_XATTRS)


def _pax_number(records: dict[str, bytes], key: str, name: str) -> int:
    """A pax record's number (a time may have a fraction): a non-negative finite value, else one
    line naming the entry."""
    text = records[key].decode("ascii", "replace").strip()
    try:
        value = float(text) if key == "mtime" else int(text)
    except ValueError:
        raise UserError(f"layer entry {name!r}: its pax {key} {text[:40]!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")) or (value < 0 and key != "mtime"):
        raise UserError(f"layer entry {name!r}: its pax {key} {text[:40]!r} is not a number an entry can have")
    return int(value)


def _checked_name(name: str, what: str = "name") -> str:
    """A member name inside the layer's tree: relative, no `..` component (a hostile tar could
    climb out of it on extraction)."""
    if name.startswith("/") or ".." in name.split("/"):
        raise UserError(f"layer entry {name[:200]!r}: its {what} leaves the layer's tree")
    return name


def _pax_records(data: bytes) -> dict[str, bytes]:
    records: dict[str, bytes] = {}
    position = 0
    while position < len(data) and data[position : position + 1] != b"\0":
        space = data.index(b" ", position)
        length = int(data[position:space])
        key, value = data[space + 1 : position + length - 1].split(b"=", 1)
        records[key.decode("utf-8", "surrogateescape")] = value
        position += length
    return records


def _read_exactly(source: IO[bytes], count: int) -> bytes:
    data = source.read(count)
    if len(data) != count:
        raise UserError(f"a layer ends in the middle of an entry ({len(data)} of {count} bytes)")
    return data


def _skip_padding(source: IO[bytes], size: int) -> None:
    if size % BLOCK:
        _read_exactly(source, BLOCK - size % BLOCK)


class DataReader:
    """The data of the current entry, read straight from the layer stream."""

    def __init__(self, source: IO[bytes], size: int) -> None:
        self.source, self.left = source, size

    def read(self, count: int = CHUNK) -> bytes:
        data = self.source.read(min(count, self.left)) if self.left else b""
        if self.left and not data:
            raise UserError("a layer ends in the middle of a file")
        self.left -= len(data)
        return data


def entries(source: IO[bytes], epoch: int) -> Iterator[tuple[Entry, DataReader | None]]:
    """Every entry of a layer tar in canonical form, with a reader of its data for regular files
    (read it before asking for the next entry). The root entry is left out."""
    pax: dict[str, bytes] = {}
    long_name = long_link = None
    while True:
        header = source.read(BLOCK)
        if len(header) < BLOCK or header == bytes(BLOCK):
            return
        kind, size = header[156:157], _number(header[124:136])
        if kind in (b"x", b"g", b"L", b"K"):
            data = _read_exactly(source, size)
            _skip_padding(source, size)
            if kind == b"x":
                pax.update(_pax_records(data))
            elif kind == b"L":
                long_name = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
            elif kind == b"K":
                long_link = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
            continue  # a global pax header ("g") sets nothing an image needs
        name = _text(header[0:100])
        if header[257:262] == b"ustar" and header[345:346] != b"\0" and header[257:263] == b"ustar\0":
            name = _text(header[345:500]) + "/" + name
        name = long_name or (pax["path"].decode("utf-8", "surrogateescape") if "path" in pax else name)
        linkname = long_link or (
            pax["linkpath"].decode("utf-8", "surrogateescape") if "linkpath" in pax else _text(header[157:257])
        )
        if "size" in pax:
            size = _pax_number(pax, "size", name)
        kind = REGULAR if kind == b"\0" or kind == b"7" else kind
        if kind not in KINDS:
            raise UserError(f"layer entry {name!r} has tar type {kind!r}, which no image layer needs")
        mtime = _pax_number(pax, "mtime", name) if "mtime" in pax else _number(header[136:148])
        uid = _pax_number(pax, "uid", name) if "uid" in pax else _number(header[108:116])
        gid = _pax_number(pax, "gid", name) if "gid" in pax else _number(header[116:124])
        if uid < 0 or gid < 0 or size < 0:  # base-256 fields can say so; an owner of -1 is nobody's
            raise UserError(f"layer entry {name!r}: a negative owner or size ({uid}:{gid}, {size})")
        entry = Entry(
            name=_checked_name(name.removeprefix("./").strip("/")),
            kind=kind,
            mode=_number(header[100:108]) & 0o7777,
            uid=uid,
            gid=gid,
            mtime=min(mtime, epoch),
            size=size if kind == REGULAR else 0,
            linkname=_checked_name(linkname.removeprefix("./"), "hard link's target") if kind == HARDLINK
            else linkname if kind == SYMLINK else "",
            devmajor=_number(header[329:337]) if kind in (CHARDEV, BLOCKDEV) else 0,
            devminor=_number(header[337:345]) if kind in (CHARDEV, BLOCKDEV) else 0,
            xattrs={key[len(XATTR) :]: v for key, v in pax.items() if key in KEPT_PAX_XATTRS},
        )  # fmt: skip
        pax, long_name, long_link = {}, None, None
        if kind != REGULAR and size:  # a link or directory with data: skip it
            _read_exactly(source, size)
            _skip_padding(source, size)
        if not entry.name:
            continue
        if kind == REGULAR:
            reader = DataReader(source, size)
            yield entry, reader
            while reader.read():
                pass
            _skip_padding(source, size)
        else:
            yield entry, None


# ---- writing


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def _pax_record(key: str, value: bytes) -> bytes:
    body = b" " + key.encode("utf-8", "surrogateescape") + b"=" + value + b"\n"
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length = len(str(length)) + len(body)
    return str(length).encode() + body


class _Ustar(NamedTuple):
    """One ustar header block's fields, in the order the block holds them."""

    name: bytes
    mode: int
    uid: int
    gid: int
    size: int
    mtime: int
    kind: bytes
    link: bytes
    devmajor: int = 0
    devminor: int = 0

    def block(self) -> bytes:
        header = bytearray(BLOCK)
        header[0:100] = self.name[:100].ljust(100, b"\0")
        header[100:108] = _octal(self.mode, 8)
        header[108:116] = _octal(self.uid, 8)
        header[116:124] = _octal(self.gid, 8)
        header[124:136] = _octal(self.size, 12)
        header[136:148] = _octal(self.mtime, 12)
        header[148:156] = b" " * 8
        header[156:157] = self.kind
        header[157:257] = self.link[:100].ljust(100, b"\0")
        header[257:265] = b"ustar\x0000"
        header[329:337] = _octal(self.devmajor, 8)
        header[337:345] = _octal(self.devminor, 8)
        header[148:156] = b"%06o\0 " % sum(header)
        return bytes(header)


OCTAL_LIMITS = {8: 0o7777777, 12: 0o77777777777}


def header(entry: Entry) -> bytes:
    """The entry's header blocks: a pax header where a value needs one, then the ustar header."""
    name = entry.name.encode("utf-8", "surrogateescape") + (b"/" if entry.kind == DIRECTORY else b"")
    link = entry.linkname.encode("utf-8", "surrogateescape")
    records: dict[str, bytes] = {}
    if len(name) > 100:
        records["path"] = name
    if len(link) > 100:
        records["linkpath"] = link
    for key, value, width in (("uid", entry.uid, 8), ("gid", entry.gid, 8), ("size", entry.size, 12)):
        if value > OCTAL_LIMITS[width]:
            records[key] = str(value).encode()
    if entry.mtime > OCTAL_LIMITS[12] or entry.mtime < 0:
        records["mtime"] = str(entry.mtime).encode()
    for attribute, raw in entry.xattrs.items():
        records[XATTR + attribute] = raw
    blocks = b""
    if records:
        payload = b"".join(_pax_record(key, records[key]) for key in sorted(records))
        blocks = _Ustar(b"././@PaxHeader", 0o644, 0, 0, len(payload), 0, b"x", b"").block()
        blocks += payload + bytes(-len(payload) % BLOCK)

    def fits(value: int, width: int) -> int:
        return value if 0 <= value <= OCTAL_LIMITS[width] else 0

    return blocks + _Ustar(
        name, entry.mode, fits(entry.uid, 8), fits(entry.gid, 8), fits(entry.size, 12), fits(entry.mtime, 12),
        entry.kind, link, entry.devmajor, entry.devminor,
    ).block()  # fmt: skip


class _Digesting:
    """A sink that hashes and counts what it writes: the diff ID of the layer written."""

    def __init__(self, sink: IO[bytes]) -> None:
        self.sink, self.digest, self.size = sink, hashlib.sha256(), 0

    def write(self, data: bytes) -> None:
        self.digest.update(data)
        self.sink.write(data)
        self.size += len(data)


# ---- the layers below: what an entry changes


@dataclass
class _Node:
    metadata: Metadata | None = None  # None: a directory the tree made for a path below it
    children: dict[str, _Node] | None = None  # None: not a directory


class LowerTree:
    """The file system the layers below make: each path's metadata (a file's content by sha256)."""

    def __init__(self) -> None:
        self.root = _Node(children={})

    def find(self, name: str) -> _Node | None:
        node: _Node | None = self.root
        for part in name.split("/"):
            if node is None or node.children is None:
                return None
            node = node.children.get(part)
        return node

    def holds_anything_under(self, directory: str) -> bool:
        node = self.find(directory) if directory else self.root
        return bool(node and node.children)

    def same_metadata(self, entry: Entry) -> bool:
        """Whether the layers below hold this path with the same metadata (a file's content aside)."""
        node = self.find(entry.name)
        return node is not None and node.metadata is not None and node.metadata[:-1] == entry.metadata()[:-1]

    def kind_of(self, name: str) -> bytes | None:
        """The kind of entry the layers below hold at `name`, or None."""
        node = self.find(name)
        if node is None:
            return None
        if node.metadata is None:
            return DIRECTORY
        return node.metadata[0]

    def unchanged(self, entry: Entry, sha256: str = "") -> bool:
        node = self.find(entry.name)
        return node is not None and node.metadata == entry.metadata(sha256)

    def apply(self, layer: list[tuple[Entry, str]]) -> None:
        """Apply a layer (each entry with its content's sha256): its whiteouts first (they name
        what is below), then what it adds."""
        for entry, _ in layer:
            parent, _, base = entry.name.rpartition("/")
            if base == OPAQUE:
                node = self.find(parent) if parent else self.root
                if node is not None and node.children is not None:
                    node.children = {}
            elif base.startswith(WHITEOUT):
                node = self.find(parent) if parent else self.root
                if node is not None and node.children is not None:
                    node.children.pop(base[len(WHITEOUT) :], None)
        for entry, sha256 in layer:
            parent, _, base = entry.name.rpartition("/")
            if base.startswith(WHITEOUT):
                continue
            folder = self._directory(parent)
            if entry.kind == DIRECTORY:
                existing = folder.get(base)
                kept = existing.children if existing is not None and existing.children is not None else {}
                folder[base] = _Node(entry.metadata(), kept)
            else:
                folder[base] = _Node(entry.metadata(sha256))

    def _directory(self, name: str) -> dict[str, _Node]:
        node = self.root
        for part in name.split("/") if name else []:
            assert node.children is not None
            child = node.children.get(part)
            if child is None or child.children is None:
                child = node.children[part] = _Node(children={})
            node = child
        assert node.children is not None
        return node.children


# ---- one layer


@dataclass
class CanonicalLayer:
    diff_id: str
    size: int
    entries: int
    dropped: int  # entries that change nothing: unchanged directories, files and links; empty opaque markers


# A file the layers below may already hold is read whole before its header is written (only then
# is its content known); up to this size in memory, beyond it through a spool file.
IN_MEMORY = 64 << 20


def _buffered(data: DataReader, size: int) -> tuple[IO[bytes], str]:
    # The caller reads it once and drops it; a spool file is deleted when closed or collected.
    spool: IO[bytes] = io.BytesIO() if size <= IN_MEMORY else tempfile.TemporaryFile()  # noqa: SIM115
    digest = hashlib.sha256()
    while chunk := data.read():
        digest.update(chunk)
        spool.write(chunk)
    spool.seek(0)
    return spool, digest.hexdigest()


def write_layer(stream: Iterator[tuple[Entry, DataReader | None]], sink: IO[bytes], lower: LowerTree,
                check_order: bool = True, keep: frozenset[str] = frozenset()) -> CanonicalLayer:  # fmt: skip
    """Write a layer's entries in the canonical encoding and apply them to `lower`. Raises
    OutOfOrder (having written part of it) when check_order finds two entries out of walk order,
    and LinkTargetsDropped (having written all of it, applied nothing) when a hard link names a
    file left out as unchanged: the caller writes the layer again with those names in `keep`,
    entries written even when the layers below hold them already."""
    out = _Digesting(sink)
    written: list[tuple[Entry, str]] = []
    dropped_files: set[str] = set()
    dropped_targets: set[str] = set()
    written_kinds: dict[str, bytes] = {}  # this layer's names so far, by kind: what a hard link may name
    previous: tuple[bytes, ...] = ()
    dropped = 0
    for entry, data in stream:
        key = entry.key
        if check_order and key <= previous:
            raise OutOfOrder(entry.name)
        previous = key
        parent, _, base = entry.name.rpartition("/")
        written_kinds[entry.name] = entry.kind
        if base == OPAQUE and not lower.holds_anything_under(parent):
            dropped += 1
            continue
        if entry.kind == HARDLINK:
            target = written_kinds.get(entry.linkname) or lower.kind_of(entry.linkname)
            if target not in (REGULAR, HARDLINK):  # a directory, a link to one, or nothing at all
                raise UserError(f"layer entry {entry.name!r} is a hard link to {entry.linkname!r}, which is no file")
            if entry.linkname in dropped_files:
                dropped_targets.add(entry.linkname)
        content: IO[bytes] | None = data  # type: ignore[assignment]
        sha256 = ""
        kept = entry.name in keep
        if data is not None and not kept and lower.same_metadata(entry):
            content, sha256 = _buffered(data, entry.size)
        if not kept and entry.kind != HARDLINK and lower.unchanged(entry, sha256):  # a link is never a copy-up
            dropped += 1
            dropped_files.add(entry.name)
            continue
        out.write(header(entry))
        if content is not None:
            digest = hashlib.sha256() if not sha256 else None
            while chunk := content.read(CHUNK):
                if digest is not None:
                    digest.update(chunk)
                out.write(chunk)
            out.write(bytes(-entry.size % BLOCK))
            sha256 = sha256 or (digest.hexdigest() if digest else "")
        written.append((entry, sha256))
    out.write(bytes(2 * BLOCK))
    if dropped_targets:
        raise LinkTargetsDropped(frozenset(dropped_targets))
    lower.apply(written)
    return CanonicalLayer("sha256:" + out.digest.hexdigest(), out.size, len(written), dropped)


# How to read an entry's data when its turn comes (entries are gathered first, then sorted).
Opener = Callable[[], DataReader]


def _sorted(source: IO[bytes], epoch: int, workdir: Path) -> Iterator[tuple[Entry, DataReader | None]]:
    """A layer's entries in walk order, their data kept in a spool file meanwhile."""
    with tempfile.TemporaryFile(dir=workdir) as spool:
        found: list[tuple[Entry, Opener | None]] = []
        for entry, data in entries(source, epoch):
            offset = spool.tell()
            if data is not None:
                while chunk := data.read():
                    spool.write(chunk)
            found.append((entry, _spool_opener(spool, offset, entry.size) if data is not None else None))
        yield from in_walk_order(found)


def _spool_opener(spool: IO[bytes], offset: int, size: int) -> Opener:
    return lambda: _SpoolReader(spool, offset, size)


def file_opener(open_file: Callable[[], IO[bytes]], size: int) -> Opener:
    """An entry's data in a file of its own, opened when its turn comes and closed once read to
    its end (a layer's folder holds more files than a process may keep open)."""
    return lambda: _FileReader(open_file(), size)


def in_walk_order(found: list[tuple[Entry, Opener | None]]) -> Iterator[tuple[Entry, DataReader | None]]:
    """Entries gathered in any order, in walk order. A hard link whose target sorts after it
    carries the data instead, so every link follows its target."""
    by_name = {entry.name: (entry, opener) for entry, opener in found}
    for entry, _ in found:  # a link to a link names the file the chain ends at
        if entry.kind == HARDLINK:
            entry.linkname = _chain_end(entry, by_name)
    heads: dict[str, str] = {}
    for entry, opener in sorted(found, key=lambda item: item[0].key):
        if entry.kind == HARDLINK and entry.linkname in by_name:
            target, target_opener = by_name[entry.linkname]
            head = heads.setdefault(entry.linkname, entry.name)
            if head == entry.name:  # the first of the group in walk order carries the data
                entry.kind, entry.size, entry.linkname, opener = REGULAR, target.size, "", target_opener
            else:
                entry.linkname = head
        elif entry.kind == REGULAR and heads.get(entry.name, entry.name) != entry.name:
            entry.kind, entry.size, entry.linkname = HARDLINK, 0, heads[entry.name]
        elif entry.kind == REGULAR:
            heads.setdefault(entry.name, entry.name)
        yield (
            entry,
            (opener() if opener is not None else DataReader(io.BytesIO(), 0)) if entry.kind == REGULAR else None,
        )


def link_group_members(found: list[tuple[Entry, Opener | None]]) -> frozenset[str]:
    """Every name of the layer that a hard link of the layer names or is: each is written even
    where the layers below hold it unchanged, so that every link in the layer has its target."""
    names = {entry.name for entry, _ in found}
    return frozenset(
        name
        for entry, _ in found
        if entry.kind == HARDLINK and entry.linkname in names
        for name in (entry.name, entry.linkname)
    )


def _chain_end(link: Entry, by_name: dict[str, tuple[Entry, Opener | None]]) -> str:
    seen = {link.name}
    target = link.linkname
    while target in by_name and by_name[target][0].kind == HARDLINK:
        if target in seen:
            raise UserError(f"layer entry {link.name!r}: its hard links go round in a circle")
        seen.add(target)
        target = by_name[target][0].linkname
    return target


def rewrite_gathered(found: list[tuple[Entry, Opener | None]], target: Path, lower: LowerTree) -> CanonicalLayer:
    """A layer whose entries were gathered (from a layer's folder, say) rewritten into `target`."""
    keep = link_group_members(found)
    with target.open("wb") as sink:
        return write_layer(in_walk_order(found), sink, lower, check_order=False, keep=keep)


class _SpoolReader(DataReader):
    def __init__(self, spool: IO[bytes], offset: int, size: int) -> None:
        super().__init__(spool, size)
        self.offset = offset

    def read(self, count: int = CHUNK) -> bytes:
        self.source.seek(self.offset)
        data = super().read(count)
        self.offset += len(data)
        return data


class _FileReader(DataReader):
    def read(self, count: int = CHUNK) -> bytes:
        data = super().read(count)
        if not data or self.left == 0:
            self.source.close()
        return data


def canonical_stream(source: IO[bytes], sink: IO[bytes], lower: LowerTree, epoch: int) -> CanonicalLayer:
    """Rewrite a layer in walk order straight from `source` into `sink`; raises OutOfOrder."""
    return write_layer(entries(uncompressed(source), epoch), sink, lower)


def rewrite_layer_file(path: Path, target: Path, lower: LowerTree, epoch: int) -> CanonicalLayer:
    """The layer in `path` (a file, tar or gzip) rewritten into `target` and applied to `lower`."""
    return rewrite_layer(lambda: path.open("rb"), target, lower, epoch)


def rewrite_layer(open_source: Callable[[], IO[bytes]], target: Path, lower: LowerTree, epoch: int) -> CanonicalLayer:
    """The layer `open_source` gives (tar or gzip, opened afresh for a second read) rewritten into
    `target` and applied to `lower`: streaming when it is in walk order, else read again and
    sorted through a spool. The source is read to its end either way (a checked blob verifies
    its digest there)."""
    with target.open("wb") as sink:
        try:
            return _rewrite_into(open_source, sink, lower, epoch, target.parent, frozenset())
        except LinkTargetsDropped as dropped:  # nothing was applied to `lower` yet
            return _rewrite_into(open_source, sink, lower, epoch, target.parent, dropped.names)


def _rewrite_into(open_source: Callable[[], IO[bytes]], sink: IO[bytes], lower: LowerTree, epoch: int, workdir: Path,
                  keep: frozenset[str]) -> CanonicalLayer:  # fmt: skip
    sink.seek(0)
    sink.truncate()
    with open_source() as source:
        try:
            done = write_layer(entries(uncompressed(source), epoch), sink, lower, keep=keep)
            while source.read(CHUNK):
                pass
            return done
        except OutOfOrder:  # nothing was applied to `lower` yet
            pass
    sink.seek(0)
    sink.truncate()
    with open_source() as source:
        done = write_layer(_sorted(uncompressed(source), epoch, workdir), sink, lower, check_order=False, keep=keep)
        while source.read(CHUNK):
            pass
        return done


def rewrite_file(path: Path, epoch: int) -> CanonicalLayer:
    """A bottom layer's file (a bootstrapped base's root file system) rewritten in place in
    canonical form."""
    target = path.with_name(path.name + ".canonical")
    result = rewrite_layer_file(path, target, LowerTree(), epoch)
    os.replace(target, path)
    return result
