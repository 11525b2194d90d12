"""The inode table: one walk over its decompressed bytes, and where each regular file's bytes lie.

Inodes are packed one after another (each writer does so, and their count is in the superblock,
which the walk checks), so one forward walk finds every inode's position; the fields the index
needs are then gathered with numpy from those positions. ``plan`` gives each regular file its
offset in the shard's logical stream (formats/base.py), a pure function of the inode table and
the fragment table, so the scan (the index) and the data layout (reads) agree on it:

* a file whose bytes are one range of the image as stored (every block stored uncompressed and
  whole, no tail in a fragment; or all of it in an uncompressed fragment block) has that range's
  position: the compiled loop serves it from the cached image like a tar member;
* a file all in one compressed fragment block (every file under the block size, as mksquashfs
  and tar2sqfs pack them: a dataset's JPEGs, its labels) gets ``VIRTUAL | IN_FRAGMENT``, the
  fragment's number and the file's place in its block: the layout reads it with the fragment
  table alone, no per-file state, no walk of the inode table;
* every other file gets ``VIRTUAL`` plus its ``stream`` offset, the sum of the sizes of the
  virtual files before it in the table (fragment files counted too, as indexes made before
  ``IN_FRAGMENT`` hold them): the layout walks the inode table on the first read of one, finds
  it by a binary search and reads its blocks.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from shardfs.formats.base import VIRTUAL, ShardFormatError

NO_FRAGMENT = 0xFFFF_FFFF
RAW_BLOCK = 1 << 24  # block size field: stored uncompressed
SIZE_MASK = RAW_BLOCK - 1
MAX_FILE = 1 << 48  # 256 TiB: beyond, a size is damage (and sums of them could overflow int64)
IN_FRAGMENT = 1 << 61  # with VIRTUAL: fragment number << PLACE_BITS | place of the file in its block
PLACE_BITS = 20  # a block is at most 1 MiB, so a place plus a place within the file stays below 1 << 20

DIR, FILE, SYMLINK, BLOCK_DEV, CHAR_DEV, FIFO, SOCKET = 1, 2, 3, 4, 5, 6, 7
EXTENDED = 7  # type + 7: the extended form of a basic type

_TYPE = struct.Struct("<H")
_BASIC_FILE = struct.Struct("<IIII")  # blocks start, fragment, offset in it, size
_EXT_FILE = struct.Struct("<QQQIIII")  # blocks start, size, sparse, links, fragment, offset in it, xattr
_BASIC_DIR = struct.Struct("<IIHHI")  # listing block, links, listing size + 3, offset in the block, parent
_EXT_DIR = struct.Struct("<IIIIHHI")  # links, listing size + 3, listing block, parent, index count, offset, xattr
_LINK = struct.Struct("<II")  # links, target size
_INDEX = struct.Struct("<III")  # directory index entry: position, block, name size - 1
_HEADER = 16
_FIXED = {BLOCK_DEV: 8, CHAR_DEV: 8, FIFO: 4, SOCKET: 4,
          BLOCK_DEV + EXTENDED: 12, CHAR_DEV + EXTENDED: 12, FIFO + EXTENDED: 8, SOCKET + EXTENDED: 8}

FILE_DTYPE = np.dtype([("at", "<i8"), ("start", "<u8"), ("size", "<u8"), ("frag", "<u4"),
                       ("frag_off", "<u4"), ("list_at", "<i8"), ("n", "<i8")])


@dataclass(slots=True)
class Inodes:
    at: np.ndarray  # int64: each inode's position in the table's bytes, in table order
    type: np.ndarray  # uint16
    mode: np.ndarray  # uint16 permission bits
    uid: np.ndarray  # uint16 index into the id table
    gid: np.ndarray
    mtime: np.ndarray  # uint32
    files: np.ndarray  # FILE_DTYPE, regular files in table order
    dirs: dict[int, tuple[int, int, int]]  # position -> (listing block, offset in it, listing size)
    links: dict[int, bytes]  # position -> symlink target


def walk(data: bytes, block_size: int, count: int) -> Inodes:
    """Every inode of the table (``count`` of them, as the superblock says); ShardFormatError for
    an unknown type or one that passes the table's end."""
    end = len(data)
    pos = 0
    positions: list[int] = []
    files: list[tuple] = []
    dirs: dict[int, tuple[int, int, int]] = {}
    links: dict[int, bytes] = {}
    add = positions.append
    type_of, basic_file, ext_file = _TYPE.unpack_from, _BASIC_FILE.unpack_from, _EXT_FILE.unpack_from
    try:
        while pos < end:
            if len(positions) == count:
                raise ShardFormatError(f"more inodes in the table than the superblock's {count}")
            add(pos)
            (t,) = type_of(data, pos)
            body = pos + _HEADER
            if t == FILE or t == FILE + EXTENDED:
                if t == FILE:
                    start, frag, frag_off, size = basic_file(data, body)
                    list_at = body + 16
                else:
                    start, size, _sparse, _links, frag, frag_off, _xattr = ext_file(data, body)
                    list_at = body + 40
                if size >= MAX_FILE:
                    raise ShardFormatError(f"inode at {pos}: a file of {size} bytes")
                n = size // block_size if frag != NO_FRAGMENT else -(-size // block_size)
                nxt = list_at + 4 * n
                files.append((pos, start, size, frag, frag_off, list_at, n))
            elif t == DIR:
                block, _links, size, offset, _parent = _BASIC_DIR.unpack_from(data, body)
                dirs[pos] = (block, offset, size)
                nxt = body + 16
            elif t == DIR + EXTENDED:
                _links, size, block, _parent, index_count, offset, _xattr = _EXT_DIR.unpack_from(data, body)
                dirs[pos] = (block, offset, size)
                nxt = body + 24
                for _ in range(index_count):  # the lookup index: skipped, listings are read whole
                    nxt += 12 + _INDEX.unpack_from(data, nxt)[2] + 1
            elif t == SYMLINK or t == SYMLINK + EXTENDED:
                _links, length = _LINK.unpack_from(data, body)
                nxt = body + 8 + length
                links[pos] = data[body + 8 : nxt]
                nxt += 4 if t != SYMLINK else 0
            elif t in _FIXED:
                nxt = body + _FIXED[t]
            else:
                raise ShardFormatError(f"inode at {pos}: unknown type {t}")
            if nxt > end:
                raise struct.error
            pos = nxt
    except struct.error:
        raise ShardFormatError(f"inode at {pos}: passes the end of the inode table") from None
    if len(positions) != count:
        raise ShardFormatError(f"{len(positions)} inodes in the table, the superblock says {count}")
    at = np.array(positions, dtype=np.int64)
    table = np.frombuffer(data, np.uint8)
    return Inodes(at=at, type=_u16(table, at), mode=_u16(table, at + 2) & 0o7777, uid=_u16(table, at + 4),
                  gid=_u16(table, at + 6), mtime=_u32(table, at + 8),
                  files=np.array(files, dtype=FILE_DTYPE), dirs=dirs, links=links)


