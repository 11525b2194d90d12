"""One pass that indexes and fills (storage/buildfill.py, issue 31): a first mount's index build
keeps what it reads in the disk tier and in RAM, so the first epoch reads nothing from storage
(counted); a shard that changes during its build, or a build cut short by a stop, leaves nothing
of it trusted in either. Real mounts and daemons; every read checked by sha256 against the source."""

import hashlib
import os
import signal
import subprocess
import sys
import threading

import pytest

from benchlib.cli import REPO
from conftest import needs_fuse, wait_for
from faulty_storage import held
from remote_servers import nginx  # noqa: F401 (a fixture)
from test_disk_tier import (BIG_RAM, SMALL_RAM, cached, hanging_storage, options, read_all, storage_bytes,
                            tar_bytes, write_shards)
from test_index_build import _ChangesAfterItsFirstRead, _alive, _tiny_members_shard
from shardfs.formats import tar
from shardfs.index import store
from shardfs.storage.buildfill import Chunks, Keeper
from shardfs.storage.disk import DiskTier
from shardfs.storage.ram import ShardCache
from shardfs.storage.tierfile import CHUNK, describe
from shardfs.view import dataset


@pytest.fixture
def shards(tmp_path):
    out = tmp_path / "shards"
    digests = write_shards(out, seed=11, shards=3)
    return out, digests, tar_bytes(out)


def epochs_read_nothing_from_storage(m, digests, count: int = 3) -> None:
    before = storage_bytes(m)
    for seed in range(count):
        read_all(m.path, digests, seed=seed)
        assert storage_bytes(m) == before, f"epoch {seed + 1} read from storage"


@needs_fuse
def test_a_first_mount_with_a_disk_tier_serves_its_epochs_with_no_storage_reads(shards, mount, tmp_path):
    src, digests, total = shards
    tier = tmp_path / "tier"
    m = mount(src, options=options(tier, SMALL_RAM))  # no shard fits in RAM: every read is the tier's
    stats = m.stats()
    built = stats["cache"]["build_bytes_read"]
    assert total <= built <= 1.05 * total and stats["cache"]["storage_bytes_read"] == built
    assert stats["disk"]["bytes_written"] == total and stats["disk"]["shards"] == 3
    assert [c["filled"] for c in cached(tier)] == [c["size"] for c in cached(tier)]
    epochs_read_nothing_from_storage(m, digests)
    assert m.stats()["disk"]["hits"] > 0


@needs_fuse
def test_remote_shards_fill_the_tier_as_their_indexes_are_built(shards, mount, tmp_path, monkeypatch, nginx):
    src, digests, total = shards
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # (their indexes: none yet)
    base, www = nginx
    for p in src.glob("*.tar"):
        os.link(p, www / p.name)
    m = mount(f"{base}/part-{{00..02}}.tar", options=options(tmp_path / "tier", SMALL_RAM))
    stats = m.stats()
    assert total <= stats["cache"]["build_bytes_read"] <= 1.05 * total and stats["disk"]["bytes_written"] == total
    fetched = stats["remote"]["bytes"]
    epochs_read_nothing_from_storage(m, digests, count=1)
    assert m.stats()["remote"]["bytes"] == fetched


@needs_fuse
def test_a_first_mount_that_prefetches_every_shard_keeps_them_in_ram_as_it_indexes(shards, mount, tmp_path):
    src, digests, total = shards
    m = mount(src, options=("--cache-size", BIG_RAM, "--prefetch", "all"))
    cache = m.stats()["cache"]
    assert cache["shards_cached"] == 3 and cache["storage_bytes_read"] == cache["build_bytes_read"] >= total
    assert "3 shards kept in RAM as their indexes were built" in m.log()
    epochs_read_nothing_from_storage(m, digests)


