"""Reads of an image's files: offsets of the logical stream (inodes.plan) to bytes.

An offset without ``VIRTUAL`` is the image's own byte position (a file stored as one range).
A virtual offset is found among the virtual files by a binary search; the file's blocks are read
from the image (through the RAM cache: ``fetch``), decompressed once into the bounded cache that
lz4 blocks and Parquet pages share, and kept there while the file's neighbours (the same fragment
block, the next block) are read. A block stored uncompressed is served from the cached image
as is. Per virtual file the layout keeps 40 bytes (six numbers), per block its 4-byte size field.
"""

from __future__ import annotations

import numpy as np

from shardfs.formats.base import Fetch, ShardFormatError
from shardfs.formats.lz4shard import BLOCK_CACHE, BlockCache
from shardfs.formats.squashfs.inodes import NO_FRAGMENT, RAW_BLOCK, SIZE_MASK, VIRTUAL
from shardfs.formats.squashfs.tables import Tables


class SquashfsLayout:
    def __init__(self, t: Tables, cache: BlockCache | None = None):
        files, plan = t.inodes.files, t.plan
        v = plan.virtual
        self._vstart = plan.offsets[v] - VIRTUAL  # sorted: given in table order
        self._start = files["start"][v]
        self._size = files["size"][v].astype(np.int64)
        self._frag = files["frag"][v]
        self._frag_off = files["frag_off"][v]
        n = files["n"][v]
        self._first = np.cumsum(n) - n  # where each file's block sizes start in ``_sizes``
        self._sizes = plan.sizes[np.repeat(v, files["n"])]
        self._fragments = t.fragments
        self._bs, self._end, self._decompress = t.sb.block_size, t.sb.bytes_used, t.decompress
        self._cache = BLOCK_CACHE if cache is None else cache
        self._id = self._cache.owner()

    def read(self, offset: int, length: int, fetch: Fetch) -> bytes:
        if not offset & VIRTUAL:
            return fetch(offset, length)
        if length <= 0:
            return b""
        off = offset - VIRTUAL
        i = int(np.searchsorted(self._vstart, off, "right")) - 1
        within = off - int(self._vstart[i]) if i >= 0 else -1
        if i < 0 or within + length > int(self._size[i]):
            raise ShardFormatError(f"range at {offset} is in no file of the image")
        bs = self._bs
        parts = []
        for k in range(within // bs, (within + length - 1) // bs + 1):
            block = self._file_block(i, k, fetch)
            parts.append(memoryview(block)[max(within - k * bs, 0) : within + length - k * bs])
        return bytes(parts[0]) if len(parts) == 1 else b"".join(parts)

    def _file_block(self, i: int, k: int, fetch: Fetch) -> bytes:
        """Block ``k`` of virtual file ``i``, as long as the file has bytes there (the last one shorter)."""
        bs = self._bs
        want = min(bs, int(self._size[i]) - k * bs)
        size = int(self._size[i])
        blocks = size // bs if int(self._frag[i]) != NO_FRAGMENT else -(-size // bs)  # as inodes.walk counts
        if k < blocks:
            first = int(self._first[i])
            field = int(self._sizes[first + k])
            stored = field & SIZE_MASK
            if stored == 0:
                return bytes(want)  # a sparse block: zeros, nothing stored
            pos = int(self._start[i]) + int((self._sizes[first : first + k] & SIZE_MASK).sum(dtype=np.int64))
            data = self._block(pos, field, fetch, f"data block at {pos}")
        else:
            f = int(self._frag[i])
            if f == NO_FRAGMENT or f >= len(self._fragments):
                raise ShardFormatError(f"fragment {f} is not in the fragment table")
            start, field, _ = self._fragments[f].item()
            data = self._block(start, field, fetch, f"fragment block {f} at {start}")
            at = int(self._frag_off[i])
            if at + want > len(data):
                raise ShardFormatError(f"fragment block {f}: a tail at {at} of {want} bytes passes its end")
            return data[at : at + want]
        if len(data) > want:
            raise ShardFormatError(f"data block at {pos}: {len(data)} bytes where the file has {want}")
        return data if len(data) == want else data + bytes(want - len(data))  # a short block ends in zeros

    def _block(self, pos: int, field: int, fetch: Fetch, where: str) -> bytes:
        stored = field & SIZE_MASK
        if field & ~(SIZE_MASK | RAW_BLOCK) or stored > self._bs or pos + stored > self._end:
            raise ShardFormatError(f"{where}: stored size {stored} does not fit the image")
        if field & RAW_BLOCK:
            raw = fetch(pos, stored)
            if len(raw) != stored:
                raise ShardFormatError(f"{where}: short read")
            return raw
        key = (self._id, pos)
        data = self._cache.get(key)
        if data is None:
            raw = fetch(pos, stored)
            if len(raw) != stored:
                raise ShardFormatError(f"{where}: short read")
            try:
                data = self._decompress(bytes(raw), self._bs)
            except ShardFormatError as exc:
                raise ShardFormatError(f"{where}: {exc}") from None
            self._cache.put(key, data)
        return data
