"""A cheap fingerprint of a shard's bytes, recorded in its index when the index is built.

An index found beside a remote object (``URL.shardfs-idx``, written by ``shardfs index`` or
``pack`` on a local copy and uploaded) knows the local file's size and mtime, not the object's
ETag, so its size alone proves nothing: a dataset re-packed with another seed has shards of
the same sizes with their members in another order. Before such an index serves an object,
the object's bytes are checked against the fingerprint: a SHA-256 of the shard's size and of
three 64 KiB windows (its start, its middle and its end; a shard of up to 192 KiB whole).

Checking costs three ranged GETs per shard (192 KiB), whatever the shard's size, so a mount of
1,000 remote shards reads ~200 MB to vet their indexes instead of the whole dataset; once checked,
the index is cached with the object's ETag and later mounts need no GET at all. A reordered or
re-packed shard changes its first member (the start window holds its header and data) and the
bytes at the middle and the end. Not caught: a same-size edit outside the three windows of a
shard whose index came from elsewhere (a rewritten object in a store that sends an ETag is
caught by the ETag, whatever changed).
"""

from __future__ import annotations

import hashlib

from shardfs.storage.base import Shard

WINDOW = 64 * 1024
VERSION = "fp1"


def ranges(size: int) -> list[tuple[int, int]]:
    """(offset, length) of the windows hashed for a shard of ``size`` bytes."""
    if size <= 3 * WINDOW:
        return [(0, size)]
    return [(0, WINDOW), (size // 2 - WINDOW // 2, WINDOW), (size - WINDOW, WINDOW)]


def of(shard: Shard, kept: dict[int, bytes] | None = None) -> str:
    """The shard's fingerprint (reads the windows, bar those in ``kept`` by offset; ShardIOError
    if it cannot)."""
    digest = hashlib.sha256(b"%s %d\n" % (VERSION.encode(), shard.size))
    for offset, length in ranges(shard.size):
        window = (kept or {}).get(offset)
        digest.update(window if window is not None else shard.pread(offset, length))
    return f"{VERSION}:{digest.hexdigest()}"


class Keeping:
    """A shard read through by a scan that keeps, of what it reads, the windows the fingerprint
    hashes (``kept``): an index build then reads them again only where no read held one whole
    (each is a storage request: three per shard, a few ms at thousands of small shards)."""

    def __init__(self, shard: Shard):
        self.shard, self.size, self.window = shard, shard.size, shard.window
        self.reads_into = shard.reads_into
        self.kept: dict[int, bytes] = {}
        self._wanted = ranges(shard.size)

    def pread(self, offset: int, length: int) -> bytes:
        data = self.shard.pread(offset, length)
        self._keep(offset, data)
        return data

    def read_at(self, buf: memoryview, offset: int, length: int) -> None:
        self.shard.read_at(buf, offset, length)
        self._keep(offset, buf[:length])

    def _keep(self, offset: int, data) -> None:
        for at, n in self._wanted:
            if at not in self.kept and offset <= at and at + n <= offset + len(data):
                self.kept[at] = bytes(data[at - offset : at - offset + n])  # (``data`` may be a reused buffer)
