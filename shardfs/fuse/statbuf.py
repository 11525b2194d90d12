"""Fill libfuse's ``struct stat`` in one C call (``struct.pack_into``), laid out from mfusepy's own
``c_stat`` for this platform: setting its ctypes fields one by one (and zeroing it first) cost
more than finding the member."""

from __future__ import annotations

import ctypes
import operator
import struct

from shardfs.fuse.lib import load as load_fuse

fuse = load_fuse()

# What shardfs sets, in the order fill() takes it; every other byte (st_dev, st_rdev, st_blksize,
# padding) is written as zero, so the struct needs no memset first.
FIELDS = ("st_ino", "st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks",
          "st_atimespec", "st_mtimespec", "st_ctimespec")
_CODES = {4: "I", 8: "Q", 16: "qq"}  # integers by size; a timespec is (seconds, nanoseconds)


def _layout() -> tuple[struct.Struct, operator.itemgetter]:
    """The pack format in memory order, and a getter that puts fill()'s flat values in that order."""
    placed, flat = [], 0
    for name in FIELDS:
        field = getattr(fuse.c_stat, name)
        width = 2 if field.size == 16 else 1  # a timespec takes two flat values
        placed.append((field.offset, field.size, tuple(range(flat, flat + width))))
        flat += width
    fmt, pos, order = "=", 0, []
    for offset, size, values in sorted(placed):
        fmt += f"{offset - pos}x" + _CODES[size]
        pos = offset + size
        order += values
    fmt += f"{ctypes.sizeof(fuse.c_stat) - pos}x"
    return struct.Struct(fmt), operator.itemgetter(*order)


_STRUCT, _IN_MEMORY_ORDER = _layout()
_pack_into = _STRUCT.pack_into


def fill(buf, ino: int, mode: int, nlink: int, uid: int, gid: int, size: int, blocks: int, mtime_ns: int) -> None:
    """The whole struct stat in ``buf`` (a ctypes c_stat); atime = ctime = mtime."""
    sec, nsec = divmod(mtime_ns, 1_000_000_000)
    _pack_into(buf, 0, *_IN_MEMORY_ORDER((ino, mode, nlink, uid, gid, size, blocks, sec, nsec, sec, nsec, sec, nsec)))
