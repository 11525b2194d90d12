"""What an image's tables say, read and checked once: the superblock, the inode table (walked),
the fragment table and the plan of where every file's bytes lie (inodes.plan). The scan reads
the directory table on top of this; the data layout needs nothing more, and only the superblock
and the fragment table (``read_head``) until it reads a file that is not all in one fragment."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardfs.formats.base import ByteSource, ShardFormatError, Window
from shardfs.formats.squashfs import codecs, inodes, metadata, superblock
from shardfs.formats.squashfs.codecs import Decompress
from shardfs.formats.squashfs.inodes import FRAGMENT_DTYPE, Inodes, Plan
from shardfs.formats.squashfs.metadata import Get, Run
from shardfs.storage.base import ShardIOError


@dataclass(slots=True)
class Tables:
    sb: superblock.Superblock
    decompress: Decompress
    inode_run: Run
    inodes: Inodes
    fragments: np.ndarray  # FRAGMENT_DTYPE
    plan: Plan
    get: Get  # reads of the image (forward windows) for what else the caller reads


READ_WINDOW = 1 << 20  # the tables are read forward in windows of this size
HEAD = 64 << 10  # the first read at each end of the image (see read)


@dataclass(slots=True)
class Head:
    """The superblock and the fragment table: all a read of a file in one fragment block needs."""

    sb: superblock.Superblock
    decompress: Decompress
    fragments: np.ndarray  # FRAGMENT_DTYPE


def read_head(src: ByteSource) -> Head:
    sb, get, decompress = _superblock(src)
    return Head(sb, decompress, _fragments(get, sb, decompress))


def read(src: ByteSource) -> Tables:
    """The image's tables, read from the inode table's start on (never its data blocks), and the
    Window they were read through (the directory table follows them)."""
    sb, get, decompress = _superblock(src)
    run = Run(get, sb.inode_table, sb.directory_table, decompress)
    walked = inodes.walk(run.data, sb.block_size, sb.inode_count)
    fragments = _fragments(get, sb, decompress)  # (after the inode table: the tables are read forward)
    if len(walked.files):
        plan = inodes.plan(run.data, walked.files, fragments, sb.block_size, sb.bytes_used)
    else:
        plan = Plan(np.zeros(0, np.int64), np.zeros(0, bool), np.zeros(0, np.uint32), np.zeros(0, np.int64),
                    np.zeros(0, np.int64))
    return Tables(sb, decompress, run, walked, fragments, plan, get)


def _superblock(src: ByteSource) -> tuple[superblock.Superblock, Get, Decompress]:
    """The superblock, a Window over the tables (its first read made) and the decompressor."""
    try:
        # 64 KiB where 96 bytes are needed: the same storage request (readahead, or one ranged
        # GET), and an index build keeps it for the shard's fingerprint (index/fingerprint.py).
        head = src.pread(0, HEAD)
    except ShardIOError as exc:
        if exc.unavailable:
            raise
        raise ShardFormatError(f"read error at offset 0: {exc.strerror}") from None
    sb = superblock.parse(head, src.size)
    get = Window(src, READ_WINDOW).get
    # The tables from at least the image's last 64 KiB on, in one read: a small image's tables
    # are a few KiB at its end, and that read then also holds the fingerprint's last window.
    get(max(0, min(sb.inode_table, src.size - HEAD)), 1)
    return sb, get, codecs.decompressor(sb.compressor)


def _fragments(get: Get, sb: superblock.Superblock, decompress: Decompress) -> np.ndarray:
    if not sb.fragment_count:
        return np.zeros(0, FRAGMENT_DTYPE)
    raw = metadata.lookup_table(get, sb.fragment_table, sb.fragment_count, FRAGMENT_DTYPE.itemsize,
                                sb.bytes_used, decompress, "fragment")
    return np.frombuffer(raw, FRAGMENT_DTYPE)


def check_ids(t: Tables) -> None:
    """Every inode's owner and group index names an entry of the id table (unsquashfs refuses
    an image where one does not)."""
    sb = t.sb
    metadata.lookup_table(t.get, sb.id_table, sb.id_count, 4, sb.bytes_used, t.decompress, "id")
    if len(t.inodes.uid) and max(int(t.inodes.uid.max()), int(t.inodes.gid.max())) >= sb.id_count:
        raise ShardFormatError(f"an inode's owner or group is not among the id table's {sb.id_count} entries")
