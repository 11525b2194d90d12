"""What every shard format hands to the index: member records and a data layout.

A format has two jobs, kept apart so that the index can be persisted and the
read path stays cheap:

* ``scan(src)`` lists the members once (at index build time).
* ``open_layout(src, size)`` returns a :class:`DataLayout` that turns a range of
  the shard's *logical data stream* into bytes, given a ``fetch(offset, length)``
  function that reads raw shard bytes (through the RAM cache).

For tar the logical stream is the file itself; for the lz4 format it is the
concatenation of all uncompressed blocks. Member offsets in the index always
point into the logical stream.

``src`` is a local path or a :class:`ByteSource` (a remote object, see shardfs.storage.remote):
formats read through ``pread`` only, so they need not know where the bytes come from.
"""

from __future__ import annotations

import contextlib
import enum
import os
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol, Union

Fetch = Callable[[int, int], bytes]


class Kind(enum.IntEnum):
    FILE = 0
    DIR = 1
    SYMLINK = 2
    HARDLINK = 3  # resolved to the target's data when the index is built


@dataclass(slots=True)
class MemberRecord:
    path: bytes  # raw name as stored in the shard, not yet normalised
    kind: Kind
    offset: int  # start of the data in the logical data stream
    size: int
    mode: int  # permission bits only (0o7777)
    mtime: float
    link: bytes = b""  # symlink target, or hard link target path
    small: bytes | None = None  # the data, when the scan read it anyway (tiny members: labels)


SMALL_DATA = 32  # a scan may keep the data of members up to this size (WebDataset .cls labels)


class ShardFormatError(Exception):
    """The shard is damaged or not of the format it claims; the message says where."""


class SourceUnavailable(Exception):
    """The shard's bytes could not be read at all (a remote object gone, changed or unreachable):
    not damage, so nothing about the shard is recorded from a scan this stopped."""

    def __init__(self, error: OSError, permanent: bool):
        super().__init__(str(error))
        self.error, self.permanent = error, permanent


@dataclass(slots=True)
class ScanResult:
    members: list[MemberRecord]
    # Problems that did not stop the scan (one line each, naming the member).
    warnings: list[str]
    # Set when the scan stopped early: the members before the damage are still good.
    error: str | None = None


class DataLayout(Protocol):
    def read(self, offset: int, length: int, fetch: Fetch) -> bytes:
        """Bytes [offset, offset+length) of the logical stream (clamped by the caller)."""
        ...

    def raw_range(self, offset: int, length: int) -> tuple[int, int]:
        """The raw byte range of the shard file that holds that logical range."""
        ...


class IdentityLayout:
    """Logical stream == raw file (tar)."""

    def read(self, offset: int, length: int, fetch: Fetch) -> bytes:
        return fetch(offset, length)

    def raw_range(self, offset: int, length: int) -> tuple[int, int]:
        return offset, length


class ByteSource(Protocol):
    """Positional reads of one shard's bytes, wherever it is stored."""

    size: int
    window: int  # how much a sequential scan should read at once (larger for remote objects)

    def pread(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` (fewer only at the end); OSError on failure."""
        ...


class FileSource:
    """A local shard file as a ByteSource."""

    window = 64 * 1024

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.size = os.fstat(self.fd).st_size

    def pread(self, offset: int, length: int) -> bytes:
        return os.pread(self.fd, length, offset)

    def close(self) -> None:
        # Read once to build an index: do not let those bytes crowd the page cache.
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(self.fd)


Source = Union[str, ByteSource]


class Window:
    """Reads a shard forward in windows (64 KiB from a local file, 8 MiB from a remote object)
    so that consecutive small reads (tar headers, labels) cost one syscall or one request."""

    def __init__(self, src: ByteSource):
        self.src = src
        self.start, self.buf = 0, b""

    def get(self, pos: int, n: int) -> bytes:
        off = pos - self.start
        if off < 0 or off + n > len(self.buf):
            try:
                self.start, self.buf = pos, self.src.pread(pos, max(n, self.src.window))
            except OSError:
                # The window may reach into a bad spot of a member's data: read just what we need.
                try:
                    self.start, self.buf = pos, self.src.pread(pos, n)
                except OSError as exc:
                    raise ShardFormatError(f"read error at offset {pos}: {exc.strerror}") from None
            off = 0
        return self.buf[off : off + n]


@contextlib.contextmanager
def open_source(src: Source) -> Iterator[ByteSource]:
    """A ByteSource for a path (opened and closed here) or the ByteSource given."""
    if not isinstance(src, str):
        yield src
        return
    source = FileSource(src)
    try:
        yield source
    finally:
        source.close()


class ShardFormat(Protocol):
    name: str
    suffixes: tuple[str, ...]

    def scan(self, src: Source) -> ScanResult: ...

    def open_layout(self, src: Source, size: int) -> DataLayout: ...
