"""The disk tier's parts without a mount: the cache file format, the tier on real files, placement."""

import os
import random
import subprocess
import sys
import tempfile
import time

import pytest

from shardfs.storage import placement, ram, tierfile
from shardfs.storage.disk import DiskTier
from shardfs.storage.local import LocalShard
from shardfs.storage.placement import filesystem_type, is_local_disk, job_scratch_tier


def make_shard(path, size: int, seed: int = 0) -> bytes:
    data = random.Random(seed).randbytes(size)
    path.write_bytes(data)
    return data


def open_shard(path) -> LocalShard:
    st = os.stat(path)
    return LocalShard(str(path), st.st_size, st.st_mtime_ns)


def test_a_tier_chunk_is_a_ram_chunk():
    assert tierfile.CHUNK == ram.CHUNK and tierfile.CHUNK % tierfile.BLOCK == 0


def test_reads_through_the_tier_are_the_shards_bytes_and_fill_it(tmp_path):
    data = make_shard(tmp_path / "a.tar", 5 * tierfile.CHUNK + 12345)
    shard = open_shard(tmp_path / "a.tar")
    tier = DiskTier(str(tmp_path / "tier"), "1G")
    try:
        rng = random.Random(1)
        for _ in range(200):
            offset = rng.randrange(len(data))
            length = rng.randrange(1, 300_000)
            assert tier.pread(shard, offset, length) == data[offset : offset + length]
        tier._fills.shutdown(wait=True)  # the background fill ends
        snap = tier.snapshot()
        assert snap["bytes_written"] == len(data) and snap["storage_bytes_read"] <= len(data) + 200 * 300_000
        assert tier.storage_counts()["storage_bytes_read"] == snap["storage_bytes_read"]
    finally:
        tier.close()
    [entry] = tierfile.describe(str(tmp_path / "tier"))
    assert entry.filled == entry.size == len(data) and not entry.in_use


def test_a_second_tier_reads_nothing_from_storage_and_checks_every_block(tmp_path):
    data = make_shard(tmp_path / "a.tar", 3 * tierfile.CHUNK)
    shard = open_shard(tmp_path / "a.tar")
    first = DiskTier(str(tmp_path / "tier"), "1G")
    buf = memoryview(bytearray(len(data)))
    first.read_into(shard, buf, 0, len(data))
    first.close()
    [entry] = tierfile.describe(str(tmp_path / "tier"))
    fd = os.open(entry.path, os.O_RDWR)
    data_at = tierfile.TierFile(fd, entry.path, tierfile.read_header(fd)).data_at
    os.pwrite(fd, b"\xff", data_at + tierfile.CHUNK + 5 * tierfile.BLOCK + 7)  # chunk 1, block 5
    os.close(fd)

    second = DiskTier(str(tmp_path / "tier"), "1G")
    try:
        assert second.pread(shard, 0, tierfile.CHUNK) == data[: tierfile.CHUNK]
        assert second.storage_counts()["storage_bytes_read"] == 0
        out = memoryview(bytearray(len(data)))
        second.read_into(shard, out, 0, len(data))
        assert bytes(out) == data
        snap = second.snapshot()
        assert snap["checksum_failures"] == 1 and snap["storage_bytes_read"] == tierfile.CHUNK
    finally:
        second.close()


def test_bounded_lru_of_idle_files_and_no_thrash(tmp_path):
    size = tierfile.CHUNK  # one chunk, written by the read itself: no fill moves the LRU clock later
    shards = []
    for i in range(4):
        make_shard(tmp_path / f"{i}.tar", size, seed=i)
        shards.append(open_shard(tmp_path / f"{i}.tar"))
    bound = 2 * (size + 8192)  # two shards and their headers
    tier = DiskTier(str(tmp_path / "tier"), str(bound))
    try:
        for shard in shards:
            tier.pread(shard, 0, 100)
        snap = tier.snapshot()
        # ours are open: nothing to evict, so the last two are read directly, not cached
        assert snap["shards"] == 2 and snap["shards_refused"] == 2 and snap["shards_evicted"] == 0
    finally:
        tier.close()
    now = time.time()
    for age, cached in zip((200, 100), sorted(tierfile.describe(str(tmp_path / "tier")), key=lambda c: c.source)):
        os.utime(cached.path, (now - age, now - age))  # shard 0 used longest ago
    later = DiskTier(str(tmp_path / "tier"), str(bound))
    try:
        later.pread(shards[3], 0, 100)  # makes room by removing the least recently used idle file
        snap = later.snapshot()
        assert snap["shards"] == 2 and snap["shards_evicted"] == 1
        sources = {c.source for c in tierfile.describe(str(tmp_path / "tier"))}
        assert sources == {shards[1].path, shards[3].path}
    finally:
        later.close()


