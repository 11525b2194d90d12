"""Reads of an image's files: offsets of the logical stream (inodes.plan) to bytes.

An offset without ``VIRTUAL`` is the image's own byte position (a file stored as one range).
An offset with ``IN_FRAGMENT`` names a fragment block and a place in it: read with the fragment
table alone (a tiny file, a JPEG under the block size). Any other virtual offset is found among
the virtual files by a binary search, in arrays made from the inode table on the first such read
(a walk of every inode: ~3 s and ~300 MB at its peak for 1,000,000 of them, so not before a read
needs it; 40 bytes kept per virtual file, six numbers, and per block its 4-byte size field). The
file's blocks are read from the image (through the RAM cache: ``fetch``), decompressed once into
the bounded cache that lz4 blocks and Parquet pages share, and kept there while the file's
neighbours (the same fragment block, the next block) are read. A block stored uncompressed is
served from the cached image as is.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from shardfs.formats.base import ByteSource, Fetch, ShardFormatError
from shardfs.formats.lz4shard import BLOCK_CACHE, BlockCache
from shardfs.formats.squashfs import tables
from shardfs.formats.squashfs.inodes import IN_FRAGMENT, NO_FRAGMENT, PLACE_BITS, RAW_BLOCK, SIZE_MASK, VIRTUAL


@dataclass(slots=True)
class _VirtualFiles:
    """The files read through blocks, in stream order (inodes.plan): where each starts in the
    stream, its blocks' start in the image, size, fragment and place in it, first block size field."""

    vstart: np.ndarray
    start: np.ndarray
    size: np.ndarray
    frag: np.ndarray
    frag_off: np.ndarray
    first: np.ndarray
    sizes: np.ndarray

    @classmethod
    def of(cls, t: tables.Tables) -> _VirtualFiles:
        files, plan = t.inodes.files, t.plan
        v = plan.virtual
        n = files["n"][v]
        return cls(vstart=plan.stream, start=files["start"][v], size=files["size"][v].astype(np.int64),
                   frag=files["frag"][v], frag_off=files["frag_off"][v], first=np.cumsum(n) - n,
                   sizes=plan.sizes[np.repeat(v, files["n"])])


class SquashfsLayout:
    def __init__(self, src: ByteSource, cache: BlockCache | None = None):
        head = tables.read_head(src)  # (not kept: its window holds up to a MiB of the image)
        self._src = src
        self._fragments = head.fragments
        self._bs, self._end, self._decompress = head.sb.block_size, head.sb.bytes_used, head.decompress
        self._files: _VirtualFiles | None = None  # made on the first read that needs it (_virtual)
        self._walking = threading.Lock()
        self._cache = BLOCK_CACHE if cache is None else cache
        self._id = self._cache.owner()

    @property
    def walked(self) -> bool:
        """Whether a read has needed the inode table (a file in blocks, or an index made before IN_FRAGMENT)."""
        return self._files is not None

    def _virtual(self) -> _VirtualFiles:
        if self._files is None:
            with self._walking:  # (one walk, also when several readers come at once)
                if self._files is None:
                    self._files = _VirtualFiles.of(tables.read(self._src))
        return self._files

    def read(self, offset: int, length: int, fetch: Fetch) -> bytes:
        if not offset & VIRTUAL:
            return fetch(offset, length)
        if length <= 0:
            return b""
        if offset & IN_FRAGMENT:
            return self._fragment(offset, length, fetch)
        off = offset - VIRTUAL
        vf = self._virtual()
        i = int(np.searchsorted(vf.vstart, off, "right")) - 1
        within = off - int(vf.vstart[i]) if i >= 0 else -1
        if i < 0 or within + length > int(vf.size[i]):
            raise ShardFormatError(f"range at {offset} is in no file of the image")
        bs = self._bs
        parts = []
        for k in range(within // bs, (within + length - 1) // bs + 1):
            block = self._file_block(vf, i, k, fetch)
            parts.append(memoryview(block)[max(within - k * bs, 0) : within + length - k * bs])
        return bytes(parts[0]) if len(parts) == 1 else b"".join(parts)

    def _fragment(self, offset: int, length: int, fetch: Fetch) -> bytes:
        """``length`` bytes at an IN_FRAGMENT offset (the reader keeps reads within the file)."""
        place = offset & ((1 << PLACE_BITS) - 1)
        return self._in_fragment((offset & ~(VIRTUAL | IN_FRAGMENT)) >> PLACE_BITS, place, length, fetch)

    def _in_fragment(self, f: int, at: int, want: int, fetch: Fetch) -> bytes:
        if f == NO_FRAGMENT or f >= len(self._fragments):
            raise ShardFormatError(f"fragment {f} is not in the fragment table")
        start, field, _ = self._fragments[f].item()
        data = self._block(start, field, fetch, f"fragment block {f} at {start}")
        if at + want > len(data):
            raise ShardFormatError(f"fragment block {f}: a tail at {at} of {want} bytes passes its end")
        return data[at : at + want]

    def _file_block(self, vf: _VirtualFiles, i: int, k: int, fetch: Fetch) -> bytes:
        """Block ``k`` of virtual file ``i``, as long as the file has bytes there (the last one shorter)."""
        bs = self._bs
        want = min(bs, int(vf.size[i]) - k * bs)
        size = int(vf.size[i])
        blocks = size // bs if int(vf.frag[i]) != NO_FRAGMENT else -(-size // bs)  # as inodes.walk counts
        if k < blocks:
            first = int(vf.first[i])
            field = int(vf.sizes[first + k])
            stored = field & SIZE_MASK
            if stored == 0:
                return bytes(want)  # a sparse block: zeros, nothing stored
            pos = int(vf.start[i]) + int((vf.sizes[first : first + k] & SIZE_MASK).sum(dtype=np.int64))
            data = self._block(pos, field, fetch, f"data block at {pos}")
        else:
            return self._in_fragment(int(vf.frag[i]), int(vf.frag_off[i]), want, fetch)
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
