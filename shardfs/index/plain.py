"""A shard whose members are all plain, indexed from the compiled scanner's columns
(formats/tarcolumns.py) without a record per member: the common case of millions of small files.

Plain here means what replay.py would keep as it is, in archive order: files and folders only (no
links), every name normal or "./"-prefixed (``./`` itself left out), no name twice, no file where
another member needs a folder, nothing cut short. Any other shard is replayed member by member.

The decision is made on whole columns (numpy), never a Python object per member: names are told
apart by their path hashes, which the scanner computed; where two hashes are equal (the same name
twice, or a collision) the shard goes to replay.py, which compares the names themselves. Parent
folders are grouped by hash too and then compared byte for byte with their group's first."""

from __future__ import annotations

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
    PARENT_END,
    PARENT_HASH,
    ROOT,
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
    hashes = rows[:, HASH].view(np.uint64)
    if _repeats(hashes):
        return None  # a name twice: the later one replaces the earlier (replay.py); or a collision
    blob, name_end, starts = _normal_names(columns.names, rows, begins)
    kind = rows[:, KIND]
    files = kind == Kind.FILE
    found = _folders(blob, starts, rows)
    if found is None:
        return None  # two folders of one hash (never seen: replay.py tells them apart)
    parent, dirs, dir_count, dir_hashes = found
    if _any_in(hashes[files], np.concatenate([dir_hashes, np.frombuffer(columns.above, np.uint64)])):
        return None  # a file where a folder must be: tar -x cannot (replay.py says so)
    mtime = rows[:, MTIME].astype(np.float64)
    mtime[np.abs(mtime) > MAX_MTIME] = 0.0
    cls_member, cls_value = _labels(columns, rows, blob, name_end, files)
    # (the scanner gives folders offset and size 0)
    return Members(blob, name_end, kind.astype(np.uint8), rows[:, OFFSET].copy(), rows[:, SIZE].copy(),
                   rows[:, MODE].astype(np.uint16), mtime, cls_member, cls_value, parent, dirs, dir_count,
                   hashes.copy())


def _repeats(values: np.ndarray) -> bool:
    ordered = np.sort(values)
    return bool((ordered[1:] == ordered[:-1]).any())


def _any_in(values: np.ndarray, among: np.ndarray) -> bool:
    among = np.sort(among)
    at = np.minimum(np.searchsorted(among, values), len(among) - 1)
    return bool(len(among)) and bool((among[at] == values).any())


def _normal_names(names: bytes, rows: np.ndarray, begins: np.ndarray) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The normal forms back to back, their ends, and where each begins in that blob."""
    first, last = begins + rows[:, NORM_START], begins + rows[:, NORM_END]
    lengths = last - first
    name_end = np.cumsum(lengths)
    starts = name_end - lengths
    if len(first) and (first == starts).all() and last[-1] == len(names):
        return names, name_end, starts  # every name normal as it is (most shards)
    return np.frombuffer(names, np.uint8)[_spans(first, lengths)].tobytes(), name_end, starts


def _spans(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The byte positions of each span (start, length), back to back."""
    total = int(lengths.sum())
    return np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(total)


def _folders(blob: bytes, starts: np.ndarray, rows: np.ndarray):
    """Each member's folder as an index into the distinct folders in order of first use, those
    folders (NUL-separated), how many, and their path hashes (sorted); None where two folders of
    one hash differ."""
    hashes = rows[:, PARENT_HASH].view(np.uint64)
    ends = rows[:, PARENT_END]
    lengths = np.where(ends >= 0, ends - rows[:, NORM_START], 0)
    by_hash = np.argsort(hashes, kind="stable")
    ordered = hashes[by_hash]
    new = np.ones(len(ordered), bool)
    new[1:] = ordered[1:] != ordered[:-1]
    first = by_hash[new]  # each hash's first member (stable sort)
    which = np.empty(len(rows), np.intp)
    which[by_hash] = np.cumsum(new) - 1
    order = np.argsort(first)
    rank = np.empty(len(order), np.uint32)
    rank[order] = np.arange(len(order), dtype=np.uint32)
    # every member's folder is its group's first, byte for byte
    same = first[which]
    other = same != np.arange(len(rows))
    if (lengths[other] != lengths[same[other]]).any():
        return None
    data = np.frombuffer(blob, np.uint8)
    if (data[_spans(starts[other], lengths[other])] != data[_spans(starts[same[other]], lengths[other])]).any():
        return None
    # each folder with the byte after it (its member's "/", or its name's first: the root's ""),
    # that byte then a NUL
    firsts = first[order]
    taken = lengths[firsts] + 1
    dirs = data[_spans(starts[firsts], taken)]
    dirs[np.cumsum(taken) - 1] = 0
    return rank[which], dirs[:-1].tobytes(), len(firsts), ordered[new]


def _labels(columns: MemberColumns, rows, blob: bytes, name_end: np.ndarray, files) -> tuple[np.ndarray, np.ndarray]:
    """WebDataset ``.cls`` labels, from the data the scanner kept of small files."""
    if b".cls" not in columns.names.lower():
        return labels.no_labels()
    sizes = rows[:, SIZE].tolist()
    bounds = np.concatenate([[0], name_end]).tolist()
    wanted = [i for i, f in enumerate(files.tolist())
              if f and labels.is_label_member(blob[bounds[i] : bounds[i + 1]], sizes[i])]
    if not wanted:
        return labels.no_labels()
    ends = rows[:, SMALL_END]
    kept_before = np.maximum.accumulate(np.where(ends >= 0, ends, 0))  # the kept data's end up to each row
    starts = np.concatenate([[0], kept_before[:-1]])
    return labels.from_bytes(wanted, [columns.smalls[int(starts[i]) : int(ends[i])] for i in wanted])