def test_tier_directory_is_private_and_refused_when_not_ours(tmp_path):
    DiskTier(str(tmp_path / "tier"), "1G").close()
    assert os.stat(tmp_path / "tier").st_mode & 0o777 == 0o700
    if os.geteuid() == 0:
        os.chown(tmp_path / "tier", 12345, 12345)
        with pytest.raises(PermissionError):
            DiskTier(str(tmp_path / "tier"), "1G")


def test_placement_only_on_local_block_filesystems(tmp_path):
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        "30 22 0:40 / /scratch rw - lustre 10.0.0.1@tcp:/fs rw\n"
        "31 30 259:1 / /scratch/local rw - xfs /dev/nvme0n1 rw\n")
    assert filesystem_type("/scratch/x", str(mountinfo)) == "lustre"
    assert filesystem_type("/scratch/local/job", str(mountinfo)) == "xfs"
    assert filesystem_type("/home/u", str(mountinfo)) == "ext4"
    assert not is_local_disk("/proc")
    assert not is_local_disk(str(tmp_path / "missing"))


@pytest.mark.skipif(not is_local_disk(tempfile.gettempdir()) or filesystem_type("/dev/shm") != "tmpfs",
                    reason="needs the temporary directory on a local disk and /dev/shm in RAM (tmpfs)")
def test_the_tier_goes_to_the_first_local_scratch(tmp_path, monkeypatch):
    tier = f"shardfs-cache-{os.getuid()}"
    monkeypatch.setattr(placement, "SCRATCH_DIRS", ())  # the node has neither /local nor /scratch/local
    assert job_scratch_tier({"TMPDIR": str(tmp_path)}) == str(tmp_path / tier)
    assert job_scratch_tier({"SLURM_TMPDIR": str(tmp_path), "TMPDIR": "/dev/shm"}) == str(tmp_path / tier)
    assert job_scratch_tier({"TMPDIR": "/dev/shm"}) is None  # RAM: no tier at all rather than one there
    assert job_scratch_tier({}) is None
    monkeypatch.setattr(placement, "SCRATCH_DIRS", ("/dev/shm", str(tmp_path)))  # as /local, /scratch/local
    assert job_scratch_tier({"TMPDIR": "/dev/shm"}) == str(tmp_path / tier)  # RAM passed over


def test_a_filler_that_stalls_is_taken_over(tmp_path):
    """Another process holds a shard's fill lock but fills nothing: we fill it ourselves."""
    data = make_shard(tmp_path / "a.tar", 3 * tierfile.CHUNK)
    shard = open_shard(tmp_path / "a.tar")
    tierfile.prepare_dir(str(tmp_path / "tier"))
    made = tierfile.TierFile.open_or_create(str(tmp_path / "tier"), tierfile.identity(shard))
    made.close()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); "
         "fcntl.lockf(fd, fcntl.LOCK_EX, 1, 0); print('locked', flush=True); time.sleep(120)", made.path],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        tier = DiskTier(str(tmp_path / "tier"), "1G")
        try:
            assert tier.pread(shard, 5, 2 * tierfile.CHUNK) == data[5 : 5 + 2 * tierfile.CHUNK]
            assert tier.snapshot()["bytes_written"] >= 2 * tierfile.CHUNK
        finally:
            tier.close()
    finally:
        holder.kill()
        holder.wait()


def test_a_path_too_long_for_a_header_is_read_directly(tmp_path):
    data = make_shard(tmp_path / "a.tar", 3000)
    shard = open_shard(tmp_path / "a.tar")
    shard.fd()  # opened now: the bytes still come from the file when its path is renamed below
    shard.path = "/" + "x" * 5000  # as a URL of that length would be
    tier = DiskTier(str(tmp_path / "tier"), "1G")
    try:
        assert tier.pread(shard, 10, 100) == data[10:110]
        assert tier.snapshot()["shards"] == 0 and not tier.disabled
    finally:
        tier.close()
