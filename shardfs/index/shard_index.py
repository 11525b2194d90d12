"""The index of one shard: compact numpy arrays of its members, persisted beside it.

An index is built once per shard (scan its headers, vet its names) and saved
(``index_file.py``), so a remount reads a few arrays back instead of scanning the shard. It is valid
while the shard's size and mtime (remote: size and tag) are those it was built from; it also
records a fingerprint of the shard's bytes (``fingerprint.py``), by which an index uploaded
beside a remote object is checked against that object.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from shardfs.index import fingerprint, labels
from shardfs.index import plain, replay
from shardfs.index.names import path_hash, path_hashes  # noqa: F401 (this module's names for them)
import contextlib

from shardfs.formats import DATA_FORMATS, OtherFormat, ShardFormatError, format_for, format_of
from shardfs.formats.datafile import Columns
from shardfs.formats.base import Kind, ScanResult, Window
from shardfs.storage import open_shard
from shardfs.storage.base import Shard

log = logging.getLogger(__name__)

INDEX_SUFFIX = ".shardfs-idx"


class SplitOnUse(Sequence[bytes]):
    """NUL-separated names (directories: never a NUL in them), split each time they are used, not
    kept split: a dataset of a thousand shards each with the thousand class folders would
    otherwise hold a million small bytes objects at once while its indexes are merged."""

    def __init__(self, blob: bytes, count: int):
        self.blob, self.count = blob, count

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.blob.split(b"\0") if self.count else ())

    def __getitem__(self, i):
        return list(self)[i]


@dataclass
class ShardIndex:
    """Members of one shard. Member ``i`` is ``names[name_end[i-1]:name_end[i]]``."""

    format: str
    shard_size: int
    shard_mtime_ns: int
    names: bytes
    name_end: np.ndarray  # int64, cumulative end offsets into ``names``
    kind: np.ndarray  # uint8 (formats.base.Kind)
    offset: np.ndarray  # int64, into the shard's logical data stream
    size: np.ndarray  # int64
    mode: np.ndarray  # uint16 permission bits
    mtime: np.ndarray  # float64
    hash: np.ndarray  # uint64 path_hash of each name
    parent: np.ndarray  # uint32 index into ``dirs``
    dirs: Sequence[bytes]  # distinct parent directories ("" is the root); a list, or SplitOnUse when loaded
    symlinks: dict[int, bytes] = field(default_factory=dict)  # member -> target
    sparse: dict[int, np.ndarray] = field(default_factory=dict)  # member -> its runs (formats/sparse.py)
    # Labels of small ``*.cls`` members (see labels.py): member index, value (labels.UNPARSABLE if not an int)
    cls_member: np.ndarray = field(default_factory=lambda: labels.no_labels()[0])  # int32
    cls_value: np.ndarray = field(default_factory=lambda: labels.no_labels()[1])  # int64
    warnings: list[str] = field(default_factory=list)
    error: str | None = None  # the scan stopped here; members before it are good
    stored_at: str | None = None  # the index file it was loaded from or saved to (not persisted)
    stored_id: tuple | None = None  # that file's file_id when it was read or written (not persisted)
    shard_tag: str = ""  # remote shards: the object's ETag (or Last-Modified) it was built from
    shard_fingerprint: str = ""  # fingerprint.of the shard it was built from ("" in older indexes)
    legacy: bool = False  # read from an older file format: the store writes it again (not persisted)
    # Dataset files (formats/datafile.py): every member has a label (cls_member, cls_value); the
    # class names the file carries, and the --columns it was built with ("" by convention).
    classes: list[str] | None = None
    columns: str = ""
    # A compressed tar (formats/ctar.py): the size of the tar it decompresses to, the logical stream
    # its offsets point into; 0 for every other shard (its logical stream is the shard as stored).
    logical_size: int = 0

    def __len__(self) -> int:
        return len(self.kind)

    def name(self, i: int) -> bytes:
        start = int(self.name_end[i - 1]) if i else 0
        return self.names[start : int(self.name_end[i])]


def build(shard: Shard | str, columns: Columns = Columns(), keep=None) -> ShardIndex:
    """Scan a shard (or the shard at a path or URL) and vet every member name. Damage is
    recorded, never raised; a shard that cannot be read at all raises ShardIOError
    (``unavailable``) and nothing is recorded. ``columns``: dataset files' image and label.
    ``keep(shard)``: a context around the scan that keeps what it reads (storage/buildfill.py); a
    compressed tar's scan reads its decompressed tar (formats/ctar.py), and so that is kept."""
    if isinstance(shard, str):
        opened = open_shard(shard)
        try:
            return build(opened, columns, keep)
        finally:
            opened.close()
    fmt = format_for(shard.path)
    if fmt is None:
        raise ValueError(f"{shard.path}: not a known shard type")
    try:
        return _scanned(shard, fmt, columns, keep)
    except OtherFormat as other:  # (what the scan read is not kept: it left the keeper by this)
        actual = format_of(shard.path, other.head)
    if actual is None or actual is fmt:
        return _refused(shard, fmt, columns, "not of the format its name says, nor of another")
    try:
        return _scanned(shard, actual, columns, keep)
    except OtherFormat:
        return _refused(shard, actual, columns, "not of the format its name says, nor of another")


def _scanned(shard: Shard, fmt, columns: Columns, keep) -> ShardIndex:
    """The index of ``shard`` read as ``fmt``; a compressed tar through its decompressed tar."""
    if not getattr(fmt, "decompresses", False):
        with keep(shard) if keep is not None else contextlib.nullcontext():
            return _build(shard, fmt, columns)
    try:
        logical = fmt.spooled(shard, room=_spool_room(keep))
    except ShardFormatError as exc:  # damaged: refused whole (ctar.py says why)
        return _refused(shard, fmt, columns, str(exc))
    try:
        with keep(logical) if keep is not None else contextlib.nullcontext():
            return _build(logical, fmt, columns, stored=shard)
    except OtherFormat:  # a .tar.gz.gz: tar -x does not read it either
        return _refused(shard, fmt, columns, "compressed twice (its decompressed bytes are compressed again)")
    finally:
        logical.close()


