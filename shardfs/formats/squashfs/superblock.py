"""The superblock of a SquashFS 4.0 image (96 bytes at offset 0) and the checks it must pass.

Layout and meaning per squashfs-tools-ng's doc/format.adoc: the sizes, the compressor and where
each table starts. Every position is checked against the image's size before anything is read
at it, so a damaged superblock refuses the image with one line.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from shardfs.formats.base import ShardFormatError
from shardfs.formats.squashfs import codecs

MAGIC = b"hsqs"
SUPERBLOCK = struct.Struct("<4sIIIIHHHHHHQQQQQQQQ")
assert SUPERBLOCK.size == 96
ABSENT = 0xFFFF_FFFF_FFFF_FFFF  # an optional table that is not there
FLAG_COMPRESSOR_OPTIONS = 0x0400
MIN_BLOCK, MAX_BLOCK = 4096, 1 << 20


@dataclass(frozen=True, slots=True)
class Superblock:
    inode_count: int
    block_size: int
    fragment_count: int
    compressor: int
    flags: int
    id_count: int
    root_inode: int  # a reference: (metadata block position relative to the inode table) << 16 | offset
    bytes_used: int
    id_table: int
    xattr_table: int
    inode_table: int
    directory_table: int
    fragment_table: int
    export_table: int

    @property
    def compressor_name(self) -> str:
        return codecs.NAMES.get(self.compressor, str(self.compressor))


def parse(raw: bytes, file_size: int) -> Superblock:
    if len(raw) < SUPERBLOCK.size:
        raise ShardFormatError(f"too small ({file_size} bytes) to be a SquashFS image")
    (magic, inodes, _mtime, block_size, frags, comp, block_log, flags, ids, major, minor, root, used,
     id_table, xattr_table, inode_table, dir_table, frag_table, export_table) = SUPERBLOCK.unpack_from(raw)
    if magic != MAGIC:
        raise ShardFormatError(f"not a SquashFS image (magic {magic!r})")
    if (major, minor) != (4, 0):
        raise ShardFormatError(f"SquashFS {major}.{minor}: only 4.0 is read (mksquashfs 4.x, squashfs-tools-ng)")
    if not MIN_BLOCK <= block_size <= MAX_BLOCK or block_size != 1 << block_log:
        raise ShardFormatError(f"bad block size {block_size} (log {block_log})")
    if used > file_size:
        raise ShardFormatError(f"truncated: {file_size} bytes, the superblock says {used}")
    sb = Superblock(inodes, block_size, frags, comp, flags, ids, root, used, id_table, xattr_table,
                    inode_table, dir_table, frag_table, export_table)
    codecs.decompressor(comp)  # lzo or an unknown id: refused here, with its one line
    # The tables in the order every writer puts them; the optional ones may be ABSENT.
    if not SUPERBLOCK.size <= inode_table < dir_table < used:
        raise ShardFormatError(f"inode table at {inode_table} and directory table at {dir_table} do not fit "
                               f"the image ({used} bytes)")
    for name, at in (("id", id_table), ("fragment", frag_table), ("export", export_table), ("xattr", xattr_table)):
        if at != ABSENT and not dir_table <= at < used:  # equal: an empty directory table
            raise ShardFormatError(f"{name} table at {at} lies outside the image's tables")
    if frags and frag_table == ABSENT:
        raise ShardFormatError(f"{frags} fragments but no fragment table")
    if inodes == 0 or ids == 0 or id_table == ABSENT:
        raise ShardFormatError("no inodes or no id table")
    return sb
