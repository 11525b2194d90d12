"""How far a mount's index step is: shards ready of all, members, and, for the indexes being built,
the bytes scanned per second and the time left. A first mount of millions of members takes a
while; the daemon's log and a waiting `shardfs mount` say where it is (as `pack` does)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from shardfs.storage.base import is_url


class IndexProgress:
    """``report(figures)`` is called at most every ``every`` seconds, and once when all are ready."""

    def __init__(self, report: Callable[[dict], None], every: float = 2.0):
        self.report, self.every = report, every
        self.total = self.ready = self.built = self.members = 0
        self.to_build = self.bytes_to_build = self.bytes_built = 0
        self.started = self.last = time.monotonic()

    def begin(self, total: int, to_build: list[str]) -> None:
        """``to_build``: the shards with no current index (remote ones count by number alone)."""
        self.total, self.to_build = total, len(to_build)
        self.bytes_to_build = sum(_size(p) for p in to_build)
        self.started = self.last = time.monotonic()

    def add(self, ix, how: str) -> None:
        self.ready += 1
        if ix is not None:
            self.members += len(ix)
            if how.startswith("built"):
                self.built += 1
                self.bytes_built += ix.shard_size
        now = time.monotonic()
        if now - self.last >= self.every or self.ready == self.total:
            self.last = now
            self.report(self.figures())

    def figures(self) -> dict:
        seconds = max(time.monotonic() - self.started, 1e-6)
        if self.bytes_to_build:
            done, left = self.bytes_built, self.bytes_to_build - self.bytes_built
        else:
            done, left = self.built, self.to_build - self.built
        return {"shards": self.ready, "of": self.total, "built": self.built, "members": self.members,
                "MBps": round(self.bytes_built / seconds / 1e6, 1),
                "seconds_left": round(left * seconds / done, 1) if done else None}


def describe(f: dict) -> str:
    """One line of the figures, for the log."""
    left = "" if f["seconds_left"] is None or f["shards"] == f["of"] else f", ~{f['seconds_left']:.0f} s left"
    return (f"indexes: {f['shards']}/{f['of']} shards ready ({f['built']} built), {f['members']:,} members, "
            f"{f['MBps']:.0f} MB/s{left}")


def _size(path: str) -> int:
    if is_url(path):
        return 0
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
