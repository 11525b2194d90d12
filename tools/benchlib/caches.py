"""Dropping the page cache, and noticing when another process did (it spoils warm figures)."""

from __future__ import annotations

import os

_own_drops = 0


def drop_caches(level: int = 3) -> bool:
    """sync, then drop the page cache (1) or it and the dentries/inodes (3, the default).

    False when not possible (not root, read-only /proc/sys): cold figures are then not cold."""
    global _own_drops
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write(f"{level}\n")
    except OSError:
        return False
    _own_drops += 1
    return True


def vmstat(key: str) -> int | None:
    with open("/proc/vmstat") as f:
        for line in f:
            if line.startswith(key + " "):
                return int(line.split()[1])
    return None


def drops_by_others() -> int:
    """A counter of page-cache drops by other processes since boot (ours subtracted): compare two readings."""
    return (vmstat("drop_pagecache") or 0) - _own_drops


def cached_bytes() -> int:
    """The page cache's size now (/proc/meminfo Cached)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Cached:"):
                return int(line.split()[1]) * 1024
    return 0
