"""Metadata blocks: the inode and directory tables, and lookup tables (fragments, ids).

A metadata block is a 16-bit header (its stored size; the top bit set when stored uncompressed)
and at most 8 KiB once decompressed. A table is a run of such blocks, one stream cut in 8 KiB
pieces; a reference names a block by its position relative to the table's start, and an offset
into that block's decompressed bytes. Everything here reads forward, so a damaged header can never
lead back into a loop, and every run is bounded by ``MAX_TABLES`` decompressed bytes.
"""

from __future__ import annotations

import struct
from typing import Callable

import numpy as np

from shardfs.formats.base import ShardFormatError
from shardfs.formats.squashfs.codecs import Decompress

Get = Callable[[int, int], bytes]  # (position in the image, length) -> bytes (fewer only at its end)

METADATA_SIZE = 8192
UNCOMPRESSED = 0x8000
MAX_TABLES = 1 << 30  # decompressed inode + directory table bytes an image may have (4M files: ~300 MB)


def read_block(get: Get, pos: int, end: int, decompress: Decompress) -> tuple[bytes, int]:
    """The decompressed block whose header is at ``pos`` and the position of the next header."""
    head = get(pos, 2)
    if len(head) != 2 or pos + 2 > end:
        raise ShardFormatError(f"metadata block at {pos}: beyond its table")
    (h,) = struct.unpack("<H", head)
    stored = h & ~UNCOMPRESSED
    if not 0 < stored <= METADATA_SIZE or pos + 2 + stored > end:
        raise ShardFormatError(f"metadata block at {pos}: stored size {stored} does not fit")
    raw = get(pos + 2, stored)
    if len(raw) != stored:
        raise ShardFormatError(f"metadata block at {pos}: cut short")
    data = bytes(raw) if h & UNCOMPRESSED else decompress(bytes(raw), METADATA_SIZE)
    return data, pos + 2 + stored


class Run:
    """A table's blocks decompressed one after another: ``data`` their bytes back to back,
    ``starts[i]`` block i's position relative to the table, ``ustarts[i]`` where its bytes begin.
    It ends at ``end``, or before that once ``enough(starts, ustarts, total)`` says so."""

    def __init__(self, get: Get, table: int, end: int, decompress: Decompress,
                 enough: Callable[[list, list, int], bool] | None = None):
        parts: list[bytes] = []
        self.starts: list[int] = []
        self.ustarts: list[int] = []
        pos, total = table, 0
        while pos < end and not (enough and parts and enough(self.starts, self.ustarts, total)):
            data, nxt = read_block(get, pos, end, decompress)
            self.starts.append(pos - table)
            self.ustarts.append(total)
            parts.append(data)
            total += len(data)
            if total > MAX_TABLES:
                raise ShardFormatError(f"metadata tables expand beyond {MAX_TABLES >> 20} MiB")
            pos = nxt
        self.data = b"".join(parts)

    def position(self, block: int, offset: int) -> int:
        """Where a reference (block position relative to the table, offset) is in ``data``."""
        i = _find(self.starts, block)
        if i < 0:
            raise ShardFormatError(f"reference to metadata block {block}, which is no block start")
        return self.ustarts[i] + offset

    def block_map(self) -> dict[int, int]:
        """Block position relative to the table -> where its bytes begin in ``data``."""
        return dict(zip(self.starts, self.ustarts))


def _find(starts: list[int], block: int) -> int:
    i = int(np.searchsorted(starts, block))
    return i if i < len(starts) and starts[i] == block else -1


def lookup_table(get: Get, at: int, count: int, entry_size: int, end: int, decompress: Decompress,
                 what: str) -> bytes:
    """The ``count`` entries of a lookup table whose block locations (u64 each) are at ``at``."""
    want = count * entry_size
    blocks = -(-want // METADATA_SIZE)
    if at + 8 * blocks > end:
        raise ShardFormatError(f"{what} table at {at}: its {blocks} block locations pass the image's end")
    raw = get(at, 8 * blocks)
    if len(raw) != 8 * blocks:
        raise ShardFormatError(f"{what} table at {at}: cut short")
    parts = []
    for i, location in enumerate(struct.unpack(f"<{blocks}Q", raw)):
        data, _ = read_block(get, location, end, decompress)
        if len(data) != min(METADATA_SIZE, want - i * METADATA_SIZE):
            raise ShardFormatError(f"{what} table block {i}: {len(data)} bytes, not what its entries need")
        parts.append(data)
    return b"".join(parts)