@needs_fuse
@pytest.mark.parametrize("ram", [SMALL_RAM, BIG_RAM])
def test_a_shard_rewritten_during_its_build_leaves_nothing_in_the_tier_or_ram(tmp_path, mount, ram):
    """The build of part-00 is held inside its second 4 MiB read while the file is rewritten in
    place (other members, other bytes, shorter): that read returns part of the new bytes, and finds
    the change. Nothing of part-00 is kept in the tier or RAM; the other shards are served; a
    remount serves the new version, never the old bytes."""
    src, tier, flag = tmp_path / "src", tmp_path / "tier", tmp_path / "hang"
    digests = write_shards(src, seed=3, shards=3)
    assert (src / "part-00.tar").stat().st_size > tar.CHUNK  # a second read, held
    flag.touch()
    with hanging_storage(tmp_path, src, "part-00.tar", flag, start=tar.CHUNK) as storage:
        got = []
        ram_options = options(tier, ram, *(("--prefetch", "all") if ram == BIG_RAM else ()))
        mounting = threading.Thread(target=lambda: got.append(mount(storage, options=ram_options)))
        mounting.start()
        try:
            wait_for(lambda: held(flag), "the build of part-00 held in its second read")
            rewritten = write_shards(tmp_path / "new", seed=6, shards=1, members=6)
            new = (tmp_path / "new" / "part-00.tar").read_bytes()
            # (shorter, as a file cut and rewritten: found by the held read itself, whatever the kernel
            # caches of the file's attributes on the storage's FUSE mount)
            assert tar.CHUNK < len(new) < (src / "part-00.tar").stat().st_size
            with open(src / "part-00.tar", "r+b") as old:
                old.write(new)  # in place: the held read returns the new bytes
                old.truncate()
        finally:
            flag.unlink()
            mounting.join()
        [m] = got
        assert "part-00.tar: cannot read: " in m.log()
        assert sorted(c["source"].rsplit("/", 1)[-1] for c in cached(tier)) == ["part-01.tar", "part-02.tar"]
        stats = m.stats()
        assert stats["files"] == len([n for n in digests if "/f0_" not in n])
        if ram == BIG_RAM:
            assert stats["cache"]["shards_cached"] == 2
        for name in [n for n in digests if "/f0_" in n]:
            assert not os.path.exists(os.path.join(m.path, name))
        read_all(m.path, {n: d for n, d in digests.items() if "/f0_" not in n})
        assert subprocess.run(["fusermount3", "-u", m.path]).returncode == 0

        # (the file was rewritten beside the storage's FUSE mount, not through it: the kernel keeps its
        # old size there until the attribute timeout ends, and a remount before that would find the
        # shard's stat and its open file's disagree)
        wait_for(lambda: os.stat(os.path.join(storage, "part-00.tar")).st_size == len(new),
                 "the storage mount shows part-00's new size")
        again = mount(storage, options=options(tier, ram), name="again")
        others = {n: d for n, d in digests.items() if "/f0_" not in n}
        read_all(again.path, {**others, **rewritten})


def test_a_build_of_a_changing_shard_keeps_nothing_in_the_caches(tmp_path, monkeypatch):
    """As test_index_build's changing shard (rewritten just after the scan's first read), with the
    caches filled as the builds read: the changed shard leaves no tier file and no RAM buffer; the
    other is kept whole in both."""
    changing, other = tmp_path / "changing.tar", tmp_path / "other.tar"
    _tiny_members_shard(changing, 20_000)
    _tiny_members_shard(other, 5_000)
    tier = DiskTier(str(tmp_path / "tier"), "1G")
    cache = ShardCache([], 1 << 30)
    keeper = Keeper(tier, cache, in_ram=True)
    try:
        monkeypatch.setattr(store, "LocalShard", _ChangesAfterItsFirstRead)
        results = dataset.index_shards([str(changing), str(other)], str(tmp_path / "idx"), workers=2,
                                       keep=keeper.reading)
        (_, ix, how), (_, ix2, _) = results
        assert ix is None and "changed since its index was built" in how, how
        assert [(c.source, c.filled) for c in describe(tier.dir)] == [(str(other), other.stat().st_size)]
        view = dataset._open_shard(str(other), ix2)
        assert keeper.adopt([view]) == 1
        assert cache.reserved == len(cache.resident[view].buf)  # the changed shard's buffer given back
        with open(other, "rb") as f:
            assert hashlib.sha256(cache.fetch(view, 0, view.size)).digest() == hashlib.sha256(f.read()).digest()
    finally:
        cache.close()


