"""Where a read's bytes came from: shared storage, or a peer that had them.

A shard read below the caches runs on the caller's thread, peer fetches included, so a
per-thread tally of bytes that came from peers, taken before and after the read, splits it
exactly. The caches count storage bytes and peer bytes apart with it: every counter named
storage counts shared storage only.
"""

from __future__ import annotations

import threading
import time

_local = threading.local()


def add_from_peers(nbytes: int) -> None:
    """Called by a peer shard for bytes a peer gave it (on the reading thread)."""
    _local.from_peers = getattr(_local, "from_peers", 0) + nbytes


def split(read, *args) -> tuple[object, int, int]:
    """``read(*args)``'s result, the bytes of it that came from peers, and the nanoseconds it took."""
    before = getattr(_local, "from_peers", 0)
    began = time.perf_counter_ns()
    got = read(*args)
    return got, getattr(_local, "from_peers", 0) - before, time.perf_counter_ns() - began
