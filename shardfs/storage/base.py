"""One interface for a shard's bytes, wherever the shard is stored.

A :class:`Shard` is read by offset: index builds scan it (through a format), the mount serves
from it (through the caches). Two kinds implement it: ``local.LocalShard`` (a file, pread and
O_DIRECT) and ``remote.RemoteShard`` (an object in S3 or on an HTTP server, ranged GETs). The
bookkeeping every kind shares lives here: a shard that changed or vanished is broken for good
(all its reads answer EIO), while a failed read is counted and the next read tries again.
"""

from __future__ import annotations

import errno
import logging
import threading

from shardfs.errors import ShardfsError

log = logging.getLogger(__name__)


def is_url(src: str) -> bool:
    return src.startswith(("s3://", "http://", "https://"))


class ShardIOError(ShardfsError, OSError):
    """A read from a shard failed; the FUSE layer answers EIO and the message is logged once.

    ``unavailable``: the shard could not be read at all (a remote object gone, changed or out of
    reach; a local file changed since it was indexed): a scan that this stops records nothing
    about the shard, unlike damage found in the bytes themselves."""

    def __init__(self, message: str, unavailable: bool = False, permanent: bool = False):
        super().__init__(errno.EIO, message)
        self.unavailable, self.permanent = unavailable, permanent

    def __str__(self) -> str:
        return self.strerror


def _shared_get(self) -> str | None:
    return self._wrapped().broken


def _shared_put(self, why: str | None) -> None:
    if why is not None:  # (Shard.__init__'s None leaves a broken wrapped shard broken)
        raise AttributeError("a wrapping shard is marked through mark_broken")


# A wrapping shard's ``broken`` (beside its ``_wrapped``): one state with the shard it wraps.
SHARED_BROKEN = property(_shared_get, _shared_put)


class Shard:
    """One shard's bytes. Subclasses implement ``_pread`` and may speed up ``read_at``."""

    remote = False
    window = 64 * 1024  # how much a sequential scan reads at once (larger for remote objects)
    reads_into = False  # read_at fills the buffer without a copy of its own (a local file's O_DIRECT)

    def __init__(self, path: str, size: int, mtime_ns: int):
        self.path, self.size, self.mtime_ns = path, size, mtime_ns
        self.name = path.rstrip("/").rsplit("/", 1)[-1]
        self.broken: str | None = None
        self.index_path: str | None = None  # where its index was loaded from or saved to
        self.io_errors = 0
        # Told of every pread's bytes (offset, data): an index build keeping what it reads in the
        # caches as it goes (storage/buildfill.py), so that the first epoch does not read it again.
        self.on_read = None
        self._broken_hooks: list = []  # when_broken
        self._lock = threading.RLock()  # mark_broken may run with it held (RLock)

    # ---- reading ---------------------------------------------------------------------

    def pread(self, offset: int, length: int) -> bytes:
        """The bytes at ``offset``: ``length`` of them, fewer only where the shard ends; or ShardIOError."""
        if self.broken:
            raise ShardIOError(self.broken, unavailable=True, permanent=True)
        length = min(length, self.size - offset)
        data = self._pread(offset, length) if length > 0 else b""
        if self.on_read is not None and data:
            self.on_read(offset, data)
        return data

    def read_into(self, buf: memoryview, offset: int, length: int) -> None:
        """Fill ``buf[offset:offset+length]`` with the shard's bytes there, or ShardIOError.
        ``buf`` holds the whole shard (the RAM cache's buffer of it)."""
        self.read_at(buf[offset:], offset, length)

    def read_at(self, buf: memoryview, offset: int, length: int) -> None:
        """Fill ``buf[:length]`` with the shard's bytes at ``offset``, or ShardIOError. Kinds that
        can read straight into memory do (a page-aligned ``buf`` with room for whole pages lets a
        local file be read with O_DIRECT). ``on_read`` is told, as by ``pread``."""
        buf[:length] = self.pread(offset, length)

    def _pread(self, offset: int, length: int) -> bytes:
        raise NotImplementedError

    def forget(self, offset: int, length: int) -> None:
        """These bytes are cached above us now: drop any copy the kernel keeps of them."""

    def will_need(self, ranges: list[tuple[int, int]]) -> None:
        """(offset, length) ranges a scan reads soon, out of order: a local file asks the kernel to
        read them now, all at once, so their reads need not wait one after another."""

    def changed(self) -> bool:
        """Whether the shard is no longer the one indexed (size, mtime or tag differ, or it is gone).
        ShardIOError when storage gives no definite answer (a timeout, EIO, a 5xx): an outage
        is never taken for a change."""
        raise NotImplementedError

    def close(self) -> None:
        pass

    # ---- failures ----------------------------------------------------------------------

    def _wrapped(self) -> Shard | None:
        """The shard a wrapper (a peer shard, a decompressed view) shares its broken state with:
        it registers its ``_tell_broken`` there, and is marked by marking that one."""
        return None

    def mark_broken(self, why: str) -> ShardIOError:
        """The shard is unusable for good (changed, truncated, gone): all its files answer EIO."""
        wrapped = self._wrapped()
        if wrapped is not None:  # its hooks, then ours through it: whichever of the two a cache knows
            return wrapped.mark_broken(why)
        with self._lock:
            first = self.broken is None
            if first:
                self.broken = why
                log.error("%s: %s; its files now answer EIO", self.path, why)
        if first:
            self._tell_broken()
        return ShardIOError(f"{self.path}: {why}", unavailable=True, permanent=True)

    def when_broken(self, hook) -> None:
        """``hook()`` is called once, when the shard is marked broken: the compiled loop stops
        serving the bytes it holds of it then (fuse/table.py Slots), not at the next rescan."""
        with self._lock:
            self._broken_hooks.append(hook)

    def _tell_broken(self) -> None:
        with self._lock:
            hooks = list(self._broken_hooks)
        for hook in hooks:
            hook()

    def read_failed(self, offset: int, why: str, unavailable: bool = False) -> ShardIOError:
        """A read failed (EIO from storage, a store not answering): this read answers EIO; the
        next one tries again. Logged for the first ten, then every thousandth."""
        with self._lock:
            self.io_errors += 1
            if self.io_errors <= 10 or self.io_errors % 1000 == 0:
                log.error("%s: read error at offset %d: %s (%d so far; reads of it are retried)",
                          self.path, offset, why, self.io_errors)
        return ShardIOError(f"{self.path}: read error at offset {offset}: {why}", unavailable=unavailable)
