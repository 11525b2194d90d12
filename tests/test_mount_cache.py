"""The cache seen through a real mount: many reader processes, a budget smaller than the data."""

import hashlib
import io
import multiprocessing
import os
import random
import tarfile

import pytest

from conftest import needs_fuse, wait_for

pytestmark = needs_fuse


@pytest.fixture
def varied_shards(tmp_path):
    """60 files of 10 KB..1.5 MB of random bytes in 4 tar shards; returns (dir, {path: sha256}, bytes)."""
    rng = random.Random(11)
    out = tmp_path / "shards"
    out.mkdir()
    digests = {}
    for s in range(4):
        with tarfile.open(out / f"part-{s:02d}.tar", "w") as tf:
            for i in range(15):
                data = rng.randbytes(rng.randrange(10_000, 1_500_000))
                name = f"c{i % 3}/f{s}_{i}.bin"
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
                digests[name] = hashlib.sha256(data).hexdigest()
    total = sum(os.path.getsize(p) for p in out.iterdir())
    return out, digests, total


def _read_and_hash(args):
    root, names, seed = args
    random.Random(seed).shuffle(names)
    out = {}
    for name in names:
        path = os.path.join(root, name)
        with open(path, "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # next epoch reaches the daemon again
    return out


def _epoch(root, digests, readers=4, seed=0):
    names = sorted(digests)
    with multiprocessing.get_context("spawn").Pool(readers) as pool:
        # every reader reads every file: the same uncached shards from several processes at once
        results = pool.map(_read_and_hash, [(root, list(names), seed + r) for r in range(readers)])
    for result in results:
        assert result == digests


def test_budget_holds_dataset_second_epoch_reads_nothing_from_storage(varied_shards, mount):
    shards, digests, total = varied_shards
    m = mount(shards, options=("--cache-size", str(2 * total)))
    _epoch(m.path, digests)
    first = m.stats()["cache"]
    assert first["storage_bytes_read"] <= 1.05 * total
    _epoch(m.path, digests, seed=10)
    second = m.stats()
    assert second["cache"]["storage_bytes_read"] == first["storage_bytes_read"]
    assert second["cache"]["direct_reads"] == 0 and second["read_errors"] == 0
    assert second["bytes_served"] >= 2 * sum(len(d) for d in digests)  # both epochs reached the daemon


def test_quarter_budget_reads_at_most_one_pass_per_epoch(varied_shards, mount):
    shards, digests, total = varied_shards
    budget = total // 4
    m = mount(shards, options=("--cache-size", str(budget)))
    for epoch in range(2):
        before = m.stats()["cache"]["storage_bytes_read"]
        names = sorted(digests)
        random.Random(epoch).shuffle(names)
        result = _read_and_hash((m.path, names, epoch))
        assert result == digests
        cache = m.stats()["cache"]
        assert cache["used_bytes"] <= budget
        read = cache["storage_bytes_read"] - before
        assert read <= total, f"epoch {epoch}: {read / total:.2f}x the dataset from storage"
    assert m.stats()["cache"]["direct_reads"] > 0
    assert "cache budget" in m.log()


def test_prefetch_all_loads_every_shard_at_mount(varied_shards, mount):
    shards, digests, total = varied_shards
    m = mount(shards, options=("--prefetch", "all", "--cache-size", "1G"))
    wait_for(lambda: m.stats()["cache"]["shards_cached"] == 4, lambda: m.stats()["cache"])
    cache = m.stats()["cache"]
    # (kept as their index builds read them, storage/buildfill.py: one pass over storage in all)
    read = cache["storage_bytes_read"]
    assert cache["shards_cached"] == 4 and read == cache["build_bytes_read"] and total <= read <= 1.05 * total
    _epoch(m.path, digests, readers=2)
    assert m.stats()["cache"]["storage_bytes_read"] == read
