"""Open shard files: lazily opened descriptors, checked against their index, positional reads."""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading

from shardfs.formats import format_for
from shardfs.formats.base import DataLayout, ShardFormatError, Source, SourceUnavailable

log = logging.getLogger(__name__)
PAGE = mmap.PAGESIZE


class ShardIOError(Exception):
    """A read from a shard failed; the FUSE layer answers EIO and the message is logged once."""


class Shard:
    """A local shard file. (shardfs.storage.remote.RemoteShard: one in object storage or on an HTTP server.)"""

    remote = False

    def __init__(self, path: str, size: int, mtime_ns: int):
        self.path, self.size, self.mtime_ns = path, size, mtime_ns
        self.name = os.path.basename(path)
        self.format_name = format_for(path).name
        self.broken: str | None = None
        self.index_path: str | None = None  # where its index was loaded from or saved to
        self.io_errors = 0
        self._fd: int | None = None
        self._dfd: int | None = None  # O_DIRECT descriptor for whole-chunk loads
        self._no_direct = False
        self._layout: DataLayout | None = None
        self._lock = threading.RLock()  # _fail is called with it held

    def _fail(self, why: str) -> ShardIOError:
        """The shard is unusable for good (changed, truncated, gone): all its files answer EIO."""
        with self._lock:
            if self.broken is None:
                self.broken = why
                log.error("%s: %s; its files now answer EIO", self.path, why)
        return ShardIOError(f"{self.path}: {why}")

    def _io_error(self, offset: int, exc: OSError) -> ShardIOError:
        """A read failed (EIO from storage): this read answers EIO; the next one tries again."""
        with self._lock:
            self.io_errors += 1
            if self.io_errors <= 10 or self.io_errors % 1000 == 0:
                log.error("%s: read error at offset %d: %s (%d so far; reads of it are retried)",
                          self.path, offset, exc.strerror, self.io_errors)
        return ShardIOError(f"{self.path}: read error at offset {offset}: {exc.strerror}")

    def changed_on_disk(self) -> bool:
        try:
            st = os.stat(self.path)
        except OSError:
            return True
        return (st.st_size, st.st_mtime_ns) != (self.size, self.mtime_ns)

    def mark_broken(self, why: str) -> None:
        self._fail(why)

    def fd(self) -> int:
        if self.broken:
            raise ShardIOError(self.broken)
        if self._fd is not None:
            return self._fd
        with self._lock:
            if self._fd is None:
                try:
                    fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError as exc:
                    if exc.errno in (errno.EMFILE, errno.ENFILE):  # our limit, not the shard's fault
                        log.error("%s: cannot open: %s; raise the open-files limit (LimitNOFILE, ulimit -n)",
                                  self.path, exc.strerror)
                        raise ShardIOError(f"{self.path}: {exc.strerror}") from None
                    raise self._fail(f"cannot open: {exc.strerror}") from None
                # We read in large chunks or exactly one member: kernel readahead beyond that
                # would only read bytes twice (measured: +13% storage traffic without this).
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                self._fd = fd
        return self._fd

    def _check_unchanged(self, fd: int) -> None:
        # Every storage read checks the file is still the one indexed (one fstat, ~1 us):
        # a shard rewritten in place must give EIO, never other bytes at the old offsets.
        st = os.fstat(fd)
        if (st.st_size, st.st_mtime_ns) != (self.size, self.mtime_ns):
            raise self._fail("changed since its index was built (size or mtime differ)")

    def pread(self, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes at ``offset``, or ShardIOError."""
        fd = self.fd()
        self._check_unchanged(fd)
        try:
            data = os.pread(fd, length, offset)
        except OSError as exc:
            raise self._io_error(offset, exc) from None
        if len(data) != length:
            raise self._fail(f"short read at offset {offset} (truncated since its index was built?)")
        return data

    def read_into(self, buf: memoryview, offset: int, length: int) -> None:
        """Fill ``buf[offset:offset+length]`` with the shard's bytes there (no copy), or ShardIOError.

        ``buf`` is page-aligned and holds the whole shard rounded up to a page, and ``offset`` is
        a multiple of the page size: then the read bypasses the page cache (O_DIRECT), which
        saves a copy and keeps the node from holding the bytes twice. Where the filesystem
        refuses O_DIRECT, an ordinary read whose pages are dropped afterwards does the same job.
        """
        fd = self.fd()
        self._check_unchanged(fd)
        direct = self._direct_fd() if offset % PAGE == 0 else None
        want = -(-length // PAGE) * PAGE if direct is not None else length  # whole pages; EOF cuts it
        try:
            got = os.preadv(direct if direct is not None else fd, [buf[offset : offset + want]], offset)
        except OSError as exc:
            if direct is not None and exc.errno == errno.EINVAL:  # O_DIRECT not supported after all
                self._no_direct = True
                return self.read_into(buf, offset, length)
            raise self._io_error(offset, exc) from None
        if got < length:
            raise self._fail(f"short read at offset {offset} (truncated since its index was built?)")
        if direct is None:
            self.forget(offset, length)

    def _direct_fd(self) -> int | None:
        if self._no_direct:
            return None
        if self._dfd is None:
            with self._lock:
                if self._dfd is None and not self._no_direct:
                    try:
                        self._dfd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECT)
                    except OSError:
                        self._no_direct = True
        return self._dfd

    def forget(self, offset: int, length: int) -> None:
        """Drop these bytes from the kernel's page cache of the shard file: we keep our own copy."""
        if self._fd is not None:
            try:
                os.posix_fadvise(self._fd, offset, length, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass

    def _source(self) -> Source:
        return self.path

    def layout(self) -> DataLayout:
        if self._layout is None:
            fmt = format_for(self.path)
            try:
                self._layout = fmt.open_layout(self._source(), self.size)
            except SourceUnavailable as exc:
                if exc.permanent:
                    raise self._fail(f"cannot read its tables: {exc}") from None
                raise self._io_error(0, exc.error) from None
            except (OSError, ShardFormatError) as exc:
                raise self._fail(f"cannot read its tables: {exc}") from None
        return self._layout

    def close(self) -> None:
        with self._lock:
            for fd in (self._fd, self._dfd):
                if fd is not None:
                    os.close(fd)
            self._fd = self._dfd = None
