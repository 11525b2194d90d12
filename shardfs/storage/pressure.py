"""Give cache memory back when the node or the job's cgroup runs short; take it again later.

Once a ``interval`` (1 s) a thread measures the **headroom**: the node's MemAvailable, or
what the tightest memory cgroup above us leaves (limit - usage, counting its inactive file
cache as free: the kernel drops that before it OOM-kills), whichever is smaller. Memory is
short when the headroom is below ``low`` water, or when the kernel is already struggling
(memory PSI ``some avg10`` at or above ``PSI_LIMIT`` %, from the cgroup's own
``memory.pressure`` on v2, else ``/proc/pressure/memory``; or a cgroup hitting its limit:
v2 ``memory.events`` max, v1 ``memory.failcnt``) while the headroom is below ``high`` water.
Those signals alone are not enough: they also count stalls of other jobs and the reclaim
of page cache that any reading job causes.

Then the cache budget shrinks (least recently used shards evicted) so that the headroom
gets back to ``high`` water, and at least a quarter of what is cached goes. It grows back
only after ``calm`` seconds without shortage, and only as far as would still leave twice
``high`` water free, so shrinking and growing do not take turns.
"""

from __future__ import annotations

import logging
import threading
import time

from shardfs.storage.memory import MemoryCgroup, meminfo, memory_cgroups

log = logging.getLogger(__name__)

PSI_LIMIT = 10.0  # % of the last 10 s in which some task waited for memory
MiB = 1 << 20


def psi_some_avg10(path: str) -> float | None:
    try:
        with open(path) as f:
            for line in f:
                kind, *fields = line.split()
                if kind == "some":
                    return float(dict(field.split("=") for field in fields)["avg10"])
    except (OSError, ValueError, KeyError):
        pass
    return None


def limit_hits(group: MemoryCgroup) -> int:
    """How often the cgroup's usage reached its limit so far."""
    try:
        if group.v2:
            events = dict(line.split() for line in group.read("memory.events").splitlines())
            return int(events.get("max", 0))
        return int(group.read("memory.failcnt"))
    except (OSError, ValueError):
        return 0


class PressureWatcher:
    def __init__(self, cache, interval: float = 1.0, calm: float = 10.0, proc_root: str = "/proc"):
        """``cache`` has ``budget``, ``snapshot()["used_bytes"]`` and ``resize(budget)``.
        ``proc_root`` is where /proc is read (a test lays out another node's /proc and cgroups)."""
        self.cache, self.interval, self.calm, self.proc_root = cache, interval, calm, proc_root
        self.configured = cache.budget
        self.groups = memory_cgroups(proc_root)
        bound = min([g.limit for g in self.groups] + [meminfo("MemTotal", proc_root)])
        # 1/16 of the limit, at least 128 MiB, but at most 1/8 of a small limit: with
        # --mem=300M the default budget (half the room) must fit with headroom to spare.
        self.low = max(bound // 16, min(128 * MiB, bound // 8))
        self.high = 2 * self.low
        v2 = [g for g in self.groups if g.v2]
        self.psi_file = f"{v2[0].folder}/memory.pressure" if v2 else f"{proc_root}/pressure/memory"
        self.hits = [limit_hits(g) for g in self.groups]
        self.last_short = 0.0
        self.counts = {"shrinks": 0, "grows": 0}
        self.short = False
        self.headroom = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shardfs-pressure", daemon=True)

    def start(self) -> None:
        log.info("memory watch: shrink the cache below %d MiB headroom, grow back above %d MiB (%s)",
                 self.low >> 20, 2 * self.high >> 20,
                 ", ".join(g.limit_file for g in self.groups) or "node MemAvailable")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception:  # the watcher must outlive anything odd in /proc or /sys
                log.exception("memory watch failed a check")

    def _measure(self) -> tuple[int, str]:
        available = meminfo("MemAvailable", self.proc_root)
        headroom, where = available, "node MemAvailable"
        for group in self.groups:
            try:
                left = group.left(reclaimable=True)
            except (OSError, ValueError):
                continue
            if left < headroom:
                headroom, where = left, group.limit_file
        return headroom, where

    def _struggling(self) -> str | None:
        """What says the kernel is reclaiming hard right now, if anything."""
        psi = psi_some_avg10(self.psi_file)
        hits = [limit_hits(g) for g in self.groups]
        grown = [g.limit_file for g, new, old in zip(self.groups, hits, self.hits) if new > old]
        self.hits = hits
        if grown:
            return f"limit reached ({grown[0]})"
        if psi is not None and psi >= PSI_LIMIT:
            return f"memory PSI some avg10={psi:.0f}%"
        return None

    def check(self) -> None:
        """One measurement, and a shrink or a grow if it calls for one."""
        headroom, where = self._measure()
        self.headroom = headroom
        struggling = self._struggling()
        now = time.monotonic()
        used, budget = self.cache.snapshot()["used_bytes"], self.cache.budget
        self.short = headroom < self.low or (struggling is not None and headroom < self.high)
        if self.short:
            self.last_short = now
            release = max(self.high - headroom, used // 4)
            target = max(0, min(budget, used) - release)
            if target < budget:
                self.cache.resize(target)
                self.counts["shrinks"] += 1
                log.warning("memory short (%d MiB left, %s%s): cache budget %d -> %d MiB",
                            headroom >> 20, where, f"; {struggling}" if struggling else "",
                            budget >> 20, target >> 20)
            return
        if budget >= self.configured or now - self.last_short < self.calm:
            return
        target = min(self.configured, used + headroom - 2 * self.high)
        if target > budget:
            self.cache.resize(target)
            self.counts["grows"] += 1
            log.info("memory calm (%d MiB left, %s): cache budget %d -> %d MiB of %d",
                     headroom >> 20, where, budget >> 20, target >> 20, self.configured >> 20)

    def figures(self) -> dict:
        budget = self.cache.budget
        state = "short" if self.short else "calm" if budget >= self.configured else "recovering"
        return {"budget_configured_bytes": self.configured, "budget_bytes": budget,
                "headroom_bytes": self.headroom, "state": state, **self.counts}