def _u16(table: np.ndarray, at: np.ndarray) -> np.ndarray:
    return table[at].astype(np.uint16) | table[at + 1].astype(np.uint16) << 8


def _u32(table: np.ndarray, at: np.ndarray) -> np.ndarray:
    return _u16(table, at).astype(np.uint32) | _u16(table, at + 2).astype(np.uint32) << 16


def block_sizes(data: bytes, files: np.ndarray) -> np.ndarray:
    """Every file's block size list, one after another (uint32, table order)."""
    n = files["n"]
    total = int(n.sum())
    first = np.cumsum(n) - n
    at = np.repeat(files["list_at"] - 4 * first, n) + 4 * np.arange(total, dtype=np.int64)
    return _u32(np.frombuffer(data, np.uint8), at)


@dataclass(slots=True)
class Plan:
    offsets: np.ndarray  # int64, each file's offset in the logical stream (files in table order)
    virtual: np.ndarray  # bool: read through the layout
    sizes: np.ndarray  # uint32 block size lists of all files (block_sizes)
    first: np.ndarray  # int64: where each file's list starts in ``sizes``
    stream: np.ndarray  # int64: the virtual files' stream offsets, VIRTUAL clear (also those IN_FRAGMENT)


FRAGMENT_DTYPE = np.dtype([("start", "<u8"), ("size", "<u4"), ("unused", "<u4")])


def plan(data: bytes, files: np.ndarray, fragments: np.ndarray, block_size: int, image_end: int) -> Plan:
    n, size, frag, start = files["n"], files["size"], files["frag"], files["start"]
    sizes = block_sizes(data, files)
    first = np.cumsum(n) - n
    owner = np.repeat(np.arange(len(files)), n)
    k = np.arange(len(sizes), dtype=np.int64) - first[owner]
    last = (k == n[owner] - 1) & (frag[owner] == NO_FRAGMENT)
    expected = np.where(last, size[owner] - (n[owner] - 1).astype(np.uint64) * np.uint64(block_size),
                        np.uint64(block_size))
    whole_raw = (sizes & np.uint32(~SIZE_MASK & 0xFFFF_FFFF)) == RAW_BLOCK
    whole_raw &= (sizes & SIZE_MASK) == expected
    bad = np.bincount(owner, weights=~whole_raw, minlength=len(files))
    end = np.uint64(image_end)
    fits = (start <= end) & (size <= end - np.minimum(start, end))
    offsets = np.zeros(len(files), np.int64)
    in_blocks = (n > 0) & (frag == NO_FRAGMENT) & (bad == 0) & fits
    offsets[in_blocks] = start[in_blocks].astype(np.int64)
    in_fragment = (n == 0) & (frag < len(fragments)) & (size > 0)
    if in_fragment.any():
        entry = fragments[np.where(in_fragment, frag, 0)]
        stored = entry["size"] & np.uint32(SIZE_MASK)
        in_fragment &= ((entry["size"] & np.uint32(RAW_BLOCK)) != 0) & (stored <= block_size)
        in_fragment &= (entry["start"] <= end) & (stored <= end - np.minimum(entry["start"], end))
        in_fragment &= files["frag_off"].astype(np.uint64) + size <= stored
        offsets[in_fragment] = (entry["start"] + files["frag_off"])[in_fragment].astype(np.int64)
    virtual = (size > 0) & ~in_blocks & ~in_fragment
    vsize = size[virtual].astype(np.int64)
    if int(vsize.sum(dtype=np.float64)) >= VIRTUAL - (1 << 50):
        raise ShardFormatError("its files add up to more than shardfs can address")
    stream = np.cumsum(vsize) - vsize
    offsets[virtual] = VIRTUAL + stream
    # Files all in one fragment block (its size and place checked where it is read: layout._fragment).
    place_fits = files["frag_off"].astype(np.uint64) + size <= np.uint64(min(block_size, 1 << PLACE_BITS))
    whole = virtual & (n == 0) & (frag < len(fragments)) & place_fits
    offsets[whole] = (VIRTUAL | IN_FRAGMENT | frag[whole].astype(np.int64) << PLACE_BITS
                      | files["frag_off"][whole].astype(np.int64))
    return Plan(offsets, virtual, sizes, first, stream)
