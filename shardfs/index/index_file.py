"""A shard's index on disk: one flat file, read back into numpy views without parsing.

Layout (little-endian)::

    magic (8) | version u32 | meta length u32 | crc32 of the rest u32 | 0 u32 | names length u64
    body: meta, JSON (the shard's size, mtime, tag, fingerprint; warnings; the arrays' names,
          dtypes and lengths), zeros up to a multiple of 8, then each array's raw bytes in that
          order, each padded to a multiple of 8
    names: the member names, concatenated

A remount loads a thousand of these: the arrays are numpy views of the body as read, not copies;
the names come last so that they are read into a bytes object of their own (not copied out of
the body, which would hold them twice at the peak of a mount); the directories, per-item Python
objects before, are one blob (shard_index.SplitOnUse). The crc32 catches a damaged file (as the
zip of version 2 did), so an index that was truncated or bit-flipped is rebuilt, never trusted
to say where a member's bytes are.

Version 2 indexes (an uncompressed ``.npz``) and version 3 ones (this layout without the sparse
maps) are still read: indexes uploaded beside remote objects stay usable, and the store rewrites a
local one in this format once it is found current. One that says it left members out is rebuilt
instead (store.py): this version serves more of such shards (sparse files, absolute names, members
after damage).
"""

from __future__ import annotations

import functools
import io
import json
import os
import struct
import zipfile
import zlib

import numpy as np

from shardfs.atomic import atomic_file
from shardfs.errors import ShardfsError
from shardfs.formats.base import Kind
from shardfs.index import member_columns
from shardfs.index.member_columns import MemberColumns
from shardfs.index.names import path_hashes
from shardfs.index.shard_index import ShardIndex, SplitOnUse

INDEX_VERSION = 5  # 5: XXH64 path hashes (4: sparse maps; 3: flat file; 2: .npz with cls_member/cls_value)
# 6: a SquashFS image's index, whose files held in one fragment block have IN_FRAGMENT offsets
# (formats/squashfs/inodes.py), which a shardfs before them answers EIO for. Written for SquashFS
# indexes only: such a shardfs refuses them as a newer version and builds its own, and still reads
# every other index.
SQUASHFS_VERSION = 6
CURRENT = (INDEX_VERSION, SQUASHFS_VERSION)
OLDER_FLAT = (3, 4)  # still read: a version 3 file has no sparse tables; before 5, hashes were BLAKE2b
NPZ_VERSION = 2  # the last .npz version, still read
MAGIC = b"\x89SFSIDX\n"  # a high first byte and a newline: text-mode mangling shows
_HEADER = struct.Struct("<8sIIIIQ")
_ALIGN = 8
# Per-member (and label) arrays, as ShardIndex names them; "dirs" is a blob of NUL-joined names.
ARRAYS = ("name_end", "kind", "offset", "size", "mode", "mtime", "hash", "parent", "cls_member", "cls_value")
# The sparse maps (ShardIndex.sparse) as three tables: the members that have one, where each one's
# runs end (a count of runs), and the runs, (offset, length) rows flattened.
SPARSE_ARRAYS = ("sparse_member", "sparse_end", "sparse_runs")


class OutdatedIndex(ShardfsError, ValueError):
    """Written by another shardfs version: rebuilt, not an error."""


