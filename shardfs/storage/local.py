"""A shard that is a local (or network-mounted) file: lazily opened descriptors, positional
reads checked against the file the index was built from, O_DIRECT for whole-chunk loads.

Every call that touches the file (open, fstat, pread, stat) runs on ``deadline.local_pool``
and answers within ``deadline.TIMEOUT``: on a hung network or FUSE mount it blocks in the
kernel, and then only a pool thread is stuck, never the FUSE worker that asked."""

from __future__ import annotations

import errno
import logging
import mmap
import os

from shardfs.storage import deadline
from shardfs.storage.base import Shard, ShardIOError

log = logging.getLogger(__name__)
PAGE = mmap.PAGESIZE


class LocalShard(Shard):
    reads_into = True
    def __init__(self, path: str, size: int, mtime_ns: int, sequential: bool = False):
        """``sequential``: read front to back once (an index scan), so the kernel's readahead
        helps and the pages are dropped at close; otherwise reads are random (serving)."""
        super().__init__(path, size, mtime_ns)
        self.sequential = sequential
        self._fd: int | None = None
        self._dfd: int | None = None  # O_DIRECT descriptor for whole-chunk loads
        self._no_direct = False
        self.place = deadline.place(os.path.dirname(path) or ".")  # shards in one folder hang together

    @classmethod
    def open(cls, path: str) -> LocalShard:
        """The file as it is now, for a scan (OSError if it cannot be stat'ed)."""
        st = os.stat(path)
        return cls(path, st.st_size, st.st_mtime_ns, sequential=True)

    def changed(self) -> bool:
        """Gone (ENOENT, ENOTDIR) or another size or mtime: True. Any other failure (EIO, no
        answer) says nothing about the file: ShardIOError, so that a rescan never takes a
        storage outage for a change."""
        try:
            st = deadline.local_pool.run(self.place, os.stat, self.path)
        except (FileNotFoundError, NotADirectoryError):
            return True
        except OSError as exc:
            raise ShardIOError(f"{self.path}: cannot tell whether it changed: {exc.strerror or exc}",
                               unavailable=True) from None
        return (st.st_size, st.st_mtime_ns) != (self.size, self.mtime_ns)

    def _bounded(self, offset: int, read, *args):
        """``read(*args)`` on the storage pool: its answer, or EIO within deadline.TIMEOUT."""
        try:
            return deadline.local_pool.run(self.place, read, *args)
        except deadline.NotAnswering as exc:
            raise self.read_failed(offset, str(exc), unavailable=True) from None

    def fd(self) -> int:
        if self.broken:
            raise ShardIOError(self.broken, unavailable=True, permanent=True)
        if self._fd is not None:
            return self._fd
        try:  # not under the lock: an open that hangs must not hold it (read_failed takes it)
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):  # our limit, not the shard's fault
                log.error("%s: cannot open: %s; raise the open-files limit (LimitNOFILE, ulimit -n)",
                          self.path, exc.strerror)
                raise ShardIOError(f"{self.path}: {exc.strerror}") from None
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.EPERM):
                if self.sequential:  # a scan, whose caller says the shard is left out: no "answer EIO" line
                    raise ShardIOError(f"{self.path}: cannot open: {exc.strerror}", unavailable=True,
                                       permanent=True) from None
                raise self.mark_broken(f"cannot open: {exc.strerror}") from None
            raise self.read_failed(0, f"cannot open: {exc.strerror}") from None  # EIO & co: try again later
        if not self.sequential:
            # We read in large chunks or exactly one member: kernel readahead beyond that
            # would only read bytes twice (measured: +13% storage traffic without this).
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        with self._lock:
            if self._fd is None:
                self._fd, fd = fd, None
        if fd is not None:  # another reader opened it first
            os.close(fd)
        return self._fd

    def _check_unchanged(self, fd: int) -> None:
        # Every storage read checks the file is still the one indexed (one fstat, ~1 us):
        # a shard rewritten in place must give EIO, never other bytes at the old offsets.
        st = os.fstat(fd)
        if (st.st_size, st.st_mtime_ns) != (self.size, self.mtime_ns):
            raise self.mark_broken("changed since its index was built (size or mtime differ)")

    def _pread(self, offset: int, length: int) -> bytes:
        return self._bounded(offset, self._pread_now, offset, length)

    def _pread_now(self, offset: int, length: int) -> bytes:
        fd = self.fd()
        self._check_unchanged(fd)
        try:
            data = os.pread(fd, length, offset)
        except OSError as exc:
            raise self.read_failed(offset, exc.strerror) from None
        if len(data) != length:
            raise self.mark_broken(f"short read at offset {offset} (truncated since its index was built?)")
        return data

    def read_at(self, buf: memoryview, offset: int, length: int) -> None:
        """As Shard.read_at, without a copy: ``buf`` is page-aligned (with room for whole pages)
        and ``offset`` a multiple of the page size, so the read bypasses the page cache
        (O_DIRECT), which saves a copy and keeps the node from holding the bytes twice. Where the
        filesystem refuses O_DIRECT, an ordinary read whose pages are dropped afterwards does the
        same job."""
        if self.broken:
            raise ShardIOError(self.broken, unavailable=True, permanent=True)
        self._bounded(offset, self._read_at_now, buf, offset, length)
        if self.on_read is not None and length:
            self.on_read(offset, buf[:length])

    def _read_at_now(self, buf: memoryview, offset: int, length: int) -> None:
        fd = self.fd()
        self._check_unchanged(fd)
        direct = self._direct_fd() if offset % PAGE == 0 else None
        want = -(-length // PAGE) * PAGE if direct is not None else length  # whole pages; EOF cuts it
        try:
            got = os.preadv(direct if direct is not None else fd, [buf[:want]], offset)
        except OSError as exc:
            if direct is not None and exc.errno == errno.EINVAL:  # O_DIRECT not supported after all
                self._no_direct = True
                return self._read_at_now(buf, offset, length)
            raise self.read_failed(offset, exc.strerror) from None
        if got < length:
            raise self.mark_broken(f"short read at offset {offset} (truncated since its index was built?)")
        if direct is None:
            self.forget(offset, length)

    def _direct_fd(self) -> int | None:
        if self._no_direct:
            return None
        if self._dfd is None:
            try:  # not under the lock, as in fd()
                dfd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECT)
            except OSError:
                self._no_direct = True
                return None
            with self._lock:
                if self._dfd is None:
                    self._dfd, dfd = dfd, None
            if dfd is not None:
                os.close(dfd)
        return self._dfd

    def will_need(self, ranges: list[tuple[int, int]]) -> None:
        try:
            self._bounded(0, self._will_need_now, ranges)
        except ShardIOError:
            pass  # only advice: the reads themselves say what is wrong

    def _will_need_now(self, ranges: list[tuple[int, int]]) -> None:
        fd = self.fd()
        for offset, length in ranges:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)

    def forget(self, offset: int, length: int) -> None:
        if self._fd is not None:
            try:
                os.posix_fadvise(self._fd, offset, length, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass

    def close(self) -> None:
        with self._lock:
            if self.sequential and self._fd is not None:
                self.forget(0, 0)  # read once to build an index: do not let it crowd the page cache
            for fd in (self._fd, self._dfd):
                if fd is not None:
                    os.close(fd)
            self._fd = self._dfd = None
