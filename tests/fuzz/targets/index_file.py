"""A shard's index file as a mount reads it back (index/index_file.py, and index/index_npz.py for the
older .npz version it still reads), from the bytes of the file.

The input's first byte says whether to recompute the file's CRC-32 first: a writer's bug or an
edited file has a good one, and the arrays behind it are what a mount trusts. Beyond "no crash":
an index that loads (passes index_file.check) is consistent in everything the tree indexes with:
each array of the writer's dtype and of the members' count, name ends from 0 up to the names'
length never going back, kinds known, folders among its folders, files' ranges not negative,
labels, links and sparse maps on members of the right kind; anything else is refused with a
ValueError; a load allocates at most a few times the file's size.
"""

from __future__ import annotations

import io
import json
import struct
import zlib

import numpy as np
from fuzzlib import bounded, write_scratch
from tarcraft import archive, header, member, old_sparse_member

from shardfs.formats.base import Kind
from shardfs.index import index_file, shard_index

HEAD = index_file._HEADER
# What the writer writes (shard_index.ShardIndex): the dtype of each array a loaded index must have.
DTYPES = {"name_end": np.int64, "kind": np.uint8, "offset": np.int64, "size": np.int64, "mode": np.uint16,
          "mtime": np.float64, "hash": np.uint64, "parent": np.uint32, "cls_member": np.int32, "cls_value": np.int64}


def _fix_crc(data: bytes) -> bytes:
    if len(data) < HEAD.size or data[:8] != index_file.MAGIC:
        return data
    magic, version, meta_len, _, zero, names_len = HEAD.unpack(data[: HEAD.size])
    crc = zlib.crc32(data[len(data) - names_len :], zlib.crc32(data[HEAD.size : len(data) - names_len])) \
        if names_len <= len(data) - HEAD.size else 0
    return HEAD.pack(magic, version, meta_len, crc, zero, names_len) + data[HEAD.size :]


def one_input(data: bytes) -> None:
    if not data:
        return
    path = write_scratch("fuzz.shardfs-idx", _fix_crc(data[1:]) if data[0] & 1 else data[1:])
    with bounded(4 * len(data) + (1 << 20), "an index load"):
        try:
            index = index_file.load(path)
        except ValueError:  # damaged, or of another version (OutdatedIndex): rebuilt, never trusted
            return
    consistent(index)


def consistent(index: shard_index.ShardIndex) -> None:
    n = len(index.kind)
    for name, dtype in DTYPES.items():
        array = getattr(index, name)
        assert array.dtype == dtype, f"{name} loaded as {array.dtype}, the writer writes {np.dtype(dtype)}"
        assert name.startswith("cls_") or len(array) == n, f"{name}: {len(array)} entries for {n} members"
    ends = index.name_end
    assert not n or (int(ends[0]) >= 0 and (np.diff(ends) >= 0).all()), "name ends go back"
    assert int(ends[-1]) == len(index.names) if n else True, "names and name ends differ"
    assert np.isin(index.kind, [int(k) for k in Kind]).all(), "a member of no known kind"
    assert not n or int(index.parent.max()) < len(index.dirs), "a member's folder is not among the folders"
    files = index.kind == Kind.FILE
    assert (index.offset[files] >= 0).all() and (index.size[files] >= 0).all(), "a file at a negative offset or size"
    assert len(index.cls_member) == len(index.cls_value), "labels and their members differ in count"
    assert ((index.cls_member >= 0) & (index.cls_member < n)).all(), "a label of no member"
    for m, target in index.symlinks.items():
        assert 0 <= m < n and index.kind[m] == Kind.SYMLINK and isinstance(target, bytes), f"link {m} is no symlink"
    for m, runs in index.sparse.items():
        assert 0 <= m < n and index.kind[m] == Kind.FILE, f"sparse map of member {m}, no file"
        assert runs.ndim == 2 and (runs >= 0).all(), f"sparse map of member {m} has negative runs"
        assert (runs[:, 0] + runs[:, 1] <= index.size[m]).all(), f"sparse map of member {m} past its size"


def _built(data: bytes, name: str = "s.tar") -> shard_index.ShardIndex:
    return shard_index.build(write_scratch(name, data))


def _saved(index: shard_index.ShardIndex) -> bytes:
    path = write_scratch("seed.shardfs-idx", b"")
    index_file.save(index, path)
    with open(path, "rb") as f:
        return f.read()


def _npz(index: shard_index.ShardIndex) -> bytes:
    """The same index as version 2 wrote it (an uncompressed .npz), which mounts still read."""
    meta = {"version": index_file.NPZ_VERSION, "format": index.format, "shard_size": index.shard_size,
            "shard_mtime_ns": index.shard_mtime_ns, "dirs": [d.decode() for d in index.dirs],
            "symlinks": {str(i): t.decode() for i, t in index.symlinks.items()}, "warnings": index.warnings,
            "error": index.error}
    out = io.BytesIO()
    np.savez(out, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8), names=np.frombuffer(index.names, np.uint8),
             **{name: getattr(index, name) for name in index_file.ARRAYS})
    return out.getvalue()


def seeds() -> list[bytes]:
    shards = [
        archive(member(b"a/b.txt", b"hello"), member(b"a/c.cls", b"7"), member(b"d/e/f.bin", b"x" * 600)),
        archive(member(b"t", b"target"), header(b"s", typeflag=b"2", linkname=b"t"), header(b"dir", typeflag=b"5"),
                old_sparse_member(b"sp", [(0, b"a" * 512), (2048, b"b" * 10)], 4000)),
        member(b"a", b"1") + header(b"cut", 5000) + b"x" * 100,  # damaged: an error and what precedes it
    ]
    indexes = [_built(s) for s in shards]
    out = [b"\1" + _saved(ix) for ix in indexes] + [b"\0" + _saved(indexes[0])]
    out.append(b"\0" + _npz(indexes[0]))
    stale = bytearray(_saved(indexes[0]))
    stale[8:12] = struct.pack("<I", 4)  # version 4: loaded, its hashes computed again
    out.append(b"\1" + bytes(stale))
    return out