def _text(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


def text_bytes(s: str) -> bytes:
    return s.encode("utf-8", "surrogateescape")


def _pad(n: int) -> int:
    return -n % _ALIGN


def save(index: ShardIndex, path: str) -> None:
    """Write atomically (temp file + rename) so a reader never sees half an index."""
    # Directory names never hold a NUL (names.normalise refuses it): one NUL-joined blob.
    arrays = [(name, np.ascontiguousarray(getattr(index, name))) for name in ARRAYS]
    arrays += zip(SPARSE_ARRAYS, sparse_tables(index.sparse))
    dirs = index.dirs.blob if isinstance(index.dirs, SplitOnUse) else b"\0".join(index.dirs)  # (not split to be joined)
    arrays.append(("dirs", np.frombuffer(dirs, np.uint8)))
    meta = json.dumps({
        "format": index.format,
        "shard_size": index.shard_size,
        "shard_mtime_ns": index.shard_mtime_ns,
        "shard_tag": index.shard_tag,
        "shard_fingerprint": index.shard_fingerprint,
        "ndirs": len(index.dirs),
        "symlinks": {str(i): _text(t) for i, t in index.symlinks.items()},
        "warnings": index.warnings,
        "error": index.error,
        "classes": index.classes,
        "columns": index.columns,
        "logical_size": index.logical_size,
        "arrays": [[name, a.dtype.str, len(a)] for name, a in arrays],
    }).encode()
    parts = [meta, bytes(_pad(len(meta)))]
    for _, a in arrays:
        parts += [a.tobytes(), bytes(_pad(a.nbytes))]
    body = b"".join(parts)
    crc = zlib.crc32(index.names, zlib.crc32(body))
    with atomic_file(path) as out:
        out.write(_HEADER.pack(MAGIC, version_for(index), len(meta), crc, 0, len(index.names)))
        out.write(body)
        out.write(index.names)


def version_for(index: ShardIndex) -> int:
    return SQUASHFS_VERSION if index.format == "squashfs" else INDEX_VERSION


def file_id(st: os.stat_result) -> tuple:
    """What tells one version of a file from another: a file replaced (written anew and renamed
    in) or changed in place has another."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def load(path, columns: MemberColumns | None = None) -> ShardIndex:
    """From a file name, or a binary file object (an index fetched from beside a remote shard).
    Raises OSError, OutdatedIndex for another version, ValueError for a damaged file.
    ``columns``: where a file's member columns go (member_columns.py), read through its buffer."""
    try:
        if isinstance(path, (str, os.PathLike)):
            with open(path, "rb", buffering=0) as f:
                st = os.fstat(f.fileno())
                index = _read(f, st.st_size, columns)
                index.stored_id = file_id(st)
                return index
        data = path.read()
        return _read(io.BytesIO(data), len(data))
    # Fields missing or wrong; for an .npz, also a zip member of a method zipfile has not
    # (NotImplementedError: found by fuzzing) or cut short (EOFError, zlib.error).
    except (KeyError, TypeError, IndexError, struct.error, zipfile.BadZipFile, NotImplementedError, EOFError,
            zlib.error) as exc:
        raise ValueError(f"damaged ({type(exc).__name__}: {exc})") from None


def _read(f, size: int, columns: MemberColumns | None = None) -> ShardIndex:
    head = f.read(_HEADER.size)
    if head[:2] == b"PK":  # a zip: version 2
        from shardfs.index import index_npz  # older indexes only

        index = index_npz.load(head + f.read(), NPZ_VERSION)
        rehash(index)
        return index
    if len(head) < _HEADER.size or head[:8] != MAGIC:
        raise ValueError("not a shardfs index")
    _, version, meta_len, crc, _, names_len = _HEADER.unpack(head)
    if version not in CURRENT and version not in OLDER_FLAT:
        raise OutdatedIndex(f"index version {version}, this shardfs writes {INDEX_VERSION}")
    body_len = size - _HEADER.size - names_len
    if body_len < meta_len:
        raise ValueError(f"{size} bytes: too short for its header")
    # Not zeroed first, as a bytearray would be; the columns' buffer is the same for every file.
    body = np.empty(body_len, np.uint8) if columns is None else columns.scratch(body_len)
    if f.readinto(body) != body_len:
        raise ValueError("the file changed while it was read")
    names = f.read(names_len)
    if len(names) != names_len or f.read(1):
        raise ValueError("the file changed while it was read")
    if zlib.crc32(names, zlib.crc32(body)) != crc:
        raise ValueError("damaged (its checksum does not match)")
    index = _parse(body, meta_len, names, columns)
    if version not in CURRENT:
        rehash(index)
    elif version != version_for(index):  # a SquashFS index written as 5: written again as 6
        index.legacy = True
    return index


def rehash(index: ShardIndex) -> None:
    """An index from an older format: its path hashes computed again from its names (the hash
    changed in version 5; the names are what it hashes, so the shard is not read again), and
    marked to be written again in the current format (store.py)."""
    ends = index.name_end.tolist()
    names = index.names
    hashes = path_hashes([names[a:b] for a, b in zip([0] + ends[:-1], ends)])
    if index.hash.flags.writeable:  # (in place: it may be a slice of the mount's member columns)
        index.hash[:] = hashes
    else:
        index.hash = hashes
    index.legacy = True


def sparse_tables(maps: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    members = np.array(sorted(maps), dtype=np.int64)
    ends = np.cumsum([len(maps[m]) for m in members.tolist()], dtype=np.int64)
    runs = np.concatenate([maps[m].ravel() for m in members.tolist()]) if len(members) else np.empty(0, np.int64)
    return members, ends, runs.astype(np.int64)


def sparse_maps(members: np.ndarray, ends: np.ndarray, runs: np.ndarray) -> dict[int, np.ndarray]:
    """ValueError unless the tables agree with each other."""
    if not (len(members) or len(ends) or len(runs)):
        return {}
    if len(members) != len(ends) or (len(ends) and (int(ends[-1]) * 2 != len(runs) or (np.diff(ends) <= 0).any()
                                                     or int(ends[0]) <= 0)):
        raise ValueError("its sparse tables do not match")
    table = runs.reshape(-1, 2)
    starts = np.concatenate(([0], ends[:-1]))
    return {m: table[a:b] for m, a, b in zip(members.tolist(), starts.tolist(), ends.tolist())}


@functools.lru_cache(maxsize=64)
def _dtype(text: str) -> np.dtype:
    return plain_dtype(text)


def plain_dtype(text) -> np.dtype:
    """The numbers' dtype a file names for an array (integers, floats: what shardfs writes), else
    ValueError: numpy reads a dtype string as Python literals (SyntaxError), and would also take
    objects, records and sub-arrays (found by fuzzing)."""
    try:
        dt = np.dtype(text)
    except (TypeError, ValueError, SyntaxError) as exc:
        raise ValueError(f"not an array type: {text!r}") from exc
    if dt.kind not in "biuf" or dt.shape or dt.fields is not None:
        raise ValueError(f"not an array type of numbers: {text!r}")
    return dt


def _parse(body: np.ndarray, meta_len: int, names: bytes, columns: MemberColumns | None = None) -> ShardIndex:
    meta = json.loads(body[:meta_len].tobytes())
    pos = meta_len + _pad(meta_len)
    arrays = {}
    for name, dtype, count in meta["arrays"]:
        # Views of the body, not copies: the tree concatenates them and drops the body.
        dt = _dtype(dtype)
        arrays[name] = np.frombuffer(body, dtype=dt, count=count, offset=pos)
        nbytes = arrays[name].nbytes  # (not count * itemsize: a count of -1 means "the rest")
        pos += nbytes + _pad(nbytes)
    if pos != len(body):
        raise ValueError(f"a body of {len(body)} bytes, its tables account for {pos}")
    if columns is not None:  # the body is a buffer read into again: nothing may stay a view of it
        if not all(name in arrays for name, _ in member_columns.COLUMNS) or not columns.take(arrays):
            arrays = {name: a.copy() for name, a in arrays.items()}
        else:
            arrays.update({name: a.copy() for name, a in arrays.items() if a.base is not columns.arrays.get(name)})
    dirs = SplitOnUse(arrays.pop("dirs").tobytes(), meta["ndirs"])
    empty = np.empty(0, np.int64)
    sparse = sparse_maps(*(arrays.get(name, empty) for name in SPARSE_ARRAYS))
    if (dirs.blob.count(b"\0") + 1 if len(dirs) else len(dirs.blob)) != len(dirs):
        raise ValueError(f"its directories do not match the {len(dirs)} its header says")
    index = ShardIndex(
        format=meta["format"],
        shard_size=meta["shard_size"],
        shard_mtime_ns=meta["shard_mtime_ns"],
        shard_tag=meta["shard_tag"],
        shard_fingerprint=meta["shard_fingerprint"],
        names=names,
        dirs=dirs,
        symlinks={int(i): text_bytes(t) for i, t in meta["symlinks"].items()},
        warnings=meta["warnings"],
        error=meta["error"],
        sparse=sparse,
        classes=meta.get("classes"),
        columns=meta.get("columns", ""),
        logical_size=meta.get("logical_size", 0),
        **{name: arrays[name] for name in ARRAYS},
    )
    check(index)
    return index


# What the writer writes each array as (shard_index.ShardIndex); a file that says otherwise is damaged.
DTYPES = {"name_end": np.int64, "kind": np.uint8, "offset": np.int64, "size": np.int64, "mode": np.uint16,
          "mtime": np.float64, "hash": np.uint64, "parent": np.uint32, "cls_member": np.int32, "cls_value": np.int64}


def check(index: ShardIndex) -> None:
    """ValueError unless the arrays agree with each other (what the tree relies on to index them):
    a file whose CRC-32 matches may still come from a writer's bug or an edit (found by fuzzing,
    tests/fuzz/targets/index_file.py). Whole-array passes: a few ms per million members."""
    n = len(index.kind)
    if any(getattr(index, name).dtype != dtype for name, dtype in DTYPES.items()):
        raise ValueError("its arrays are not of the types shardfs writes")
    if any(len(getattr(index, name)) != n for name in ARRAYS[:8]):
        raise ValueError("its member tables differ in length")
    ends = index.name_end
    if n and (int(ends[-1]) != len(index.names) or int(ends[0]) < 0 or (np.diff(ends) < 0).any()
              or int(index.parent.max()) >= len(index.dirs)):
        raise ValueError("its names or directories do not match its members")
    if n and (int(index.kind.max()) > max(Kind) or int(index.offset.min()) < 0 or int(index.size.min()) < 0):
        raise ValueError("its kinds, offsets or sizes are out of range")
    if len(index.cls_member) != len(index.cls_value) or \
            (len(index.cls_member) and not 0 <= int(index.cls_member.min()) <= int(index.cls_member.max()) < n):
        raise ValueError("its labels do not match its members")
    if any(not 0 <= m < n or index.kind[m] != Kind.FILE or runs.ndim != 2 or runs.shape[1] != 2
           or (len(runs) and (int(runs.min()) < 0 or (runs[:, 1] > index.size[m] - runs[:, 0]).any()))
           for m, runs in index.sparse.items()):
        raise ValueError("its sparse maps do not match its members")
    if any(not 0 <= m < n or index.kind[m] != Kind.SYMLINK for m in index.symlinks):
        raise ValueError("its links do not match its members")
