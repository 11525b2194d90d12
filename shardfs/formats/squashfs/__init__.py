"""SquashFS 4.0 images (``.sqfs``, ``.squashfs``) as mksquashfs 4.x and squashfs-tools-ng write
them, served as ``unsquashfs -d`` extracts them.

The index comes from the image's own tables (superblock, inode table, directory table,
fragment table), never from its data blocks: ``tables`` reads and checks them, ``inodes`` walks
the inodes and says where each file's bytes lie, ``directories`` turns the listings into member
records, ``layout`` reads the files' blocks, ``codecs`` decompresses them (gzip, xz, lzma, lz4,
zstd; lzo refused). Layout per squashfs-tools-ng's doc/format.adoc.
"""

from __future__ import annotations

import numpy as np

from shardfs.formats.base import ByteSource, ScanResult, ShardFormatError
from shardfs.formats.squashfs import directories, tables
from shardfs.formats.squashfs.metadata import Run


class SquashfsFormat:
    name = "squashfs"
    suffixes = (".sqfs", ".squashfs")
    members_as_stored = True  # each file that is one range of the image (see as_stored)
    # Indexed on the daemon's threads (view/dataset.py), not in worker processes: a scan reads the
    # tables alone, a few small reads, and its Python work is ~9 us a member. Measured on 2 cores
    # (shared), 100 images of 10 files: 0.18-0.21 s on threads, 0.87-1.02 s in processes (their
    # fork server's start and imports, the indexes pickled back); 100 of 1,000 tiny files:
    # 0.87-1.12 s against 1.71 s; 8 of 12,500: 1.16 s against 1.81-1.89 s. (Not measured: a node
    # with many cores, where processes could scan images of very many files side by side.)
    builds_in_threads = True

    def as_stored(self, offsets: np.ndarray) -> bool:
        """Files stored as one range of the image (blocks stored uncompressed, as mksquashfs does
        for JPEG blocks it cannot shrink) are served like tar members, by the compiled loop from
        the cached image; files at VIRTUAL offsets go to Python and the layout (fuse/table.py)."""
        return True

    def scan(self, src: ByteSource) -> ScanResult:
        """Members from the tables; damage anywhere in them refuses the image (``error``)."""
        try:
            records, warnings = read_members(src)
        except ShardFormatError as exc:
            return ScanResult(members=[], warnings=[], error=str(exc))
        return ScanResult(members=records, warnings=warnings)

    def open_layout(self, src: ByteSource, size: int):
        from shardfs.formats.squashfs.layout import SquashfsLayout

        if src.size != size:
            raise ShardFormatError(f"file is {src.size} bytes, expected {size} (shard changed?)")
        return SquashfsLayout(src)


def read_members(src: ByteSource):
    """(member records, warnings); ShardFormatError on damage."""
    t = tables.read(src)
    tables.check_ids(t)
    get = t.get
    sb, walked = t.sb, t.inodes
    last_block = directories.last_listing_block(walked)
    needed: list[int] = []

    def enough(starts: list, ustarts: list, total: int) -> bool:
        # The directory table's end is not in the superblock: read it up to the block the last
        # listing starts in, then as far as the listings reach.
        if starts[-1] < last_block:
            return False
        if not needed:
            needed.append(directories.listings_end(walked, dict(zip(starts, ustarts))))
        return total >= needed[0]

    if any(size >= 4 for _, _, size in walked.dirs.values()):
        dirs = Run(get, sb.directory_table, sb.bytes_used, t.decompress, enough)
        dir_data, dir_blocks = dirs.data, dirs.block_map()
    else:  # only empty directories: the image may have no directory table blocks at all
        dir_data, dir_blocks = b"", {}
    return directories.members(t.inode_run.position(sb.root_inode >> 16, sb.root_inode & 0xFFFF), walked,
                               dir_data, dir_blocks,
                               t.inode_run.block_map(), t.plan.offsets)


FORMAT = SquashfsFormat()
