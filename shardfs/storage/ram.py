"""The RAM cache of shard bytes: whole shards loaded sequentially, within a hard budget.

How a read of raw shard bytes is answered (``ShardCache.fetch``):

* The shard is **resident** (admitted to the cache): its bytes live in one anonymous
  mmap of the shard's size, filled in 1 MiB chunks. Chunks the read needs that are
  not there yet are read by the reader itself, at once, so a reader waits only for its
  own bytes; a loader thread fills the other chunks in file order, 8 MiB per request. A chunk is read once,
  by whoever claims it first, so a shard costs one pass over storage.
* The shard is **not resident**: at its first read it is admitted if its size fits the free
  budget (or fits after evicting shards nobody has read for ``idle_evict`` seconds), and
  then served as above. If it does not fit, this and later reads of it are served by
  reading **just the requested bytes** (it is considered again only after an eviction). A
  whole shard is never loaded (and another evicted) to serve one member, and a shard is
  never loaded after parts of it were read directly in the same pass, so with a dataset
  larger than the budget each epoch costs at most one pass over the data: the resident
  part is free, the rest is read member by member.

Loads a reader is waiting for go before speculative ones (``prefetch="all"``); at most
``loaders`` shards stream in at once. Everything read from storage is dropped from the
kernel's page cache of the shard file (POSIX_FADV_DONTNEED), so the node holds the data
at most twice (here and in the page cache of the mounted files), never three times.

With a disk tier (``disk.DiskTier``) every storage read goes through it: chunks it holds come
from local disk, the others from storage and are kept there for the next mount or epoch.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import mmap
import threading
import time
from typing import TYPE_CHECKING, Callable, Protocol

from shardfs.errors import ShardfsError
from shardfs.storage import buffers, deadline, origin
from shardfs.storage.base import Shard, ShardIOError
from shardfs.storage.claims import CLAIMED, MISSING, claim_run
from shardfs.storage.readers_first import ReadersFirst

if TYPE_CHECKING:
    from shardfs.storage.disk import DiskTier

log = logging.getLogger(__name__)

# Readers fetch the 1 MiB chunks they need (short waits); loaders read runs of up to
# 8 missing chunks per request (large sequential reads for the storage).
CHUNK = 1 << 20
LOAD_RUN = 8
LOADED, BAD = 2, 3  # after MISSING and CLAIMED (storage.claims); BAD: reading it failed; its bytes are read per request
# Whoever reads a chunk gets an answer within deadline.TIMEOUT; a reader waiting for it gives up
# after twice that (a safety net: EIO instead of holding a FUSE worker near the watchdog).
WAIT_LIMIT = 2 * deadline.TIMEOUT
PRIORITY_DEMAND, PRIORITY_PREFETCH = 0, 1
PREFETCH_POLICIES = ("touched", "all")


class _BadChunk(ShardfsError):
    """A chunk could not be read from storage (an I/O error, not a changed shard)."""


class Publisher(Protocol):
    """Who else reads the cached bytes (the compiled FUSE loop answers reads of loaded chunks
    itself): told when a shard's buffer appears and goes, asked when it last read one."""

    def resident(self, shard: Shard, buf: mmap.mmap, size: int, states: bytearray, chunk: int) -> None: ...

    def gone(self, shard: Shard) -> None:
        """Returns once nobody reads the buffer any more."""

    def last_used(self, shard: Shard) -> float: ...

    def hits(self) -> int: ...

    def direct(self, shard: Shard, refused: bool) -> None:
        """Whether the shard is refused (read member by member, not held here)."""


class Resident:
    """One admitted shard: its buffer and which chunks of it are loaded."""

    def __init__(self, shard: Shard, filled: mmap.mmap | None = None):
        """``filled``: a buffer (``buffers.anonymous``) already holding every byte of the shard."""
        self.shard = shard
        self.size = shard.size
        # Whole pages, so that O_DIRECT reads of the last chunk fit (see Shard.read_at); huge ones
        # where the kernel gives them, so that those reads reach storage as large requests.
        self.buf = filled if filled is not None else buffers.anonymous(self.size)
        self.footprint = len(self.buf)  # what it costs of the budget
        nchunks = (self.size + CHUNK - 1) // CHUNK
        self.state = bytearray([LOADED] * nchunks if filled is not None else nchunks)
        self.missing = 0 if filled is not None else nchunks
        self.cond = threading.Condition()
        self.failed: str | None = None
        self.last_used = time.monotonic()
        self.cursor = 0  # where the loader looks for the next missing chunk
        self.busy = 0  # readers copying out or chunks being read: not evictable while > 0

    @property
    def complete(self) -> bool:
        return self.missing == 0


