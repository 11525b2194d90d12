"""Every read that reaches storage ends within a bound: its bytes, or EIO.

A store that stops answering, or a network or FUSE filesystem that hangs (a ``pread`` there
blocks uninterruptibly), must not hold FUSE workers for minutes: once every worker waits,
nothing else answers (cached files, listings, the watchdog's statfs) and systemd kills the
daemon. So:

* A storage read gets ``TIMEOUT`` seconds (30 s; ``SHARDFS_STORAGE_TIMEOUT``) in all, retries
  included (remote: each attempt also gives up after ``remote.backends`` connect/read timeouts).
  A read that runs out answers EIO; the next read of the same bytes tries again.
* Local files are read on a small pool of threads (``LocalPool``); the caller waits at most
  ``TIMEOUT`` for its answer. A thread stuck in the kernel stays stuck, but only pool threads
  ever are, never the FUSE workers.
* A place (a remote host or bucket, a local directory) where a read ran out of time is
  *not answering*: its reads answer EIO at once instead of each waiting ``TIMEOUT``, except one
  probe every ``COOLDOWN`` seconds (local: while fewer than ``MAX_STUCK`` of its reads are stuck).
  It answers again when a probe or a stuck read gets an answer, and is logged both times.

Reads served from the RAM cache never come here.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout

from shardfs.errors import ShardfsError
from shardfs.storage.threads import DaemonPool

log = logging.getLogger(__name__)

TIMEOUT = float(os.environ.get("SHARDFS_STORAGE_TIMEOUT", "30"))
COOLDOWN = 5.0  # between probes of a place that is not answering
MAX_STUCK = 2  # local reads of one place left running after their deadline, beyond which it is not probed
LOCAL_THREADS = 16  # pool threads for local storage reads (the most that can ever be stuck)


class NotAnswering(ShardfsError, TimeoutError):
    """Storage gave no answer within the bound (or is known not to be answering)."""


class Place:
    """One place's health: a remote host or bucket, or a local directory of shards."""

    def __init__(self, name: str):
        self.name = name
        self.down_since: float | None = None
        self.next_probe = 0.0
        self.stuck = 0
        self._lock = threading.Lock()

    def admit(self) -> None:
        """Go ahead, or NotAnswering at once while the place is down (bar one probe now and then)."""
        with self._lock:
            if self.down_since is None:
                return
            now = time.monotonic()
            if now < self.next_probe or self.stuck >= MAX_STUCK:
                raise NotAnswering(f"{self.name}: not answering for {now - self.down_since:.0f} s "
                                   f"(no answer within {TIMEOUT:.0f} s); EIO until it does")
            self.next_probe = now + COOLDOWN + TIMEOUT  # this caller is the probe

    def timed_out(self) -> None:
        with self._lock:
            now = time.monotonic()
            self.next_probe = now + COOLDOWN
            if self.down_since is None:
                self.down_since = now
                log.error("%s: no answer within %.0f s; its reads answer EIO at once until it answers "
                          "again (probed every %.0f s)", self.name, TIMEOUT, COOLDOWN)

    def answered(self) -> None:
        if self.down_since is None:  # the usual case: no lock
            return
        with self._lock:
            if self.down_since is not None:
                log.warning("%s: answers again after %.0f s", self.name, time.monotonic() - self.down_since)
                self.down_since = None


_places: dict[str, Place] = {}
_places_lock = threading.Lock()


def place(name: str) -> Place:
    found = _places.get(name)
    if found is None:
        with _places_lock:
            found = _places.setdefault(name, Place(name))
    return found


class LocalPool:
    """Runs blocking calls on local files (open, fstat, pread, stat) on a few threads, and waits
    for each at most ``TIMEOUT``. Daemon threads (``threads.DaemonPool``): a thread stuck on a
    hung mount must never keep the daemon from exiting."""

    def __init__(self, threads: int = LOCAL_THREADS):
        self._size = threads
        self._pool = DaemonPool(threads, "shardfs-storage")

    def run(self, where: Place, fn, *args, timeout: float | None = None):
        """``fn(*args)``'s result or exception; NotAnswering if it takes longer than ``timeout``."""
        where.admit()
        future = self._pool.submit(fn, *args)
        try:
            result = future.result(timeout=TIMEOUT if timeout is None else timeout)
        except FutureTimeout:
            if not future.cancel():  # it is running, stuck in the kernel: it counts until it returns
                with where._lock:
                    where.stuck += 1
                future.add_done_callback(lambda _f: _unstuck(where))
            where.timed_out()
            raise NotAnswering(f"{where.name}: no answer within {TIMEOUT:.0f} s") from None
        except OSError:
            where.answered()  # an error is an answer
            raise
        where.answered()
        return result

    def _after_fork(self) -> None:
        """A forked child (an index worker) has none of the parent's threads: start afresh."""
        self._pool = DaemonPool(self._size, "shardfs-storage")


def _unstuck(where: Place) -> None:
    with where._lock:
        where.stuck -= 1
    where.answered()


local_pool = LocalPool()


def _after_fork() -> None:
    global _places_lock
    _places.clear()  # (places hold locks another thread of the parent may have held)
    _places_lock = threading.Lock()
    local_pool._after_fork()


os.register_at_fork(after_in_child=_after_fork)
