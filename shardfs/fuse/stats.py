"""Counters the daemon keeps; read through an xattr on the mount root, so the tree gets no extra files."""

from __future__ import annotations

import threading
import time
from collections import Counter

STATS_XATTR = "user.shardfs.stats"


class Stats:
    def __init__(self):
        self.started = time.time()
        self.ops: Counter[str] = Counter()
        self.bytes_served = 0
        self.read_errors = 0
        self._lock = threading.Lock()

    def op(self, name: str) -> None:
        with self._lock:
            self.ops[name] += 1

    def served(self, nbytes: int) -> None:
        with self._lock:
            self.ops["read"] += 1
            self.bytes_served += nbytes

    def error(self) -> None:
        with self._lock:
            self.read_errors += 1

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "uptime_s": round(time.time() - self.started, 3),
                "fuse_ops": dict(self.ops),
                "bytes_served": self.bytes_served,
                "read_errors": self.read_errors,
            }