class LoadQueue:
    """A priority queue of shard loads served by a few threads (priority, then FIFO)."""

    def __init__(self, workers: int, load):
        self._heap: list = []
        self._order = itertools.count()
        self._cv = threading.Condition()
        self._queued: dict[Shard, int] = {}  # shard -> best priority queued
        self._load = load
        self._stop = False
        self.threads = [threading.Thread(target=self._run, name=f"shardfs-loader-{i}", daemon=True)
                        for i in range(workers)]
        for t in self.threads:
            t.start()

    def put(self, shard: Shard, priority: int) -> None:
        with self._cv:
            if self._queued.get(shard, 99) <= priority:
                return
            self._queued[shard] = priority
            heapq.heappush(self._heap, (priority, next(self._order), shard))
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._heap and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
                priority, _, shard = heapq.heappop(self._heap)
                if self._queued.get(shard) != priority:
                    continue  # a stale entry: the shard was re-queued at a better priority
                del self._queued[shard]
            try:
                self._load(shard, priority)
            except Exception:  # a loader must survive anything one shard does
                log.exception("loading %s failed", shard.path)

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()


class ShardCache:
    def __init__(self, shards: list[Shard], budget: int, prefetch: str = "touched", loaders: int = 2,
                 idle_evict: float = 300.0, disk: DiskTier | None = None, publisher: Publisher | None = None,
                 keep_first: Callable[[Shard], bool] | None = None, readers_first: ReadersFirst | None = None):
        """``shards`` are streamed in at once when ``prefetch`` is "all". With ``disk``, storage is
        read through the disk tier, whose figures of storage reads replace ours. ``publisher``
        is told of every resident buffer (see Publisher). ``keep_first(shard)``: shards this node
        owns among its peers; they may evict others (see _make_room). ``readers_first``: shared with
        the disk tier's fills, so that readers' reads go before both."""
        if prefetch not in PREFETCH_POLICIES:
            raise ValueError(f"unknown prefetch policy {prefetch!r} ({', '.join(PREFETCH_POLICIES)})")
        self.budget, self.prefetch, self.idle_evict, self.disk = budget, prefetch, idle_evict, disk
        self.publisher, self.keep_first = publisher, keep_first
        self.readers_first = readers_first or ReadersFirst(loaders)
        self.resident: dict[Shard, Resident] = {}
        self.refused: dict[Shard, int] = {}  # shard -> eviction count when it was last refused
        self.reserved = 0
        self._closed = False  # unmounted: loads stop, readers still waiting give up
        self._lock = threading.Lock()
        self._counts = dict(hits=0, misses=0, direct_reads=0, storage_bytes_read=0, peer_bytes_read=0, evicted=0, admitted=0,
                            storage_read_ns=0, load_errors=0, build_bytes_read=0)
        self._queue = LoadQueue(loaders, self._load)
        self.prefetch_all(shards)

    def prefetch_all(self, shards: list[Shard]) -> None:
        if self.prefetch == "all":
            self.load(sorted(shards, key=lambda shard: shard.path))

    def load(self, shards: list[Shard]) -> None:
        """Load these shards whole in the background, as room allows (whatever the prefetch policy)."""
        for shard in shards:
            self._queue.put(shard, PRIORITY_PREFETCH)

    # ---- the read path ---------------------------------------------------

    def fetch(self, shard: Shard, offset: int, length: int) -> bytes | memoryview:
        """The shard's raw bytes there; from the cache as a view (no copy: the mount copies it
        once into the reply), else bytes read from storage."""
        res = self.resident.get(shard)
        if res is not None and shard.broken:  # changed or gone since (a rescan): its bytes are not served
            self._drop(res)
            raise ShardIOError(shard.broken)
        if res is None:
            res = self._admit(shard)
            if res is None:
                return self._direct(shard, offset, length)
        with res.cond:
            res.busy += 1
        try:
            res.last_used = time.monotonic()
            waited = not res.complete and self._ensure(res, offset // CHUNK, (offset + length - 1) // CHUNK)
        except _BadChunk:
            # Storage failed inside this chunk: read just the bytes asked for, so only the
            # requests that really touch the failing range answer EIO.
            return self._direct(shard, offset, length)
        else:
            self._count("misses" if waited else "hits")
            # Loaded chunks are never written again, and the view keeps the mapping alive
            # through an eviction until the reply is sent.
            return memoryview(res.buf)[offset : offset + length]
        finally:
            with res.cond:
                res.busy -= 1

    def loaded(self, shard: Shard, offset: int, length: int) -> memoryview | None:
        """The bytes if the cache holds them all now, else None: never reads nor waits (for
        callers on an event loop, such as the peer server)."""
        res = self.resident.get(shard)
        chunks = range(offset // CHUNK, (offset + length - 1) // CHUNK + 1)
        if res is None or shard.broken or any(res.state[chunk] != LOADED for chunk in chunks):
            return None
        res.last_used = time.monotonic()
        self._count("hits")
        return memoryview(res.buf)[offset : offset + length]

    def _ensure(self, res: Resident, first: int, last: int) -> bool:
        """Make chunks first..last loaded: read the missing ones here, wait for claimed ones.

        Returns whether anything had to be read or waited for."""
        waited = False
        # (A shard read only in order is read by its loader, a background read: a reader waiting for
        # it is no demand read, which would hold the loader back.)
        in_order = getattr(res.shard, "in_order_only", False)
        for chunk in range(first, last + 1):
            if res.state[chunk] != LOADED:
                waited = True
                with self.readers_first.demand() if not in_order else contextlib.nullcontext():
                    self._ensure_chunk(res, chunk)
        return waited

    def _ensure_chunk(self, res: Resident, chunk: int) -> None:
        # A shard read only in order (a compressed tar's stream, formats/ctar.py): its loader
        # reads every chunk, readers wait for theirs (a read of their own would start it again).
        in_order = getattr(res.shard, "in_order_only", False)
        if in_order and res.state[chunk] == MISSING:
            self._queue.put(res.shard, PRIORITY_DEMAND)
        with res.cond:
            deadline = time.monotonic() + WAIT_LIMIT
            while ((res.state[chunk] == CLAIMED or (in_order and res.state[chunk] == MISSING))
                   and not res.failed and not self._closed):
                if not res.cond.wait(timeout=max(0.0, deadline - time.monotonic())):
                    raise ShardIOError(f"{res.shard.path}: waited {WAIT_LIMIT:.0f} s for a chunk")
            if self._closed and res.state[chunk] != LOADED:
                raise ShardIOError(f"{res.shard.path}: unmounted")
            if res.failed:
                raise ShardIOError(res.failed)
            if res.state[chunk] == BAD:
                raise _BadChunk
            if res.state[chunk] == LOADED:
                return
            res.state[chunk] = CLAIMED
        self._read_chunks(res, chunk, 1)

    def _read_chunks(self, res: Resident, first: int, count: int) -> None:
        """Read claimed chunks first..first+count-1 in one request and mark them loaded."""
        start = first * CHUNK
        length = min(count * CHUNK, res.size - start)
        try:
            if self.disk is None:
                _, from_peers, ns = origin.split(res.shard.read_into, memoryview(res.buf), start, length)
            else:
                _, from_peers, ns = origin.split(self.disk.read_into, res.shard, memoryview(res.buf), start, length)
        except ShardIOError as exc:
            with res.cond:
                if res.shard.broken:  # changed or truncated: nothing of it can be trusted
                    res.failed = str(exc)
                # A failing run goes back to the readers, who narrow it down chunk by chunk;
                # a single chunk that fails is served per request from then on, unless storage
                # was out of reach (an outage): then it is loaded again once storage answers.
                fallback = BAD if count == 1 and not res.failed and not exc.unavailable else MISSING
                res.state[first : first + count] = bytes([fallback]) * count
                res.cond.notify_all()
            self._count("load_errors")
            if res.failed:
                self._drop(res)
                raise
            raise _BadChunk from exc
        except BaseException:  # anything else: the chunks go back, nobody waits for them in vain
            with res.cond:
                res.state[first : first + count] = bytes([MISSING]) * count
                res.cond.notify_all()
            raise
        self._count_read(length, from_peers, ns)
        with res.cond:
            res.state[first : first + count] = bytes([LOADED]) * count
            res.missing -= count
            res.cond.notify_all()

    def _direct(self, shard: Shard, offset: int, length: int) -> bytes:
        with self.readers_first.demand():
            if self.disk is None:
                data, from_peers, ns = origin.split(shard.pread, offset, length)
            else:
                data, from_peers, ns = origin.split(self.disk.pread, shard, offset, length)
        shard.forget(offset, length)
        self._count("direct_reads")
        self._count("misses")
        self._count_read(length, from_peers, ns)
        return data

    # ---- admission, eviction, loading -------------------------------------

    def _admit(self, shard: Shard, priority: int = PRIORITY_DEMAND) -> Resident | None:
        if shard.broken:
            raise ShardIOError(shard.broken)
        with self._lock:
            res = self.resident.get(shard)
            if res is not None:
                return res
            first = self._first(shard)
            refused_at = self.refused.get(shard)
            if refused_at is not None and refused_at == self._counts["evicted"] and not first:
                return None  # refused before and nothing was evicted since: keep reading it directly
            # (A shard we own asks again: the others in its way may have been busy, and are not now.)
            need = buffers.footprint(shard.size)
            if need > self.budget or not self._make_room(need, first):
                # Admitting it later in the same pass would load again what was just read directly.
                self.refused[shard] = self._counts["evicted"]
                if self.publisher is not None:
                    self.publisher.direct(shard, True)
                return None
            if self.refused.pop(shard, None) is not None and self.publisher is not None:
                self.publisher.direct(shard, False)
            res = self.resident[shard] = Resident(shard)
            self.reserved += res.footprint
            if self.publisher is not None:
                self.publisher.resident(shard, res.buf, res.size, res.state, CHUNK)
            self._counts["admitted"] += 1
        self._queue.put(shard, priority)
        return res

    # ---- shards an index build read whole (storage/buildfill.py) ----------------------------

    def hold(self, size: int) -> mmap.mmap | None:
        """A buffer for a shard of ``size`` bytes, its room taken from the budget as an admission
        would (None if it does not fit); then ``adopt`` it, or give it back with ``unhold``."""
        return buffers.anonymous(size) if self.reserve(buffers.footprint(size)) else None

    def reserve(self, nbytes: int) -> bool:
        """``nbytes`` of the budget taken as an admission would (False if they do not fit): for
        ``hold``, and for a buffer filled before its size is known (a compressed tar's spool,
        formats/ctar.py), taken a step at a time. What it ends as is ``adopt``ed or given back
        with ``unhold`` (or ``unreserve`` before that)."""
        with self._lock:
            if self._closed or nbytes > self.budget or not self._make_room(nbytes):
                return False
            self.reserved += nbytes
            return True

    def unreserve(self, nbytes: int) -> None:
        with self._lock:
            self.reserved -= nbytes

    def unhold(self, buf: mmap.mmap) -> None:
        with self._lock:
            self.reserved -= len(buf)
        with contextlib.suppress(BufferError):  # a view of it still held: unmapped when that goes
            buf.close()

    def adopt(self, shard: Shard, buf: mmap.mmap) -> None:
        """The shard is resident, its bytes all in ``buf`` (from ``hold``)."""
        with self._lock:
            old = self.resident.get(shard)
            if old is not None:  # (not at a first mount: nothing is resident before the view)
                self.reserved -= len(buf)
                with contextlib.suppress(BufferError):
                    buf.close()
                return
            res = self.resident[shard] = Resident(shard, filled=buf)
            self.refused.pop(shard, None)
            if self.publisher is not None:
                self.publisher.resident(shard, res.buf, res.size, res.state, CHUNK)
            self._counts["admitted"] += 1

    def count_build_read(self, nbytes: int) -> None:
        """Bytes an index build read from shared storage (they count as storage reads too)."""
        self._count("build_bytes_read", nbytes)

    def _first(self, shard: Shard) -> bool:
        return self.keep_first is not None and self.keep_first(shard)

    def _make_room(self, need: int, first: bool = False) -> bool:
        """Evict shards idle for ``idle_evict`` seconds (oldest first) until ``need`` fits; for a
        shard that goes ``first`` (this node owns it among its peers), also shards that do not
        (least recently used first): the owner serves the others, who can fetch theirs again from
        their owners, never from storage. Lock held."""
        if self.reserved + need <= self.budget:
            return True
        cutoff = time.monotonic() - self.idle_evict
        idle = [shard for shard, r in self.resident.items() if self._last_used(r) < cutoff and not r.busy]
        if first:
            idle += [shard for shard, r in self.resident.items()
                     if shard not in idle and not r.busy and not self._first(shard)]
        for shard in sorted(idle, key=lambda shard: (self._last_used(self.resident[shard]) >= cutoff,
                                                     self._last_used(self.resident[shard]))):
            self._evict_locked(shard)
            if self.reserved + need <= self.budget:
                return True
        return False

    def resize(self, budget: int) -> None:
        """A new budget (memory pressure shrinks it, calm grows it back): evict least recently
        used shards until what is reserved fits. Evicting one a reader is copying from is safe:
        its view keeps the mapping alive until the reply is sent, then the memory goes."""
        with self._lock:
            self.budget = budget
            for shard in sorted(self.resident, key=lambda shard: self._last_used(self.resident[shard])):
                if self.reserved <= budget:
                    break
                self._evict_locked(shard)

    def _last_used(self, res: Resident) -> float:
        if self.publisher is None:
            return res.last_used
        return max(res.last_used, self.publisher.last_used(res.shard))

    def _evict_locked(self, shard: Shard) -> None:
        res = self.resident.pop(shard)
        self.reserved -= res.footprint
        self._counts["evicted"] += 1
        if self.publisher is not None:
            self.publisher.gone(shard)
            for refused in self.refused:  # considered again at their next read (see _admit)
                self.publisher.direct(refused, False)
        # The mmap is unmapped when the last reference (a reader mid-copy) lets go of it.

    def _drop(self, res: Resident) -> None:
        with self._lock:
            if self.resident.get(res.shard) is res:
                self._evict_locked(res.shard)

    def _load(self, shard: Shard, priority: int) -> None:
        """Fill every missing chunk of ``shard`` in file order (a loader thread)."""
        res = self.resident.get(shard)
        if res is None:
            res = self._admit(shard, priority)
            if res is None:
                return  # no room: prefetch stops at the budget
        while not res.complete and not res.failed and not self._closed and self.resident.get(shard) is res:
            with self.readers_first.background(LOAD_RUN) as run:
                if not self._load_run(res, run):
                    return
        if res.complete:
            log.debug("%s: cached (%d MB)", res.shard.name, res.size >> 20)

    def _load_run(self, res: Resident, run: int) -> bool:
        """Claim and read the next ``run`` missing chunks after the cursor; False: nothing left
        for this loader (the rest is loaded or claimed by readers, or storage failed for good)."""
        with res.cond:
            # One pass in file order; what fails is left to the readers that need it.
            claimed = claim_run(res.state, res.cursor, run)
            if claimed is None:
                return False
            first, count = claimed
            res.cursor = first + count
            res.busy += 1
        try:
            self._read_chunks(res, first, count)
        except _BadChunk:
            pass
        except ShardIOError:
            return False
        finally:
            with res.cond:
                res.busy -= 1
        return True

    # ---- figures ----------------------------------------------------------

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n

    def _count_read(self, length: int, from_peers: int, ns: int) -> None:
        """A read below us: the bytes shared storage gave (and the time, if it gave any), and those a peer did."""
        with self._lock:
            self._counts["storage_bytes_read"] += length - from_peers
            self._counts["peer_bytes_read"] += from_peers
            if from_peers < length:
                self._counts["storage_read_ns"] += ns

    def snapshot(self) -> dict:
        with self._lock:
            counts = dict(self._counts)
            cached = sum(1 for r in self.resident.values() if r.complete)
            loading = len(self.resident) - cached
            reserved = self.reserved
        if self.disk is not None:  # what really came from storage (the rest came from local disk)
            counts.update(self.disk.storage_counts())
        if self.publisher is not None:  # reads the publisher answered from our buffers
            counts["hits"] += self.publisher.hits()
        busy_s = counts.pop("storage_read_ns") / 1e9
        rate = round(counts["storage_bytes_read"] / busy_s / 1e6, 1) if busy_s else 0.0  # (builds' not timed)
        counts["storage_bytes_read"] += counts["build_bytes_read"]  # index builds read storage too
        return {
            "budget_bytes": self.budget,
            "used_bytes": reserved,
            "prefetch": self.prefetch,
            "shards_cached": cached,
            "shards_loading": loading,
            "shards_evicted": counts.pop("evicted"),
            **counts,
            "storage_read_seconds": round(busy_s, 3),
            "storage_read_rate_MBps": rate,
        }

    def close(self) -> None:
        """At unmount: loads stop after the run they read, readers still waiting for a chunk answer
        EIO now (a peer's request, whose reply nobody will send). Nothing here waits for storage."""
        self._closed = True
        self._queue.stop()
        for res in list(self.resident.values()):
            with res.cond:
                res.cond.notify_all()
        if self.disk is not None:
            self.disk.close()
