"""Readers' own storage reads before background ones (RAM loads, disk-tier fills).

Storage serves requests in about the order they come, within what it allows per interval (a
blkio cap gives a budget per 100 ms slice; a busy server, a queue). A reader's read of the chunk it
waits for (a demand read) then waits behind every background request sent before it: with the
background keeping storage saturated, each one waits most of a slice, and in a random-order first
epoch the readers read most files only after storage has served the whole pass
(``tools/bench_tier.py --sweep`` reports the share read by then). Leaving the pass to the
readers' own reads alone was tried by hand: the readers kept up, but the pass itself slowed by
about a fifth (more, smaller requests).

So while readers wait, the background gets one request of at most ``SHORT_RUN`` chunks per demand
read that ended (and never two at once): demand and background take turns at the storage, which
stays busy. Once no reader has waited for ``QUIET_S``, up to ``background`` requests of full runs
run at once (few large requests: what storage does best).
"""

from __future__ import annotations

import contextlib
import threading
import time

SHORT_RUN = 4  # chunks per background request while readers wait
QUIET_S = 0.1  # readers waited this long ago or less: they are still reading what is not loaded


class ReadersFirst:
    def __init__(self, background: int, clock=time.monotonic):
        """``clock``: seconds, for when readers last waited (tests move their own)."""
        self.limit, self._clock = max(1, background), clock
        self._cv = threading.Condition()
        self._demand = 0
        self._demand_ended = float("-inf")
        self._running = 0
        self._turns = 0  # background requests owed while readers wait: one per demand read ended

    @contextlib.contextmanager
    def demand(self):
        """Around a read (or a wait for one) a reader needs now."""
        with self._cv:
            self._demand += 1
        try:
            yield
        finally:
            with self._cv:
                self._demand -= 1
                self._demand_ended = self._clock()
                self._turns = min(self._turns + 1, self.limit)
                self._cv.notify_all()

    def _busy(self) -> bool:
        return self._demand > 0 or self._clock() - self._demand_ended < QUIET_S

    @contextlib.contextmanager
    def background(self, run: int):
        """A turn for one background request of up to ``run`` chunks: yields how many it may read.
        Take it before claiming the chunks, so that no reader waits for chunks whose read is
        itself still waiting for a turn."""
        with self._cv:
            while True:
                busy = self._busy()
                if not busy and self._running < self.limit:
                    break
                if busy and self._turns > 0 and self._running == 0:
                    self._turns -= 1
                    break
                # Readers stop waiting without a signal: look again once they may have.
                self._cv.wait(timeout=QUIET_S if busy else None)
            self._running += 1
        try:
            yield min(run, SHORT_RUN) if busy else run
        finally:
            with self._cv:
                self._running -= 1
                self._cv.notify_all()
