"""Compressed tar shards (``.tar.gz``/``.tgz``, ``.tar.zst``, ``.tar.xz``, ``.tar.bz2``, or a
``.tar`` that is one of them inside): served as the tar they decompress to.

A compressed stream cannot be read from the middle, so a shard is decompressed whole, once,
front to back (compressed.py), and everything above works on the decompressed tar, the shard's
*logical stream* (base.py): the index's offsets point into it, the RAM cache and the disk tier
hold it (their budgets count its bytes), the compiled loop serves members from them as from a
tar shard's. Two shards stand for one (both ``Shard``, with the decompressed size and an
identity of their own, ``tag``, so that the caches never take one for the stored file):

* ``SpooledShard``, at an index build: the stream decompressed once, front to back, into the
  RAM cache's room (a daemon's build: the decompressor writes straight into the buffer the cache
  then keeps as the shard's, no copy) or, where the room runs out, into a scratch file (unlinked
  at once: nothing is left behind); then scanned as a tar from there, its reads passing through
  the build's keeper (storage/buildfill.py) into the disk tier. So the index is built in the pass
  that fills the caches: one decompression.
* ``StreamShard``, when serving: the stream decompressed front to back as the caches ask for
  its bytes (a RAM cache load, a disk tier fill: in file order, one pass). A read behind the
  stream's position starts it again from the beginning: the slow path of a shard that neither
  cache holds (no disk tier, and more than the RAM cache can give), said once in the log.

Damage (a cut-off stream, a CRC that does not match) refuses the whole shard with one line: a
compressed stream's check is known only at its end, so no member of it is trusted before.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import tempfile
import threading

from shardfs.formats import compressed, format_for
from shardfs.formats.base import OtherFormat, ShardFormatError
from shardfs.formats.tar import TarFormat
from shardfs.storage import buffers
from shardfs.storage.base import SHARED_BROKEN, Shard, ShardIOError

log = logging.getLogger(__name__)

SPOOL = 4 << 20  # decompressed bytes written to the spool at once
ROOM_STEP = 64 << 20  # the most RAM room a spool in memory takes at once (a multiple of huge pages)
BEHIND = 1 << 20  # what a StreamShard keeps of what it last gave (a read just behind needs no restart)


class CompressedTarFormat(TarFormat):
    name = "ctar"
    suffixes = (".tar.gz", ".tgz", ".tar.zst", ".tar.zstd", ".tzst", ".tar.xz", ".txz", ".tar.bz2", ".tbz2", ".tbz")
    decompresses = True  # index builds read it through ``spooled`` (shard_index.build)

    def spooled(self, shard: Shard, scratch: str | None = None, room: SpoolRoom | None = None) -> SpooledShard:
        return SpooledShard(shard, scratch, room)


FORMAT = CompressedTarFormat()


def _codec(shard: Shard) -> compressed.Codec:
    codec = compressed.codec_of(shard.pread(0, 8))
    if codec is None:
        raise ShardFormatError("not gzip, zstd, xz or bzip2 data")
    return codec


def _codec_at_build(shard: Shard) -> compressed.Codec:
    """Its codec; OtherFormat where it has none (a plain tar named .tar.gz: the build reads it so)."""
    head = shard.pread(0, 512)
    codec = compressed.codec_of(head)
    if codec is None:
        raise OtherFormat(head)
    return codec


class _Decompressed(Shard):
    """A compressed shard seen as its decompressed tar: ``stored`` is the shard as stored."""

    def __init__(self, stored: Shard, size: int):
        super().__init__(stored.path, size, stored.mtime_ns)
        self.stored, self.remote, self.window = stored, stored.remote, max(stored.window, 1 << 20)
        # the caches' identity of its bytes (tierfile.identity, peers): never the stored file's
        self.tag = f"decompressed:{stored.size}:{getattr(stored, 'tag', None) or ''}"
        stored.when_broken(self._tell_broken)

    broken = SHARED_BROKEN  # a changed file as stored is a changed tar, and the other way round

    def _wrapped(self) -> Shard:
        return self.stored

    def changed(self) -> bool:
        return self.stored.changed()

    def close(self) -> None:
        self.stored.close()


class SpoolRoom:
    """What a spool may keep in memory: ``take(n)`` asks for ``n`` more bytes (False: no more),
    ``give_back(n)`` returns them (the RAM cache's room, storage/buildfill.py)."""

    def take(self, nbytes: int) -> bool:
        return False

    def give_back(self, nbytes: int) -> None:
        pass


class SpooledShard(_Decompressed):
    """The decompressed tar of ``stored``, written as it is decompressed into memory (while
    ``room`` grants it) or else into an unlinked scratch file in ``scratch`` (default: TMPDIR).
    Spooled in memory, it is the buffer the RAM cache keeps (``take_buffer``): the tar is then
    written once, never copied from a scratch file into the cache. ShardFormatError for damage;
    OtherFormat if it is not compressed at all."""

    def __init__(self, stored: Shard, scratch: str | None = None, room: SpoolRoom | None = None):
        codec = _codec_at_build(stored)
        self.codec = codec.name
        self._spool = _Spool(scratch or tempfile.gettempdir(), room or SpoolRoom(), 2 * stored.size)
        try:
            self._spool.fill(compressed.Stream(codec, stored.pread, stored.size, max(SPOOL, stored.window),
                                                stored.read_at))
        except BaseException:
            self._spool.close()
            raise
        super().__init__(stored, self._spool.size)

    def take_buffer(self):
        """The spool's memory as a writable mapping of its whole room (its length is what it
        holds of the room), handed over to the caller, who gives it back (the RAM cache: ``adopt``
        or ``unhold``); None if it was spooled to disk."""
        return self._spool.take_buffer()

    def _pread(self, offset: int, length: int) -> bytes:
        return self._spool.pread(offset, length)

    def close(self) -> None:  # (not the stored shard: its opener closes it)
        self._spool.close()


class _Spool:
    """Decompressed bytes written front to back: into anonymous memory while ``room`` grants it
    (taken ``ROOM_STEP`` at a time; the decompressor writes straight into it), moved to a scratch
    file on disk when it does not."""

    def __init__(self, scratch: str, room: SpoolRoom, guess: int):
        """``guess``: the size it likely takes (twice the compressed size), the room asked for first."""
        self.scratch, self.room = scratch, room
        self.room_taken = 0
        self.size = 0
        self.mem: mmap.mmap | None = None
        self.taken: mmap.mmap | None = None  # the memory once handed over (take_buffer), still read by the scan
        self.fd = -1
        first = min(ROOM_STEP, _huge_pages(max(guess, 1)))
        if room.take(first):
            self.room_taken = first
            self.mem = buffers.anonymous(first)
        else:
            self.fd = _scratch_file(scratch)

    def fill(self, stream: compressed.Stream) -> None:
        limit = _room(self.scratch)
        try:
            while self.mem is not None:
                if self.size == len(self.mem) and not self._grow(self.size + 1):
                    self._to_disk()
                    break
                with memoryview(self.mem) as view, view[self.size : self.size + SPOOL] as part:
                    got = stream.readinto(part)
                if not got:
                    return
                self.size += got
            buf = bytearray(SPOOL)  # one buffer for every read: its pages are faulted in once
            with memoryview(buf) as view:
                while got := stream.readinto(view):
                    if self.size + got > limit:
                        raise ShardFormatError(f"decompresses to more than the {max(limit, 0) >> 20} MiB its "
                                               "scratch space (TMPDIR) can take")
                    _write(self.fd, view[:got], self.size)
                    self.size += got
        finally:
            stream.close()

    def _grow(self, end: int) -> bool:
        """Room for ``end`` bytes at least: twice what it had, or ROOM_STEP more, the smaller."""
        more = _huge_pages(max(end, self.room_taken + min(self.room_taken, ROOM_STEP))) - self.room_taken
        if not self.room.take(more):
            return False
        try:
            self.mem.resize(self.room_taken + more)  # (mremap: the pages move, their bytes are not copied)
        except OSError:  # no address space for it: the rest goes to disk
            self.room.give_back(more)
            return False
        self.room_taken += more
        return True

    def _to_disk(self) -> None:
        """The room ran out: what memory holds moves to a scratch file, and so does the rest."""
        self.fd = _scratch_file(self.scratch)
        with memoryview(self.mem) as view:
            _write(self.fd, view[: self.size], 0)
        self._drop_memory()

    def _drop_memory(self) -> None:
        if self.mem is not None:
            with contextlib.suppress(BufferError):  # a view still held (an error's traceback): freed with it
                self.mem.close()
            self.mem = None
        if self.room_taken:
            self.room.give_back(self.room_taken)
            self.room_taken = 0

    def pread(self, offset: int, length: int) -> bytes | memoryview:
        """A view, not a copy, where the spool is in memory (the scan reads the whole tar: a copy
        of each chunk was most of the time it held the GIL)."""
        mem = self.mem if self.mem is not None else self.taken
        if mem is not None:
            return memoryview(mem)[offset : min(offset + length, self.size)]
        return os.pread(self.fd, length, offset)

    def take_buffer(self) -> mmap.mmap | None:
        if self.mem is None:
            return None
        length = buffers.footprint(self.size)
        if length > self.room_taken and not self._grow(length):
            return None
        if length < len(self.mem):
            try:
                self.mem.resize(length)
            except (BufferError, OSError):  # (a view of it still held): handed over whole
                length = len(self.mem)
        buf = self.taken = self.mem
        self.mem = None
        self.room.give_back(self.room_taken - length)
        self.room_taken = 0
        return buf

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.taken = None  # (its new owner closes it)
        self._drop_memory()


def _huge_pages(n: int) -> int:
    return -(-n // buffers.HUGE) * buffers.HUGE


def _write(fd: int, data, at: int) -> None:
    written = 0
    while written < len(data):
        written += os.pwrite(fd, data[written:], at + written)


def _room(directory: str) -> int:
    """What a spool may take of the scratch space: its free space but a tenth (a stream of zeros
    that decompresses to terabytes is refused, not allowed to fill the node's disk)."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize - st.f_blocks * st.f_frsize // 10


def _scratch_file(directory: str) -> int:
    try:
        return os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except (OSError, AttributeError):  # a file system without O_TMPFILE
        fd, path = tempfile.mkstemp(dir=directory)
        os.unlink(path)
        return fd


class StreamShard(_Decompressed):
    """The decompressed tar of ``stored`` (``size`` bytes, from its index), read front to back."""

    in_order_only = True  # the RAM cache's loader reads it, in order; its readers wait (ram.py)

    def __init__(self, stored: Shard, size: int):
        super().__init__(stored, size)
        self._stream: compressed.Stream | None = None
        self._behind = bytearray()  # the last bytes the stream gave, ending at its position
        self._restarts = 0
        self._lock_stream = threading.Lock()

    def _pread(self, offset: int, length: int) -> bytes:
        with self._lock_stream:
            try:
                return self._read(offset, length)
            except ShardFormatError as exc:  # the index was built from these bytes: they changed
                self._stream = None
                raise self.read_failed(offset, str(exc)) from None

    def _read(self, offset: int, length: int) -> bytes:
        stream = self._stream
        if stream is None or offset < stream.pos - len(self._behind):
            if stream is not None:
                stream.close()
                self._restarts += 1
                if self._restarts == 1:
                    log.warning("%s: read out of order while neither cache holds it: each such read "
                                "decompresses it again from its start (give it a disk tier, or more RAM)", self.path)
            stream = self._stream = compressed.Stream(_codec(self.stored), self.stored.pread, self.stored.size,
                                                      self.stored.window)
            self._behind = bytearray()
        behind = self._behind
        while stream.pos < offset + length:
            data = stream.read(SPOOL)
            if not data:
                break
            behind += data
            keep = max(BEHIND, stream.pos - offset)  # from the offset asked for, once the stream is past it
            if len(behind) > keep:
                del behind[: len(behind) - keep]
        start = offset - (stream.pos - len(behind))
        if start < 0 or start + length > len(behind):
            self._stream = None
            raise ShardIOError(f"{self.path}: its decompressed stream ends at {stream.pos}, before {offset + length}")
        return bytes(behind[start : start + length])

    def close(self) -> None:
        with self._lock_stream:
            if self._stream is not None:
                self._stream.close()
                self._stream = None
        super().close()


def stored_of(shard: Shard) -> Shard:
    """The shard as stored, under a decompressed view and the layers that wrap one (peers)."""
    inner = getattr(shard, "inner", shard)
    return getattr(inner, "stored", inner)


def logical_size_of(shard: Shard) -> int:
    """The size of the tar a compressed shard decompresses to (under the layers that wrap it); 0
    for any other shard."""
    inner = getattr(shard, "inner", shard)
    return inner.size if isinstance(inner, _Decompressed) else 0


def format_name(shard: Shard) -> str:
    """The format a served shard is read as: a compressed tar by what it is, not by its name (a
    .tar that is gzip inside; a .tar.gz that is a plain tar)."""
    if logical_size_of(shard):
        return FORMAT.name
    fmt = format_for(shard.path)
    return "tar" if fmt is FORMAT else fmt.name  # (REGISTRY's plain format of a compressed tar's suffix)
