"""What every shard format hands to the index: member records and a data layout.

A format has two jobs, kept apart so that the index can be persisted and the
read path stays cheap:

* ``scan(path)`` lists the members once (at index build time).
* ``open_layout(path, size)`` returns a :class:`DataLayout` that turns a range of
  the shard's *logical data stream* into bytes, given a ``fetch(offset, length)``
  function that reads raw shard bytes (through the RAM cache).

For tar the logical stream is the file itself; for the lz4 format it is the
concatenation of all uncompressed blocks. Member offsets in the index always
point into the logical stream.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Protocol

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


class ShardFormatError(Exception):
    """The shard is damaged or not of the format it claims; the message says where."""


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


class ShardFormat(Protocol):
    name: str
    suffixes: tuple[str, ...]

    def scan(self, path: str) -> ScanResult: ...

    def open_layout(self, path: str, size: int) -> DataLayout: ...
