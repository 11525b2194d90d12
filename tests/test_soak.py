"""Daemon threads and memory stay flat under bursts of requests wider than its worker pool (tools/soak.py)."""

from __future__ import annotations

import os
import sys

import pytest

from conftest import needs_fuse
from shardfs.service.daemon import MAX_THREADS

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import soak  # noqa: E402

OTHER_THREADS = 8  # main, signals, notifier, cache loaders: never more than a handful


def _check_flat(samples: list[dict], rss_growth_bound: int) -> None:
    first, last = samples[1], samples[-1]
    tids = set().union(*(s["tids"] for s in samples))
    # A pool that shrinks between bursts makes new workers for each one: thread ids keep changing.
    assert len(tids) <= MAX_THREADS + OTHER_THREADS, f"{len(tids)} thread ids seen: workers are being re-created"
    assert max(s["threads"] for s in samples) <= MAX_THREADS + OTHER_THREADS
    assert last["rss"] - first["rss"] <= rss_growth_bound, \
        f"RSS grew {(last['rss'] - first['rss']) / 2**20:.1f} MiB after the first burst"


@needs_fuse
def test_bursts_keep_threads_and_rss_flat(tar_shards, mount):
    m = mount(tar_shards)
    samples = soak.soak(m.path, requests=40_000, width=3 * MAX_THREADS, per_thread=50)
    assert samples[-1]["requests"] >= 40_000
    _check_flat(samples, rss_growth_bound=4 << 20)


@pytest.mark.slow
@needs_fuse
def test_million_requests_keep_threads_and_rss_flat(tar_shards, mount):
    m = mount(tar_shards)
    samples = soak.soak(m.path, requests=1_000_000, width=3 * MAX_THREADS, per_thread=100)
    assert samples[-1]["requests"] >= 1_000_000
    _check_flat(samples, rss_growth_bound=8 << 20)
