"""What a remote object is (URL, size, tag) and how a request to it failed."""

from __future__ import annotations

import errno
from dataclasses import dataclass

from shardfs.errors import ShardfsError
from shardfs.redact import redact


@dataclass(frozen=True)
class ObjectInfo:
    url: str
    size: int
    tag: str  # ETag, or "last-modified:<date>"; "" when the server gives neither
    mtime_ns: int


class RemoteError(ShardfsError, OSError):
    """A request failed. ``permanent``: retrying cannot help (403, 404, 412, ...)."""

    def __init__(self, message: str, permanent: bool, status: int | None = None):
        super().__init__(errno.EIO, redact(message))
        self.permanent, self.status = permanent, status

    def __str__(self) -> str:
        return self.strerror


_PERMANENT_STATUS = {400, 401, 403, 404, 405, 410, 412, 416}


def status_error(what: str, status: int, reason: str = "") -> RemoteError:
    why = {404: "not found", 403: "access denied", 412: "changed since its index was built (precondition failed)",
           416: "range not satisfiable (object shrank?)"}.get(status, reason or "error")
    return RemoteError(f"{what}: HTTP {status} {why}", permanent=status in _PERMANENT_STATUS, status=status)


def mtime_ns(value) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        import email.utils  # a remote shard's Last-Modified only

        try:
            value = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return 0
    return int(value.timestamp() * 1e9)
