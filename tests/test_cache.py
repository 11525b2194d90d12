"""The shard cache: right bytes under concurrency, eviction and failures; budget; one pass over storage."""

import os
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import DEADLINE, wait_for
from shardfs.storage import ram as cache_mod
from shardfs.storage.memory import parse_size
from shardfs.storage.ram import ShardCache
from shardfs.storage.base import ShardIOError
from shardfs.storage.buffers import footprint
from shardfs.storage.local import LocalShard as Shard

MB = 1 << 20


@pytest.fixture
def shard_files(tmp_path):
    """Five 'shards' of random bytes, 9.5 MiB each (3 chunks of 4 MiB and a tail)."""
    rng = random.Random(3)
    out = []
    for i in range(5):
        path = tmp_path / f"s{i}.tar"  # raw bytes; the cache never parses them
        path.write_bytes(rng.randbytes(9 * MB + MB // 2))
        out.append(path)
    return out


def _shards(paths):
    return [Shard(str(p), os.path.getsize(p), os.stat(p).st_mtime_ns) for p in paths]


def _ranges(sizes, count, seed=0, max_len=600_000):
    rng = random.Random(seed)
    for _ in range(count):
        s = rng.randrange(len(sizes))
        off = rng.randrange(sizes[s])
        yield s, off, min(rng.randrange(1, max_len), sizes[s] - off)


def test_concurrent_readers_of_uncached_shards_get_right_bytes_and_one_pass(shard_files):
    data = [p.read_bytes() for p in shard_files]
    shards = _shards(shard_files)
    cache = ShardCache(shards, budget=1 << 30)
    try:
        def check(job):
            s, off, n = job
            assert cache.fetch(shards[s], off, n) == data[s][off : off + n]

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(check, _ranges([len(d) for d in data], 2000)))
        snap = cache.snapshot()
        assert snap["storage_bytes_read"] <= sum(map(len, data))  # every chunk read at most once
        assert snap["direct_reads"] == 0 and snap["used_bytes"] == sum(footprint(len(d)) for d in data)
        assert snap["hits"] + snap["misses"] == 2000
    finally:
        cache.close()


def test_touched_shards_are_loaded_whole_in_the_background(shard_files):
    shards = _shards(shard_files)
    cache = ShardCache(shards, budget=1 << 30)
    try:
        cache.fetch(shards[2], 100, 10)
        wait_for(lambda: cache.snapshot()["shards_cached"] == 1, cache.snapshot)
        snap = cache.snapshot()
        assert snap["shards_cached"] == 1 and snap["storage_bytes_read"] == os.path.getsize(shard_files[2])
        before = snap["storage_bytes_read"]
        assert cache.fetch(shards[2], 5 * MB, 1000) == shard_files[2].read_bytes()[5 * MB : 5 * MB + 1000]
        assert cache.snapshot()["storage_bytes_read"] == before  # served from RAM
    finally:
        cache.close()


def test_prefetch_all_streams_everything_that_fits(shard_files):
    size = os.path.getsize(shard_files[0])
    cache = ShardCache(_shards(shard_files), budget=3 * footprint(size), prefetch="all")  # what 3 cost
    try:
        wait_for(lambda: cache.snapshot()["shards_cached"] == 3, cache.snapshot)
        snap = cache.snapshot()
        assert snap["shards_cached"] == 3 and snap["used_bytes"] == 3 * footprint(size) <= snap["budget_bytes"]
        assert snap["storage_bytes_read"] == 3 * size
    finally:
        cache.close()


def test_small_budget_never_thrashes_and_stays_within_budget(shard_files):
    data = [p.read_bytes() for p in shard_files]
    total = sum(map(len, data))
    budget = total // 4 + 1
    shards = _shards(shard_files)
    cache = ShardCache(shards, budget=budget, idle_evict=3600)
    try:
        for epoch in range(3):
            before = cache.snapshot()["storage_bytes_read"]
            order = list(range(0, len(data[0]), 64 * 1024))
            random.Random(epoch).shuffle(order)
            for off in order:  # an "epoch": every 64 KiB piece of every shard once, in random order
                for s in range(len(data)):
                    n = min(64 * 1024, len(data[s]) - off)
                    assert cache.fetch(shards[s], off, n) == data[s][off : off + n]
                assert cache.snapshot()["used_bytes"] <= budget
            read = cache.snapshot()["storage_bytes_read"] - before
            assert read <= total, f"epoch {epoch} read {read / total:.2f}x the dataset"
        snap = cache.snapshot()
        assert snap["shards_evicted"] == 0 and snap["direct_reads"] > 0
    finally:
        cache.close()


def test_eviction_while_reads_are_in_flight(shard_files):
    data = [p.read_bytes() for p in shard_files]
    # Budget for two shards, evict anything idle: constant churn between five shards.
    shards = _shards(shard_files)
    cache = ShardCache(shards, budget=2 * footprint(len(data[0])), idle_evict=0.0)
    try:
        def check(job):
            s, off, n = job
            assert cache.fetch(shards[s], off, n) == data[s][off : off + n]

        with ThreadPoolExecutor(12) as pool:
            list(pool.map(check, _ranges([len(d) for d in data], 3000, seed=5)))
        assert cache.snapshot()["used_bytes"] <= 2 * footprint(len(data[0]))
    finally:
        cache.close()
    # One reader at a time on a fresh cache: the third shard's admission evicts the idle first one.
    cache = ShardCache(shards, budget=2 * footprint(len(data[0])), idle_evict=0.0)
    try:
        for s in range(3):
            assert cache.fetch(shards[s], 0, 100) == data[s][:100]
            # a shard being loaded is busy, never evicted: let the load finish
            wait_for(lambda: not cache.snapshot()["shards_loading"], cache.snapshot)
        assert cache.snapshot()["shards_evicted"] == 1 and shards[0] not in cache.resident
    finally:
        cache.close()


def test_shard_truncated_under_the_cache_gives_eio_never_wrong_bytes(shard_files):
    data = [p.read_bytes() for p in shard_files]
    shards = _shards(shard_files)
    cache = ShardCache(shards, budget=1 << 30)
    try:
        shards[1].fd()  # opened and checked against its index, as at the first read
        with open(shard_files[1], "r+b") as f:
            f.truncate(5 * MB)  # then truncated: the load fails halfway

        def read(job):
            s, off, n = job
            try:
                got = cache.fetch(shards[s], off, n)
            except ShardIOError:
                return "eio"
            assert got == data[s][off : off + n]
            return "ok"

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(read, [(1, off, 4096) for off in range(0, len(data[1]) - 4096, 100_000)]))
        assert "eio" in results
        assert cache.fetch(shards[0], 7 * MB, 100) == data[0][7 * MB : 7 * MB + 100]  # others keep serving
        assert shards[1].broken
    finally:
        cache.close()


