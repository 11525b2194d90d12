"""Counters the daemon keeps; read through an xattr on the mount root, so the tree gets no extra files."""

from __future__ import annotations

import threading
import time
from collections import Counter

STATS_XATTR = "user.shardfs.stats"


class Stats:
    """Counted per thread (each worker adds to its own Counter, no lock on the request path);
    a snapshot sums them."""

    def __init__(self):
        self.started = time.time()
        self._local = threading.local()
        self._all: list[Counter[str]] = []
        self._lock = threading.Lock()  # only for adding a thread's Counter and for snapshots
        self._sources: list = []  # more counters kept elsewhere (the compiled loop's)

    def _mine(self) -> Counter[str]:
        try:
            return self._local.counts
        except AttributeError:
            counts = self._local.counts = Counter()
            with self._lock:
                self._all.append(counts)
            return counts

    def add_source(self, counts) -> None:
        """``counts()`` returns {"fuse_ops": {op: n}, "bytes_served": n, other figures}, added to
        every snapshot."""
        self._sources.append(counts)

    def served(self, nbytes: int) -> None:
        counts = self._mine()
        counts["read"] += 1
        counts["bytes"] += nbytes

    def error(self) -> None:
        self._mine()["read_errors"] += 1

    def snapshot(self) -> dict:
        total: Counter[str] = Counter()
        with self._lock:
            for counts in self._all:
                total.update(counts.copy())  # copy: the owner may add a key meanwhile
        bytes_served, read_errors = total.pop("bytes", 0), total.pop("read_errors", 0)
        extra: Counter[str] = Counter()
        for counts in self._sources:
            more = counts()
            total.update(more.pop("fuse_ops"))
            bytes_served += more.pop("bytes_served")
            extra.update(more)
        return {
            "uptime_s": round(time.time() - self.started, 3),
            "fuse_ops": dict(total),
            "bytes_served": bytes_served,
            "read_errors": read_errors,
            **extra,
        }
