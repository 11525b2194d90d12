"""The disk tier: shard bytes kept on node-local disk, between shared storage and the RAM cache.

    shared storage --(once, sequential, large reads)--> disk tier --> RAM cache --> page cache

The RAM cache reads through the tier (``read_into`` for the chunks it loads, ``pread`` for the
members of shards that do not fit its budget); each chunk comes from local disk when the tier
holds it (checked against its checksum), else from shared storage, and is then written to the
tier. A shard read member by member (it did not fit in RAM) is also filled whole in the
background, in file order, so that shared storage sees one sequential pass per shard and node.

The tier is one directory shared by every daemon of the user on the node (file format and locks:
``tierfile``). It is bounded: when a new shard does not fit, the least recently used files that no
daemon has open are removed; if that is not enough the shard is not cached on disk at all (never
fetched whole to serve one member only to be evicted again). Any error of the local disk (full,
I/O error) turns the tier off with one log line: reads go to shared storage, as without a tier.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Protocol

from shardfs.storage import origin
from shardfs.storage.base import Shard, ShardIOError
from shardfs.storage.buffers import BufferPool
from shardfs.storage.claims import CLAIMED, MISSING, claim_run
from shardfs.storage.memory import parse_size
from shardfs.storage.readers_first import ReadersFirst
from shardfs.storage.threads import DaemonPool
from shardfs.storage.tierfile import (CHUNK, TierFile, cache_files, file_name, fits, identity, logical_size,
                                      prepare_dir, remove_if_unused)

log = logging.getLogger(__name__)

VALID = 2  # a chunk on disk; or MISSING, CLAIMED (storage.claims), as this daemon knows it
FILL_RUN = 8  # chunks per storage request of a background fill (8 MiB)
POLL_S = 0.02  # how often a daemon waiting for another's chunk looks again
STALL_S = 5.0  # a filler whose file did not grow for this long is not filling what we wait for
CLOSE_GRACE_S = 2.0  # at unmount, how long fills and reads under way get to finish with their file
DEFAULT_SIZE = "80%"


def bound_of(directory: str, text: str) -> int:
    """``800G``, or ``80%``: a share of what the tier may use in DIR now (free space plus what it holds)."""
    st = os.statvfs(directory)
    held = sum(logical_size(e) for e in cache_files(directory))
    return parse_size(text, room=st.f_bavail * st.f_frsize + held)


class Publisher(Protocol):
    """Who else reads the tier's files (the compiled FUSE loop reads refused shards' chunks
    itself, checking the same records): told when a file is open and when it goes."""

    def on_disk(self, shard: Shard, file: TierFile, states: bytearray, valid: int) -> None: ...

    def off_disk(self, shard: Shard) -> None:
        """Returns once nobody reads the file any more."""

    def disk_hits(self) -> tuple[int, int]:
        """(reads, bytes) it answered from the tier."""


class Entry:
    """A shard with a file in the tier, as this daemon uses it."""

    def __init__(self, file: TierFile, filler: bool):
        # filler: we fetch its missing chunks (else another daemon does, and we wait for them)
        self.file, self.filler = file, filler
        # Checksums stay in the file (read with the chunk): memory is one byte per MiB of shard.
        self.state = bytearray(VALID if r is not None else MISSING for r in file.records())
        self.cond = threading.Condition()
        self.fill_queued = False
        self.users = 0  # threads reading or filling it now: its file stays open while > 0


class DiskTier:
    def __init__(self, directory: str, size: str | None = None, loaders: int = 2, publisher: Publisher | None = None,
                 keep_first=None, readers_first: ReadersFirst | None = None):
        """``keep_first(shard)``: shards this node owns among its peers; only those may evict
        others, the rest are kept while room allows (their owners serve them). ``readers_first``: shared
        with the RAM cache, whose readers' reads go before our fills."""
        self.dir = os.path.abspath(directory)  # libfuse moves the daemon to / once mounted
        self.publisher, self.keep_first = publisher, keep_first
        self.readers_first = readers_first or ReadersFirst(loaders)
        prepare_dir(self.dir)
        self.bound = bound_of(directory, size or DEFAULT_SIZE)
        self.held = sum(logical_size(e) for e in cache_files(directory))
        self.entries: dict[Shard, Entry | None] = {}  # None: not cached on disk (see _open)
        self.refused: dict[Shard, int] = {}  # shard -> evictions when it did not fit
        # Files index builds filled (BuildChunks), kept open (and their fill lock) until the view's
        # shard opens its entry with it: never evicted in between, no lock dropped by a close.
        self._built: dict[str, TierFile] = {}
        self.disabled: str | None = None
        self._lock = threading.RLock()  # _disable may run with it held
        self._closed = False
        self._counts = dict(hits=0, bytes_read=0, bytes_written=0, storage_bytes_read=0, peer_bytes_read=0, storage_read_ns=0,
                            checksum_failures=0,
                            shards_added=0, shards_evicted=0, shards_refused=0)
        # Daemon threads: a fill still reading storage at unmount is cut short as by a SIGKILL.
        self._fills = DaemonPool(loaders, "shardfs-disk")
        self._staging = BufferPool(FILL_RUN * CHUNK, keep=loaders + 2)  # storage reads on their way to disk

    # ---- the read path (called by the RAM cache) -------------------------------------------

    def read_into(self, shard: Shard, buf: memoryview, offset: int, length: int) -> None:
        """Shard.read_into through the tier, for whole chunks (``offset`` a multiple of CHUNK)."""
        entry = self._use(shard)
        if entry is None:
            return self._storage(shard.read_into, buf, offset, length)
        try:
            run = []  # claimed chunks, read from storage in one request
            for chunk in range(offset // CHUNK, (offset + length - 1) // CHUNK + 1):
                got = self._claim(entry, chunk)
                if got == VALID and self._from_disk(entry, chunk, into=buf) is not None:
                    self._fetch_run(shard, entry, run, buf)
                    run = []
                else:
                    run.append(chunk)
            self._fetch_run(shard, entry, run, buf)
            entry.file.forget(offset, length)  # the bytes live in RAM now: not also in the page cache
        finally:
            self._done(entry)

    def pread(self, shard: Shard, offset: int, length: int) -> bytes:
        """Shard.pread through the tier. The chunks the request touches are read whole (and
        cached); the rest of the shard follows in the background."""
        entry = self._use(shard)
        if entry is None:
            return self._storage(shard.pread, offset, length)
        try:
            length = min(length, shard.size - offset)
            if length <= 0:
                return b""
            self._queue_fill(shard, entry)
            pieces = []
            for chunk in range(offset // CHUNK, (offset + length - 1) // CHUNK + 1):
                start, end = chunk * CHUNK, min(chunk * CHUNK + CHUNK, shard.size)
                lo, hi = max(offset, start), min(offset + length, end)
                got = self._claim(entry, chunk)
                if got == VALID:
                    piece = self._from_disk(entry, chunk, lo, hi)
                    if piece is not None:
                        pieces.append(piece)
                        continue
                pieces.append(self._fetch_chunks(shard, entry, chunk, 1, lo, hi))
            return b"".join(pieces)
        finally:
            self._done(entry)

    def _use(self, shard: Shard) -> Entry | None:
        """The shard's entry, in use (its file kept open) until ``_done``; None: read storage
        directly (not cached on disk, the tier off, or unmounted)."""
        entry = self._entry(shard)
        if entry is not None:
            with entry.cond:
                if self._closed:
                    return None
                entry.users += 1
        return entry

    def _done(self, entry: Entry) -> None:
        with entry.cond:
            entry.users -= 1
            entry.cond.notify_all()

    def _storage(self, read, *args):
        """A read below the tier (``args`` end with offset, length): from shared storage, or a peer's
        bytes with peers (origin.py), each counted apart; storage reads timed."""
        got, from_peers, ns = origin.split(read, *args)
        with self._lock:
            self._counts["storage_bytes_read"] += args[-1] - from_peers
            self._counts["peer_bytes_read"] += from_peers
            if from_peers < args[-1]:
                self._counts["storage_read_ns"] += ns
        return got

    # ---- chunks --------------------------------------------------------------------------

    def _claim(self, entry: Entry, chunk: int) -> int:
        """VALID (on disk: read it) or CLAIMED (ours to fetch from storage and store)."""
        while True:
            with entry.cond:
                while entry.state[chunk] == CLAIMED:
                    entry.cond.wait()  # another thread of ours is fetching it
                if entry.state[chunk] == VALID:
                    return VALID
                if entry.filler or self.disabled:
                    entry.state[chunk] = CLAIMED
                    return CLAIMED
            self._wait_for_filler(entry, chunk)

    def _wait_for_filler(self, entry: Entry, chunk: int) -> None:
        """Another daemon fills this shard: wait until the chunk is there, or until we fill it
        ourselves: when that daemon went away (we get its lock), or when the file has not grown
        for STALL_S (it fills nothing we need: then both may write a chunk, the same bytes)."""
        progress, stalled_at = None, time.monotonic() + STALL_S
        while time.monotonic() < stalled_at:
            try:
                there = entry.file.record(chunk) is not None
                st = os.fstat(entry.file.fd)
            except OSError as exc:
                self._disable(exc)
                return
            if there:
                with entry.cond:
                    if entry.state[chunk] == MISSING:
                        entry.state[chunk] = VALID
                return
            if entry.file.take_fill_lock():
                entry.filler = True
                return
            if (st.st_mtime_ns, st.st_blocks) != progress:
                progress, stalled_at = (st.st_mtime_ns, st.st_blocks), time.monotonic() + STALL_S
            time.sleep(POLL_S)
        log.debug("%s: its filler in the disk tier stalled; filling it here too", entry.file.ident["path"])
        entry.filler = True

    def _from_disk(self, entry: Entry, chunk: int, lo: int | None = None, hi: int | None = None, into=None):
        """The verified bytes lo..hi (or the whole chunk into ``into``), or None: then the chunk
        is claimed by us, to be fetched again from storage."""
        if lo is None:
            lo, hi = chunk * CHUNK, min(chunk * CHUNK + CHUNK, entry.file.size)
        try:
            crcs = entry.file.record(chunk)
            got = entry.file.read_verified(chunk, crcs, lo, hi, into) if crcs is not None else None
        except OSError as exc:
            self._disable(exc)
            got = None
        if got is not None:
            self._count("hits")
            self._count("bytes_read", hi - lo)
            return got
        if not self.disabled:
            self._count("checksum_failures")
            log.warning("%s: chunk %d failed its checksum in the disk tier (%s); read again from storage",
                        entry.file.ident["path"], chunk, entry.file.path)
        with entry.cond:
            entry.state[chunk] = CLAIMED
        return None

    def _fetch_run(self, shard: Shard, entry: Entry, run: list[int], buf: memoryview) -> None:
        if not run:
            return
        start, end = run[0] * CHUNK, min((run[-1] + 1) * CHUNK, shard.size)
        try:
            self._storage(shard.read_into, buf, start, end - start)
        except BaseException:
            self._release(entry, run)
            raise
        self._store(entry, run, buf[start:end])

    def _fetch_chunks(self, shard: Shard, entry: Entry, first: int, count: int, lo: int = 0, hi: int = 0) -> bytes:
        """Read claimed chunks from storage in one request and store them; returns the shard's
        bytes lo..hi (within them). The request lands in a buffer on huge pages (see buffers)."""
        start = first * CHUNK
        length = min(count * CHUNK, shard.size - start)
        with self._staging.buffer() as buf:
            try:
                self._storage(shard.read_at, buf, start, length)
            except BaseException:
                self._release(entry, range(first, first + count))
                raise
            self._store(entry, range(first, first + count), buf[:length])
            return bytes(buf[lo - start : hi - start]) if hi > lo else b""

    def _store(self, entry: Entry, chunks, data: memoryview) -> None:
        """Write claimed chunks (their bytes in ``data``, from the first one's start) and mark them valid."""
        first = chunks[0]
        for chunk in chunks:
            piece = data[(chunk - first) * CHUNK : (chunk - first + 1) * CHUNK]
            if self.disabled:
                self._release(entry, [chunk])
                continue
            try:
                entry.file.write_chunk(chunk, piece)
            except OSError as exc:
                self._disable(exc)
                self._release(entry, [chunk])
                continue
            self._count("bytes_written", len(piece))
            with entry.cond:
                entry.state[chunk] = VALID
                entry.cond.notify_all()

    def _release(self, entry: Entry, chunks) -> None:
        with entry.cond:
            for chunk in chunks:
                entry.state[chunk] = MISSING
            entry.cond.notify_all()

    # ---- background fill ---------------------------------------------------------------------

    def _queue_fill(self, shard: Shard, entry: Entry) -> None:
        if entry.filler and not entry.fill_queued and not self._closed and MISSING in entry.state:
            entry.fill_queued = True
            try:
                self._fills.submit(self._fill, shard, entry)
            except RuntimeError:  # unmounted meanwhile: no more fills
                entry.fill_queued = False

    def _fill(self, shard: Shard, entry: Entry) -> None:
        with entry.cond:
            if self._closed:
                return
            entry.users += 1
        try:
            self._fill_missing(shard, entry)
        except Exception:  # a loader must survive anything one shard does
            log.exception("filling %s into the disk tier failed", shard.path)
        finally:
            entry.fill_queued = False
            self._done(entry)

    def _fill_missing(self, shard: Shard, entry: Entry) -> None:
        """Every missing chunk, in file order, FILL_RUN per request (a loader thread)."""
        cursor = 0
        while not (self._closed or self.disabled or shard.broken):
            with self.readers_first.background(FILL_RUN) as run:
                with entry.cond:
                    claimed = claim_run(entry.state, cursor, run)
                if claimed is None:
                    break
                first, count = claimed
                cursor = first + count
                try:
                    self._fetch_chunks(shard, entry, first, count)
                except ShardIOError:
                    continue  # left to the readers that need it
            # Their writing back starts now, not in the kernel's own time (up to 30 s later, in the
            # middle of a later epoch's O_DIRECT reads). Being dirty, the pages stay: this epoch's
            # readers copy them from the page cache (the compiled loop tries that first).
            entry.file.forget(first * CHUNK, count * CHUNK)

    # ---- admission and eviction ---------------------------------------------------------------

    def _entry(self, shard: Shard) -> Entry | None:
        if shard.broken:
            raise ShardIOError(shard.broken, unavailable=True, permanent=True)
        if self.disabled or self._closed:
            return None
        entry = self.entries.get(shard)
        if entry is None and shard not in self.entries:
            entry = self._open(shard)
        return entry

    def _open(self, shard: Shard) -> Entry | None:
        with self._lock:
            if self._closed:  # (close sets it before it takes the lock: no entry is opened after)
                return None
            if shard in self.entries:
                return self.entries[shard]
            if not fits(identity(shard)):
                log.info("%s: path too long for the disk tier; not cached", shard.path)
                self.entries[shard] = None
                return None
            built = self._built.pop(shard.path, None)
            if built is not None and built.ident != identity(shard):  # (the view holds another version)
                built.close()
                built = None
            if built is None and not self._room_for(shard):
                return None
            try:
                file = built or TierFile.open_or_create(self.dir, identity(shard))
                if file is not None:
                    os.utime(file.path)  # the LRU clock of eviction
                    entry = Entry(file, built is not None or file.take_fill_lock())
            except OSError as exc:
                self._disable(exc)
                return None
            if file is None:
                log.info("%s: the disk tier holds another version of it, still in use by a mount; not cached",
                         shard.path)
                entry = None
            self.entries[shard] = entry
            if entry is not None and self.publisher is not None:
                self.publisher.on_disk(shard, entry.file, entry.state, VALID)
            return entry

    def _room_for(self, shard: Shard) -> bool:
        """Whether the shard's file is there or a new one fits (evicting by the tier's policy). Lock held."""
        if os.path.exists(os.path.join(self.dir, file_name(shard.path))):
            return True
        if self.refused.get(shard) == self._counts["shards_evicted"]:
            return False  # did not fit, and nothing left since
        may_evict = self.keep_first is None or self.keep_first(shard)
        if not self._make_room(shard.size, may_evict):
            self.refused[shard] = self._counts["shards_evicted"]
            self._counts["shards_refused"] += 1
            return False
        self.held += shard.size
        self._counts["shards_added"] += 1
        return True

    def for_build(self, shard: Shard) -> BuildChunks | None:
        """Where an index build of ``shard`` writes the chunks it reads (storage/buildfill.py), or
        None where the tier would not fill it now: no room by its policy, the tier off or closed, a
        path too long, a file another daemon fills or still reads an older version of. Used at the
        first mount, before this daemon opens any tier file to serve (closing a file would drop the
        process's fill lock on it)."""
        with self._lock:
            if (self._closed or self.disabled or not fits(identity(shard)) or shard.path in self._built
                    or not self._room_for(shard)):
                return None
            try:
                file = TierFile.open_or_create(self.dir, identity(shard))
                if file is not None and not file.take_fill_lock():
                    file.close()  # another daemon fills it: it writes the chunks
                    file = None
                return BuildChunks(self, file) if file is not None else None
            except OSError as exc:
                self._disable(exc)
                return None

    def _make_room(self, need: int, may_evict: bool = True) -> bool:
        """Remove least recently used files no daemon has open until ``need`` fits. Lock held."""
        if need > self.bound:
            return False
        if self.held + need <= self.bound:
            return True
        if not may_evict:
            return False
        files = [e for e in cache_files(self.dir) if logical_size(e)]  # stat()s now, cached by DirEntry
        self.held = sum(e.stat().st_size for e in files)  # other daemons add and remove files too
        ours = {e.file.path for e in self.entries.values() if e is not None}
        for victim in sorted(files, key=lambda e: e.stat().st_mtime):
            if self.held + need <= self.bound:
                break
            if victim.path not in ours and remove_if_unused(victim.path):
                self.held -= victim.stat().st_size
                self._counts["shards_evicted"] += 1
        return self.held + need <= self.bound

    def _disable(self, exc: OSError) -> None:
        with self._lock:
            if self.disabled:
                return
            self.disabled = exc.strerror or str(exc)
            log.warning("disk tier %s: %s; reading from shared storage only from now on", self.dir, self.disabled)
            for shard, entry in self.entries.items():
                if entry is not None:
                    if self.publisher is not None:
                        self.publisher.off_disk(shard)
                    entry.file.release_fill_lock()  # let other daemons fill what we no longer will
                    with entry.cond:
                        entry.cond.notify_all()
            for file in self._built.values():
                file.release_fill_lock()

    # ---- figures and lifecycle -------------------------------------------------------------------

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n

    def storage_counts(self) -> dict:
        with self._lock:
            return {key: self._counts[key] for key in ("storage_bytes_read", "peer_bytes_read", "storage_read_ns")}

    def snapshot(self) -> dict:
        files = cache_files(self.dir)
        held = 0
        for e in files:
            try:
                held += e.stat().st_blocks * 512
            except FileNotFoundError:
                pass
        with self._lock:
            counts = dict(self._counts)
        counts.pop("storage_read_ns")
        if self.publisher is not None:  # reads answered from our files by the publisher
            hits, nbytes = self.publisher.disk_hits()
            counts["hits"] += hits
            counts["bytes_read"] += nbytes
        return {"dir": self.dir, "bound_bytes": self.bound, "held_bytes": held, "shards": len(files),
                **counts, "disabled": self.disabled or ""}

    def close(self) -> None:
        """At unmount: fills stop after the run they read; each file is closed once nobody uses it.
        One still in use after CLOSE_GRACE_S (a fill or a peer's read waiting on storage that does
        not answer) is left open to the process's exit, which drops its fill lock as a SIGKILL
        would: a chunk is recorded only once written whole, so the next filler fetches the rest."""
        self._closed = True
        self._fills.shutdown(cancel_futures=True)
        self._staging.close()  # the free buffers; one an abandoned fill still holds goes with the exit
        with self._lock:
            entries = [(shard, entry) for shard, entry in self.entries.items() if entry is not None]
            self.entries.clear()
            built, self._built = list(self._built.values()), {}
        for file in built:  # filled by a build, never served (its shard left out of the view)
            file.close()
        ends = time.monotonic() + CLOSE_GRACE_S
        for shard, entry in entries:
            with entry.cond:
                if not entry.cond.wait_for(lambda: entry.users == 0, max(0.0, ends - time.monotonic())):
                    log.info("%s: still read or filled at unmount; its disk-tier file is left to the exit",
                             shard.path)
                    continue
            if self.publisher is not None:
                self.publisher.off_disk(shard)  # before its descriptor closes
            with contextlib.suppress(OSError):
                os.utime(entry.file.path)  # used until now, for the LRU order of eviction
            entry.file.close()


class BuildChunks:
    """The chunks an index build reads, written into the shard's tier file as the build reads
    them; their records (what makes a chunk trusted) only at ``close(keep=True)``, once the build is
    done and the shard found unchanged: a shard that changes midway, or a build cut short, leaves
    no chunk trusted. Chunks the file holds already are not written again."""

    def __init__(self, tier: DiskTier, file: TierFile):
        self.tier, self.file = tier, file
        self.held = [r is not None for r in file.records()]
        self.crcs: dict[int, tuple[int, ...]] = {}
        self.written = 0

    def put(self, chunk: int, data) -> None:
        if self.held[chunk] or self.tier.disabled:
            return
        try:
            self.crcs[chunk] = self.file.write_data(chunk, data)
        except OSError as exc:
            self.tier._disable(exc)
            return
        self.written += len(data)
        if len(self.crcs) % FILL_RUN == 0:  # their writing back starts now (see _fill_missing)
            self.file.forget(max(0, chunk + 1 - FILL_RUN) * CHUNK, FILL_RUN * CHUNK)

    def close(self, keep: bool) -> None:
        """Records written (``keep``) and the file left open for the shard's entry (DiskTier._open),
        or not: then the file is closed, and removed if none of it is trusted."""
        tier = self.tier
        try:
            if keep and not tier.disabled:
                for chunk, crcs in self.crcs.items():
                    self.file.write_record(chunk, crcs)
                tier._count("bytes_written", self.written)
                self.file.forget(0, 0)
                with tier._lock:
                    if not tier._closed:
                        tier._built[self.file.ident["path"]] = self.file
                        return
        except OSError as exc:
            tier._disable(exc)
            keep = False
        self.file.close()
        if not keep and not any(self.held) and remove_if_unused(self.file.path):
            with tier._lock:
                tier.held -= self.file.size