def _spool_room(keep):
    """The RAM room a compressed tar's spool may take: a keeper's (storage/buildfill.py), whose
    cache then keeps the spool as the shard's buffer; none for a plain ``keep`` or none at all."""
    return keep.spool_room() if hasattr(keep, "spool_room") else None


def _refused(shard: Shard, fmt, columns: Columns, why: str) -> ShardIndex:
    return _index(shard, fmt, ScanResult(members=[], warnings=[], error=why), columns, None, shard)


def _build(shard: Shard, fmt, columns: Columns, stored: Shard | None = None) -> ShardIndex:
    """``stored``: the shard as stored, when ``shard`` is its decompressed tar."""
    data_file = fmt.name in DATA_FORMATS
    keeping = None
    try:
        if data_file:
            result = fmt.scan(shard, columns)
        elif getattr(fmt, "gives_columns", False):  # tar: its plain members as the compiled scanner's columns
            keeping = fingerprint.Keeping(shard) if stored is None else shard
            result = fmt.scan(keeping, columns=True)
        else:  # lz4, SquashFS: they read a few tables; what those reads hold of the fingerprint is kept
            keeping = fingerprint.Keeping(shard) if stored is None else shard
            # The fingerprint's windows asked of the kernel first: read while the scan reads, not
            # one after another once it is done (its middle window is no table's).
            shard.will_need(fingerprint.ranges(shard.size))
            result = fmt.scan(keeping)
    except ShardFormatError as exc:  # a dataset file that cannot be parsed at all
        result = ScanResult(members=[], warnings=[], error=str(exc))
    return _index(shard, fmt, result, columns, keeping if stored is None else None, stored or shard)


def _index(shard: Shard, fmt, result: ScanResult, columns: Columns, keeping, stored: Shard) -> ShardIndex:
    data_file = fmt.name in DATA_FORMATS
    shown = stored.name
    warnings = [f"{shown}: {w}" for w in result.warnings]
    found = plain.members(result.columns, result.cut) if result.columns is not None else None
    if found is None:
        if result.columns is not None:
            result.members = list(result.columns.records())
        found = _replayed(shard, fmt, result, data_file, lambda line: warnings.append(f"{shown}: {line}"))
    return ShardIndex(
        format=fmt.name,
        shard_size=stored.size,
        shard_mtime_ns=stored.mtime_ns,
        shard_tag=getattr(stored, "tag", ""),
        shard_fingerprint=fingerprint.of(stored, keeping.kept if keeping else None),
        names=found.blob,
        name_end=found.name_end,
        kind=found.kind,
        offset=found.offset,
        size=found.size,
        mode=found.mode,
        mtime=found.mtime,
        hash=found.hashes,
        parent=found.parent,
        dirs=SplitOnUse(found.dirs, found.dir_count),  # one object, also when pickled back from a worker
        symlinks=found.symlinks,
        sparse=found.sparse,
        warnings=warnings,
        error=f"{shown}: {result.error}" if result.error else None,
        cls_member=found.cls_member,
        cls_value=found.cls_value,
        classes=result.classes,
        columns=str(columns) if data_file else "",
        logical_size=shard.size if shard is not stored else 0,
    )


def _replayed(shard: Shard, fmt, result: ScanResult, data_file: bool, warn) -> plain.Members:
    """The members as tar -x extracts them, names vetted (replay.py): later ones replace earlier ones."""
    members = replay.extracted(result.members, result.cut, warn)
    offsets = np.array([rec.offset for rec in members], dtype=np.int64)
    sizes = np.array([rec.size for rec in members], dtype=np.int64)
    cls_member, cls_value = labels.no_labels()
    wanted = [i for i, rec in enumerate(members) if rec.kind == Kind.FILE and labels.is_label_member(rec.path, rec.size)]
    if data_file:
        cls_member = np.arange(len(members), dtype=np.int32)
        cls_value = np.array([rec.label for rec in members], dtype=np.int64)
    elif wanted:  # only WebDataset-style shards pay for this
        try:
            cls_member, cls_value = _read_labels(shard, fmt, members, wanted, offsets, sizes)
        except ShardFormatError as exc:
            warn(f"cannot read its .cls labels: {exc}")
    return plain.Members.listed(
        [rec.path for rec in members], np.array([rec.kind for rec in members], dtype=np.uint8), offsets, sizes,
        np.array([rec.mode for rec in members], dtype=np.uint16), np.array([rec.mtime for rec in members], dtype=np.float64),
        cls_member, cls_value, symlinks={i: rec.link for i, rec in enumerate(members) if rec.kind == Kind.SYMLINK},
        sparse={i: rec.sparse for i, rec in enumerate(members) if rec.sparse is not None})


def _read_labels(shard: Shard, fmt, members: list, wanted: list[int], offsets, sizes):
    """Labels as the scan kept them with their headers (tar: no second pass over the shard);
    else read through the format's layout (lz4: whole blocks), in data order through forward
    windows: from a remote object that is 8 MiB ranged reads, not one request per label."""
    if all(members[i].small is not None for i in wanted):
        return labels.from_bytes(wanted, [members[i].small for i in wanted])
    layout = fmt.open_layout(shard, shard.size)
    window = Window(shard)
    return labels.read_labels(wanted, offsets, sizes, lambda o, n: layout.read(o, n, window.get))
