"""A shard whose members are all plain, indexed from the compiled scanner's columns
(formats/tarcolumns.py) without a record per member: the common case of millions of small files.

Plain here means what replay.py would keep as it is, in archive order: files and folders only (no
links), every name normal or "./"-prefixed (``./`` itself left out), no name twice, no file where
another member needs a folder, nothing cut short. Any other shard is replayed member by member.

The decision is made on whole columns in C (``_tarscan.plain_members``, without the GIL), never a
Python object per member: names are told apart by their path hashes, which the scanner computed;
where two hashes are equal (the same name twice, or a collision) the shard goes to replay.py, which
compares the names themselves. Parent folders are grouped by hash too and then compared byte for
byte with their group's first. (In numpy this took ~1.5 ms of a shard of 2,000 members with the GIL
held, the larger part of what two build threads could not do at once.)"""

from __future__ import annotations

import numpy as np

from shardfs.formats import _tarscan  # plain.members is asked only of the compiled scanner's columns
from shardfs.formats.base import Kind
from shardfs.formats.tarcolumns import (
    HASH,
    KIND,
    MODE,
    MTIME,
    OFFSET,
    SIZE,
    SMALL_END,
    MemberColumns,
)
from shardfs.index import labels
from shardfs.index.names import path_hashes
from shardfs.index.replay import MAX_MTIME


class Members:
    """The columns a ShardIndex is made of (shard_index.build), however they were found: names
    back to back (``blob``, ``name_end``), each member's folder (``parent``, into the distinct
    folders in the order of first use: ``dirs``, NUL-separated, ``dir_count`` of them)."""

    def __init__(self, blob: bytes, name_end: np.ndarray, kind, offset, size, mode, mtime, cls_member, cls_value,
                 parent: np.ndarray, dirs: bytes, dir_count: int, hashes: np.ndarray, symlinks: dict | None = None,
                 sparse: dict | None = None):
        self.blob, self.name_end, self.hashes = blob, name_end, hashes
        self.kind, self.offset, self.size, self.mode, self.mtime = kind, offset, size, mode, mtime
        self.cls_member, self.cls_value = cls_member, cls_value
        self.parent, self.dirs, self.dir_count = parent, dirs, dir_count
        self.symlinks, self.sparse = symlinks or {}, sparse or {}

    @classmethod
    def listed(cls, names: list[bytes], kind, offset, size, mode, mtime, cls_member, cls_value,
               symlinks: dict | None = None, sparse: dict | None = None) -> Members:
        """From a name per member (replay.py's records)."""
        parents = [n.rpartition(b"/")[0] for n in names]
        dir_ids = {folder: i for i, folder in enumerate(dict.fromkeys(parents))}
        parent = np.fromiter(map(dir_ids.__getitem__, parents), np.uint32, len(parents))
        return cls(b"".join(names), np.cumsum([len(n) for n in names], dtype=np.int64), kind, offset, size, mode,
                   mtime, cls_member, cls_value, parent, b"\0".join(dir_ids), len(dir_ids), path_hashes(names),
                   symlinks, sparse)


def members(columns: MemberColumns, cut: bytes | None) -> Members | None:
    """The members as replay.py would leave them, or None where the shard needs replay.py."""
    if cut is not None:
        return None
    found = _tarscan.plain_members(columns.names, np.ascontiguousarray(columns.rows), columns.above)
    if found is None:
        return None
    kept, blob, name_end, parent, dirs, dir_count = found
    rows = columns.rows if kept is None else columns.rows[np.frombuffer(kept, np.int64)]
    blob = columns.names if blob is None else blob
    name_end = np.frombuffer(name_end, np.int64)
    kind = rows[:, KIND]
    mtime = rows[:, MTIME].astype(np.float64)
    mtime[np.abs(mtime) > MAX_MTIME] = 0.0
    cls_member, cls_value = _labels(columns, rows, blob, name_end, kind == Kind.FILE)
    # (the scanner gives folders offset and size 0)
    return Members(blob, name_end, kind.astype(np.uint8), rows[:, OFFSET].copy(), rows[:, SIZE].copy(),
                   rows[:, MODE].astype(np.uint16), mtime, cls_member, cls_value, np.frombuffer(parent, np.uint32),
                   dirs, dir_count, rows[:, HASH].view(np.uint64).copy())


def _labels(columns: MemberColumns, rows, blob: bytes, name_end: np.ndarray, files) -> tuple[np.ndarray, np.ndarray]:
    """WebDataset ``.cls`` labels, from the data the scanner kept of small files."""
    ends = rows[:, SMALL_END]
    # a label is a file the scanner kept the data of (labels.MAX_LABEL_BYTES: formats.base.SMALL_DATA)
    if not (ends >= 0).any() or b".cls" not in columns.names.lower():
        return labels.no_labels()
    sizes = rows[:, SIZE].tolist()
    bounds = np.concatenate([[0], name_end]).tolist()
    wanted = [i for i, f in enumerate(files.tolist())
              if f and labels.is_label_member(blob[bounds[i] : bounds[i + 1]], sizes[i])]
    if not wanted:
        return labels.no_labels()
    kept_before = np.maximum.accumulate(np.where(ends >= 0, ends, 0))  # the kept data's end up to each row
    starts = np.concatenate([[0], kept_before[:-1]])
    return labels.from_bytes(wanted, [columns.smalls[int(starts[i]) : int(ends[i])] for i in wanted])