def test_chunks_are_cut_whole_from_reads_that_follow_one_another():
    size = 5 * CHUNK + 100
    data = os.urandom(size)
    got = {}
    chunks = Chunks(size, lambda i, piece: got.__setitem__(i, bytes(piece)))
    for at, n in [(0, 3000), (1000, 5000), (6000, CHUNK), (6000 + CHUNK, 10),  # overlaps, re-reads
                  (3 * CHUNK + 7, CHUNK),  # a gap: chunk 2 is lost, chunk 3 starts a byte late: lost too
                  (4 * CHUNK - 5, CHUNK + 105)]:  # 4 whole, and the short last one
        chunks(at, data[at : at + n])
    assert sorted(got) == [0, 4, 5]
    assert all(got[i] == data[i * CHUNK : (i + 1) * CHUNK] for i in got)


def part_00(tier) -> list[int]:
    """The bytes filled of each tier file of part-00.tar."""
    return [c["filled"] for c in cached(tier) if c["source"].endswith("part-00.tar")]


@needs_fuse
def test_a_daemon_stopped_during_its_build_exits_and_leaves_no_chunk_trusted(tmp_path, mount):
    """SIGTERM (an unmount by the service, scancel) while a build that fills the tier waits on
    storage: the daemon exits at once; the tier trusts no chunk of the shard under way (its records
    come only once its build is done); the next mount serves every byte right."""
    src, tier, flag = tmp_path / "src", tmp_path / "tier", tmp_path / "hang"
    digests = write_shards(src, seed=9, shards=2)
    total = tar_bytes(src)
    flag.touch()
    with hanging_storage(tmp_path, src, "part-00.tar", flag, start=tar.CHUNK) as storage:
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        daemon = subprocess.Popen([sys.executable, "-m", "shardfs", "mount", str(storage), str(mnt), "-f",
                                   *options(tier, SMALL_RAM), "--log-file", str(tmp_path / "d.log")], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: held(flag) or daemon.poll() is not None, "the build of part-00 held in storage")
            assert daemon.poll() is None, "the daemon ended before its build was held"
            daemon.send_signal(signal.SIGTERM)
            # Its thread inside the held read cannot end before storage answers it (as on a hard NFS
            # mount); the rest of the daemon is gone (a zombie until that thread ends).
            wait_for(lambda: not _alive(daemon.pid), "the daemon to exit")
            assert part_00(tier) == [0]  # its file, made as the build began, and no chunk trusted
        finally:
            if flag.exists():
                flag.unlink()  # (releases the held read first)
            if daemon.poll() is None:
                daemon.kill()
            daemon.wait(timeout=60)
        assert not os.path.ismount(mnt)
        assert part_00(tier) == [0]
        m = mount(storage, options=options(tier, SMALL_RAM))
        read_all(m.path, digests)
        assert storage_bytes(m) <= 1.05 * total + 2 * CHUNK  # (part-01's, if kept before the stop: not read twice)


@needs_fuse
def test_without_prefetch_all_a_first_mount_keeps_nothing_in_ram_before_a_read(shards, mount):
    """The RAM cache keeps the shards readers touch: a build does not fill it by itself (a shard
    rewritten after the mount then answers EIO, as it always did, not the bytes read at mount)."""
    src, digests, total = shards
    m = mount(src, options=("--cache-size", BIG_RAM))
    cache = m.stats()["cache"]
    assert cache["shards_cached"] == 0
    assert "kept in RAM as their indexes were built" not in m.log()
