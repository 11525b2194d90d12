"""A shard whose members are all plain, indexed from the compiled scanner's columns
(formats/tarcolumns.py) without a record per member: the common case of millions of small files.

Plain here means what replay.py would keep as it is, in archive order: files and folders only (no
links), every name normal or "./"-prefixed (``./`` itself left out), no name twice, no file where
another member needs a folder, nothing cut short. Any other shard is replayed member by member."""

from __future__ import annotations

import itertools

import numpy as np

from shardfs.formats.base import Kind
from shardfs.formats.tarcolumns import (
    HASH,
    KIND,
    MODE,
    MTIME,
    NAME_END,
    NORM_END,
    NORM_START,
    NOT_NORMAL,
    OFFSET,
    ROOT,
    SIZE,
    SMALL_END,
    MemberColumns,
)
from shardfs.index import labels
from shardfs.index.replay import MAX_MTIME


class Members:
    """The columns a ShardIndex is made of (shard_index.build), however they were found."""

    def __init__(self, names: list[bytes], kind, offset, size, mode, mtime, cls_member, cls_value,
                 symlinks: dict | None = None, sparse: dict | None = None, parents: list[bytes] | None = None,
                 hashes: np.ndarray | None = None):
        self.names, self.kind, self.offset, self.size, self.mode, self.mtime = names, kind, offset, size, mode, mtime
        self.cls_member, self.cls_value = cls_member, cls_value
        self.symlinks, self.sparse = symlinks or {}, sparse or {}
        self.parents = parents if parents is not None else [n.rpartition(b"/")[0] for n in names]
        self.hashes = hashes  # shard_index.path_hash of each name, when the scanner gave them


def members(columns: MemberColumns, cut: bytes | None) -> Members | None:
    """The members as replay.py would leave them, or None where the shard needs replay.py."""
    rows = columns.rows
    kind, start = rows[:, KIND], rows[:, NORM_START]
    if cut is not None or ((kind != Kind.FILE) & (kind != Kind.DIR)).any() or (start == NOT_NORMAL).any():
        return None
    root = start == ROOT
    if (root & (kind != Kind.DIR)).any():
        return None  # a file named "./": replay.py says why it is refused
    ends = rows[:, NAME_END]
    begins = np.concatenate([[0], ends[:-1]])
    if root.any():  # "./" itself: the root, left out
        rows, begins = rows[~root], begins[~root]
    blob = columns.names
    first, last = begins + rows[:, NORM_START], begins + rows[:, NORM_END]
    names = [blob[a:b] for a, b in zip(first.tolist(), last.tolist())]
    if len(set(names)) != len(names):
        return None  # a name twice: the later one replaces the earlier (replay.py)
    kind = rows[:, KIND]
    files = kind == Kind.FILE
    parents = [name.rpartition(b"/")[0] for name in names]
    folders = set(parents)
    for folder in list(folders):  # and the folders above them
        while b"/" in folder:
            folder = folder.rpartition(b"/")[0]
            folders.add(folder)
    if not folders.isdisjoint(itertools.compress(names, files.tolist())):
        return None  # a file where a folder must be: tar -x cannot (replay.py says so)
    mtime = rows[:, MTIME].astype(np.float64)
    mtime[np.abs(mtime) > MAX_MTIME] = 0.0
    cls_member, cls_value = _labels(columns, rows, names, files)
    # (the scanner gives folders offset and size 0)
    return Members(names, kind.astype(np.uint8), rows[:, OFFSET].copy(), rows[:, SIZE].copy(),
                   rows[:, MODE].astype(np.uint16), mtime, cls_member, cls_value, parents=parents,
                   hashes=rows[:, HASH].view(np.uint64).copy())


def _labels(columns: MemberColumns, rows, names: list[bytes], files) -> tuple[np.ndarray, np.ndarray]:
    """WebDataset ``.cls`` labels, from the data the scanner kept of small files."""
    if b".cls" not in columns.names.lower():
        return labels.no_labels()
    sizes = rows[:, SIZE].tolist()
    wanted = [i for i, (name, f) in enumerate(zip(names, files.tolist())) if f and labels.is_label_member(name, sizes[i])]
    if not wanted:
        return labels.no_labels()
    ends = rows[:, SMALL_END]
    kept_before = np.maximum.accumulate(np.where(ends >= 0, ends, 0))  # the kept data's end up to each row
    starts = np.concatenate([[0], kept_before[:-1]])
    return labels.from_bytes(wanted, [columns.smalls[int(starts[i]) : int(ends[i])] for i in wanted])