def test_demanded_loads_go_before_prefetch():
    order, taken, gate, done = [], threading.Event(), threading.Event(), threading.Event()

    def load(shard, priority):
        taken.set()
        assert gate.wait(DEADLINE)
        order.append(shard)
        if len(order) == 5:
            done.set()

    queue = cache_mod.LoadQueue(1, load)  # shards stand for themselves here: any hashable key works
    try:
        queue.put(0, cache_mod.PRIORITY_PREFETCH)
        assert taken.wait(DEADLINE)  # the only worker holds shard 0: the others queue behind it
        for s in (1, 2, 3):
            queue.put(s, cache_mod.PRIORITY_PREFETCH)
        queue.put(3, cache_mod.PRIORITY_DEMAND)
        queue.put(4, cache_mod.PRIORITY_DEMAND)
        gate.set()
        assert done.wait(DEADLINE), order
        assert order == [0, 3, 4, 1, 2]
    finally:
        gate.set()
        queue.stop()


@pytest.mark.parametrize("text,expected", [
    ("64G", 64 << 30), ("512M", 512 << 20), ("1.5T", int(1.5 * (1 << 40))), ("1000", 1000), ("2GiB", 2 << 30),
    ("50%", 500),
])
def test_parse_size(text, expected):
    assert parse_size(text, room=1000) == expected


@pytest.mark.parametrize("text", ["", "lots", "-1G", "150%", "0%", "5X"])
def test_parse_size_refuses(text):
    with pytest.raises(ValueError):
        parse_size(text, room=1000)
