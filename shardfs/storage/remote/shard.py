"""A shard in object storage or on an HTTP server: ranged, conditional GETs instead of preads."""

from __future__ import annotations

from shardfs.storage.base import Shard, ShardIOError
from shardfs.storage.remote.client import info, read
from shardfs.storage.remote.errors import ObjectInfo, RemoteError

WINDOW = 8 << 20  # read-ahead of an index scan: one 8 MiB GET covers many tar headers


class RemoteShard(Shard):
    remote = True
    window = WINDOW

    def __init__(self, url: str, size: int, mtime_ns: int, tag: str):
        super().__init__(url, size, mtime_ns)
        self.tag = tag

    @classmethod
    def of(cls, obj: ObjectInfo) -> RemoteShard:
        return cls(obj.url, obj.size, obj.mtime_ns, obj.tag)

    def changed(self) -> bool:
        """Gone (404, 410) or another size or tag: True. Any other failure (timeouts, 5xx, 403)
        says nothing about the object: ShardIOError, so that a rescan never takes a storage
        outage for a change."""
        try:
            now = info(self.path)
        except RemoteError as exc:
            if exc.status in (404, 410):
                return True
            raise ShardIOError(f"cannot tell whether {self.path} changed: {exc.strerror}", unavailable=True) from None
        return (now.size, now.tag) != (self.size, self.tag)

    def _pread(self, offset: int, length: int, out: memoryview | None = None) -> bytes:
        # Every failure is "unavailable": the object is out of reach or changed, never damaged,
        # so a scan it stops records nothing.
        try:
            return read(self.path, offset, length, self.tag, out)
        except RemoteError as exc:
            if exc.permanent:
                raise self.mark_broken(exc.strerror) from None
            raise self.read_failed(offset, exc.strerror, unavailable=True) from None

    def read_at(self, buf: memoryview, offset: int, length: int) -> None:
        if self.broken:
            self.pread(offset, length)  # raises
        self._pread(offset, length, buf[:length])  # the body goes straight into the cache
