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

``src`` is a :class:`ByteSource`: a shard as shardfs.storage gives it (a local file or a remote
object); formats read through ``pread`` only, so they need not know where the bytes come from.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

from shardfs.errors import ShardfsError
from shardfs.storage.base import ShardIOError

if TYPE_CHECKING:  # numpy costs a `shardfs mount` ~0.1 s before the daemon forks (service/forked.py)
    import numpy as np

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
    # A sparse file (formats/sparse.py): its runs, (offset in the file, length) rows, whose bytes are
    # stored back to back from ``offset``; ``size`` is the file's real size. None for all others.
    sparse: np.ndarray | None = None
    label: int | None = None  # a dataset file's row: its label (datafile.py)


# Set in a member's offset that is not a byte range of the shard as stored (Parquet's compressed
# pages, a zip's compressed members, a SquashFS file in compressed blocks): the rest says where to
# the format's layout, which alone can read it. The compiled loop serves a shard's other members
# from the cached shard where the format says so (``as_stored``) and sends these to Python.
VIRTUAL = 1 << 62

SMALL_DATA = 32  # a scan may keep the data of members up to this size (WebDataset .cls labels)


class ShardFormatError(ShardfsError):
    """The shard is damaged or not of the format it claims; the message says where."""


class OtherFormat(ShardfsError):
    """A scan found at the shard's start the magic of another format (formats.REGISTRY): a ``.tar``
    that is gzip inside. The index build then reads it as that one (shard_index.build)."""

    def __init__(self, head: bytes):
        super().__init__("the shard's first bytes are another format's")
        self.head = head


@dataclass(slots=True)
class ScanResult:
    members: list[MemberRecord]
    # Problems that did not stop the scan (one line each, naming the member).
    warnings: list[str]
    # Set when the scan stopped early or skipped damage: the members it lists are still good.
    error: str | None = None
    # The name of a member the damage cut short: tar -x writes part of it over any earlier member of
    # that name, so neither is served.
    cut: bytes | None = None
    classes: list[str] | None = None  # dataset files (datafile.py): the class names the file carries
    # tar, scanned with columns=True: every member as the compiled scanner's columns
    # (formats/tarcolumns.py), ``members`` then empty
    columns: object | None = None


class DataLayout(Protocol):
    def read(self, offset: int, length: int, fetch: Fetch) -> bytes:
        """Bytes [offset, offset+length) of the logical stream (clamped by the caller)."""
        ...


class IdentityLayout:
    """Logical stream == raw file (tar)."""

    def read(self, offset: int, length: int, fetch: Fetch) -> bytes:
        return fetch(offset, length)


class AsStored:
    """What a format whose members are byte ranges of the shard as stored has (tar, Arrow IPC,
    HDF5): the identity layout, and every member served by the compiled loop."""

    members_as_stored = True

    def as_stored(self, offsets) -> bool:
        return True

    def open_layout(self, src: "ByteSource", size: int) -> IdentityLayout:
        return IdentityLayout()


class ByteSource(Protocol):
    """What a format reads a shard through: shardfs.storage.base.Shard (local or remote)."""

    size: int
    window: int  # how much a sequential scan should read at once (larger for remote objects)

    def pread(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` (fewer only at the end); ShardIOError on failure."""
        ...


class Window:
    """Reads a shard forward in windows (64 KiB from a local file, 8 MiB from a remote object)
    so that consecutive small reads (tar headers, labels) cost one syscall or one request."""

    def __init__(self, src: ByteSource, size: int = 0):
        self.src, self.size = src, max(size, src.window)  # ``size``: a format's own, when larger
        self.start, self.buf = 0, b""

    def get(self, pos: int, n: int) -> bytes:
        off = pos - self.start
        if off < 0 or off + n > len(self.buf):
            try:
                self.start, self.buf = pos, self.src.pread(pos, max(n, self.size))
            except ShardIOError as exc:
                if exc.unavailable:
                    raise  # not damage: the scan stops and records nothing
                # The window may reach into a bad spot of a member's data: read just what we need.
                try:
                    self.start, self.buf = pos, self.src.pread(pos, n)
                except ShardIOError as exc2:
                    if exc2.unavailable:
                        raise
                    raise ShardFormatError(f"read error at offset {pos}: {exc2.strerror}") from None
            off = 0
        return bytes(self.buf[off : off + n])  # (the tar scanner's chunks are views of a buffer it reuses)


class ShardFormat(Protocol):
    name: str
    suffixes: tuple[str, ...]
    members_as_stored: bool  # each member is a byte range of the shard as stored (tar)

    def as_stored(self, offsets) -> bool:
        """Whether members at these offsets are byte ranges of the shard as stored (Parquet: when
        none lies in a compressed page); formats of one kind answer ``members_as_stored``."""
        ...

    def scan(self, src: ByteSource) -> ScanResult: ...

    def open_layout(self, src: ByteSource, size: int) -> DataLayout: ...
