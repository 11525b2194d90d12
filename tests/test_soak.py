"""Daemon threads and memory stay flat under bursts of requests wider than its worker pool (tools/soak.py)."""

from __future__ import annotations

import pytest

import soak  # tools/soak.py: tools/ is on the tests' path (pyproject.toml)
from conftest import needs_fuse, wait_for
from shardfs.service.daemon import MAX_THREADS


def _soak_stays_flat(m, requests: int, per_thread: int, rss_growth_bound: int) -> None:
    # The thread that saves the view for the next mount (a one-off, once mounted) is not a worker.
    wait_for(lambda: any(line in m.log() for line in ("view saved in", "view mapped from", "could not save the view")),
             "the mount has not saved its view")
    samples = soak.soak(m.path, requests=requests, width=3 * MAX_THREADS, per_thread=per_thread)
    assert samples[-1]["requests"] >= requests
    first, last = samples[1], samples[-1]
    # What the daemon runs besides request workers (main, signals, notifier, cache loaders, the
    # storage pool's threads, as many as the index builds used) is there before the first burst.
    idle = samples[0]["tids"]
    tids = set().union(*(s["tids"] for s in samples))
    # A pool that shrinks between bursts makes new workers for each one: thread ids keep changing.
    assert len(tids) <= len(idle) + MAX_THREADS, f"{len(tids)} thread ids seen: workers are being re-created"
    assert max(s["threads"] for s in samples) <= len(idle) + MAX_THREADS
    assert last["rss"] - first["rss"] <= rss_growth_bound, \
        f"RSS grew {(last['rss'] - first['rss']) / 2**20:.1f} MiB after the first burst"


@needs_fuse
def test_bursts_keep_threads_and_rss_flat(tar_shards, mount):
    _soak_stays_flat(mount(tar_shards), requests=40_000, per_thread=50, rss_growth_bound=4 << 20)


@pytest.mark.slow
@needs_fuse
def test_million_requests_keep_threads_and_rss_flat(tar_shards, mount):
    _soak_stays_flat(mount(tar_shards), requests=1_000_000, per_thread=100, rss_growth_bound=8 << 20)
