"""One pass that indexes and fills: what an index build reads from shared storage is kept in the
disk tier and the RAM cache, as they would keep it, so that the first epoch does not read it again.

A build reads its shard through ``Shard.pread`` (tar: 4 MiB sequential reads). ``Keeper.reading``
watches those reads (``Shard.on_read``) and cuts them into the caches' 1 MiB chunks: every chunk
the reads cover whole, one after another, goes to the shard's tier file (written as the tier writes
a fill, checksummed, ``disk.BuildChunks``) and, where the RAM cache would load every shard anyway
(``--prefetch all``), into a RAM buffer. A gap, where the scan skipped a
large member's data, loses the chunk it cuts into; those chunks are read by the epochs, as without
this. Each cache takes the shard by its own policy (room in its bound, eviction), or not at all.

Nothing is trusted before the build is done and the shard found as it was when the build began
(its size and mtime, a remote object's tag; each read is checked too): a shard that changes midway,
or a build cut short by an unmount, leaves nothing in either cache. A RAM buffer is kept only if
every chunk arrived; it becomes resident once the view holds the shard (``adopt``).

What a build reads counts as read from storage (``cache.build_bytes_read``, included in
``cache.storage_bytes_read``), each byte once: bytes a build reads again are not counted.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import threading
from typing import TYPE_CHECKING

from shardfs.storage import ram, tierfile
from shardfs.storage.base import Shard, ShardIOError

if TYPE_CHECKING:
    from shardfs.storage.disk import DiskTier

log = logging.getLogger(__name__)

CHUNK = tierfile.CHUNK
assert CHUNK == ram.CHUNK  # one chunk of the build fills one chunk of each cache


class Chunks:
    """Whole chunks out of a stream of reads (offset, bytes), while they follow one another:
    ``put(chunk, data)`` for each chunk (the last one may be short) covered whole."""

    def __init__(self, size: int, put):
        self.size, self.put = size, put
        self.next = 0  # the next byte wanted; next - len(pending) is a chunk's start
        self.pending = bytearray()
        self.count = 0  # chunks put

    def __call__(self, offset: int, data) -> None:
        end = offset + len(data)
        if end <= self.next:
            return  # read again (the plain tar scanner reads some headers twice)
        if offset > self.next:  # a gap: the chunk under way is lost, the next whole one starts
            self.pending.clear()
            self.next = -(-offset // CHUNK) * CHUNK
            if self.next >= end:
                return
        view = memoryview(data)[self.next - offset :]
        if self.pending:
            take = min(len(view), CHUNK - len(self.pending))
            self.pending += view[:take]
            view, self.next = view[take:], self.next + take
            if len(self.pending) == CHUNK or self.next == self.size:
                self._put((self.next - 1) // CHUNK, self.pending)
                self.pending = bytearray()
        while len(view):
            n = min(CHUNK, len(view))
            if n == CHUNK or self.next + n == self.size:
                self._put(self.next // CHUNK, view[:n])
            else:
                self.pending += view[:n]
            view, self.next = view[n:], self.next + n

    def _put(self, chunk: int, data) -> None:
        self.count += 1
        self.put(chunk, data)


class Keeper:
    """The caches index builds fill (a disk tier, the RAM cache), and what builds read in all."""

    def __init__(self, disk: DiskTier | None, cache: ram.ShardCache, in_ram: bool):
        """``in_ram``: keep whole shards in the RAM cache too (where it would load every shard
        anyway: ``--prefetch all``); else the RAM cache fills as readers touch shards, as always."""
        self.disk, self.cache, self.in_ram = disk, cache, in_ram
        self._in_ram: dict[str, tuple[dict, mmap.mmap]] = {}  # path -> (the shard's identity, its bytes)
        self._lock = threading.Lock()

    def __call__(self, shard: Shard):
        """The ``keep`` of an index build (index/shard_index.py): ``reading``, with ``spool_room``."""
        return self.reading(shard)

    @contextlib.contextmanager
    def reading(self, shard: Shard):
        """Around the build of ``shard``: what it reads is kept (see the module's docstring)."""
        tier = self.disk.for_build(shard) if self.disk is not None else None
        # A compressed tar's decompressed tar (formats/ctar.py) is kept in RAM where it fits, whatever
        # the prefetch: its readers would otherwise wait for a second decompression. Spooled into
        # memory (``spool_room``), its spool is that buffer already: nothing to copy.
        take = getattr(shard, "take_buffer", None)
        buf = take() if take is not None else None
        filled = buf is not None
        if buf is None and (self.in_ram or hasattr(shard, "stored")):
            buf = self.cache.hold(shard.size)
        nchunks = -(-shard.size // CHUNK)

        def put(chunk: int, data) -> None:
            if tier is not None:
                tier.put(chunk, data)
            if buf is not None and not filled:
                buf[chunk * CHUNK : chunk * CHUNK + len(data)] = data

        chunks = Chunks(shard.size, put)
        stored = getattr(shard, "stored", None)  # a compressed tar: its reads are of the tar it decompressed to
        seen = 0 if stored is None else shard.size  # bytes below this were read already
        if stored is not None:
            self.cache.count_build_read(stored.size)  # read whole, once, to decompress it

        def on_read(offset: int, data) -> None:
            nonlocal seen
            end = offset + len(data)
            self.cache.count_build_read(max(0, end - max(offset, seen)))
            seen = max(seen, end)
            if tier is not None or (buf is not None and not filled):
                chunks(offset, data)

        shard.on_read = on_read
        unchanged = False
        try:
            yield
            unchanged = _unchanged(shard)
        finally:
            shard.on_read = None
            if tier is not None:
                tier.close(keep=unchanged)
            if buf is not None:
                if unchanged and (filled or chunks.count == nchunks):
                    with self._lock:
                        self._in_ram[shard.path] = (tierfile.identity(shard), buf)
                else:
                    self.cache.unhold(buf)

    def spool_room(self) -> CacheRoom:
        """The RAM cache's room for a compressed tar's spool (formats/ctar.py), which then becomes
        the shard's buffer in the cache."""
        return CacheRoom(self.cache)

    def adopt(self, shards: list[Shard]) -> int:
        """The RAM buffers of the shards the view holds (as built) made resident; the others'
        room given back. Returns how many became resident."""
        with self._lock:
            kept, self._in_ram = self._in_ram, {}
        adopted = 0
        for shard in shards:
            ident, buf = kept.pop(shard.path, (None, None))
            if buf is not None and ident == tierfile.identity(shard) and not shard.broken:
                self.cache.adopt(shard, buf)
                adopted += 1
            elif buf is not None:
                self.cache.unhold(buf)
        for _, buf in kept.values():
            self.cache.unhold(buf)
        return adopted


class CacheRoom:
    """Room of the RAM cache's budget taken and given back as a spool grows (ctar.SpoolRoom)."""

    def __init__(self, cache: ram.ShardCache):
        self.cache = cache

    def take(self, nbytes: int) -> bool:
        return self.cache.reserve(nbytes)

    def give_back(self, nbytes: int) -> None:
        self.cache.unreserve(nbytes)


def _unchanged(shard: Shard) -> bool:
    """The shard is still the one the build read (its reads were each checked; this checks after
    the last): a storage that does not answer counts as changed here (nothing is kept)."""
    try:
        return not shard.broken and not shard.changed()
    except ShardIOError as exc:
        log.info("%s: %s; what its index build read is not kept", shard.path, exc)
        return False
