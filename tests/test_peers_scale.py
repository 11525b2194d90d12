"""Peers at a larger scale, through real mounts: nodes that start together on unindexed shards
build each index once (the owners build, the others receive); sixteen daemons on 127.0.0.2-17,
each reading its DistributedSampler part, read shared storage about once, and two of them killed
mid-epoch cost the others no wrong byte."""

import contextlib
import hashlib
import os
import signal
import subprocess
import threading

import pytest

from conftest import drop_page_cache, needs_fuse
from test_disk_tier import tar_bytes, write_shards
from test_peers import (addresses, check_all, key_file, member_shard, owned_bytes, owners,  # noqa: F401 - key_file: a fixture
                        wait_for)

from shardfs.index import store
from shardfs.index.shard_index import build
from shardfs.storage.buffers import footprint
from shardfs.storage.local import LocalShard

pytestmark = needs_fuse


@contextlib.contextmanager
def read_only(src, where):
    """``src`` seen read-only at ``where`` (a bind mount), as a project folder one cannot write
    to: indexes cannot be saved beside the shards, each node keeps them in its own index dir."""
    where.mkdir()
    subprocess.run(["mount", "--bind", str(src), str(where)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(where)], check=True)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def start_together(mount, sources, peers: list[str], tmp_path, each=None) -> list:
    """One mount per peer, all started at the same moment (threads), each with its own index dir."""
    made, failed = [None] * len(peers), []

    def start(i):
        try:
            own = each(i, peers[i]) if each else ()
            made[i] = mount(sources, name=f"node{i}", options=(
                "--peers", ",".join(peers), "--peer-self", peers[i], "--index-dir", str(tmp_path / f"idx{i}"), *own))
            made[i].address = peers[i]
        except BaseException as exc:  # noqa: BLE001 - re-raised below, on the test's thread
            failed.append(exc)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(len(peers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]
    return made


def test_nodes_starting_together_build_each_index_once(mount, key_file, tmp_path):
    src = tmp_path / "src"
    digests = write_shards(src, shards=8, members=6, largest=300_000)
    with read_only(src, tmp_path / "project") as shards:
        nodes = start_together(mount, shards, addresses(4), tmp_path)
        figures = [n.stats() for n in nodes]
        # Every shard's index built once, by its owner; every other node received it.
        assert sum(f["indexes_built"] for f in figures) == 8
        for f in figures:
            assert f["indexes_built"] + f["indexes_from_peers"] == 8
            assert f["indexes_built"] == f["peers"]["shards_owned"] == 2  # (8 shards, 4 nodes: 2 each)
            assert f["peers"]["indexes_to_peers"] == 3 * f["indexes_built"]
        for n in nodes:
            assert check_all(n.path, digests) == []
        # Kept where indexes go: a node mounting again finds all eight.
        again = mount(shards, name="again", options=("--index-dir", str(tmp_path / "idx1")))
        assert again.stats()["indexes_built"] == 0 and again.stats()["indexes_from_peers"] == 0
        assert check_all(again.path, digests) == []


def test_an_index_that_does_not_describe_the_shard_is_refused(tmp_path):
    """A peer's index of another shard of the same name, size and mtime (other bytes): its
    fingerprint gives it away."""
    one, two = tmp_path / "one", tmp_path / "two"
    write_shards(one, seed=1, shards=1, members=4, largest=200_000)
    write_shards(two, seed=2, shards=1, members=4, largest=200_000)
    a, b = one / "part-00.tar", two / "part-00.tar"
    with open(b, "r+b") as f:  # the same size as a
        f.truncate(a.stat().st_size)
    os.utime(b, ns=(a.stat().st_atime_ns, a.stat().st_mtime_ns))
    shard = LocalShard(str(b), b.stat().st_size, b.stat().st_mtime_ns)
    try:
        theirs = build(shard)
    finally:
        shard.close()
    assert "fingerprint" in store.received_describes(theirs, str(a))
    shard = LocalShard(str(a), a.stat().st_size, a.stat().st_mtime_ns)
    try:
        assert store.received_describes(build(shard), str(a)) is None
    finally:
        shard.close()


def distributed_part(names: list[str], nodes: int, rank: int, epoch: int) -> list[str]:
    """Node ``rank``'s files of the epoch, as torch's DistributedSampler gives them (no process group)."""
    from torch.utils.data.distributed import DistributedSampler

    sampler = DistributedSampler(names, num_replicas=nodes, rank=rank, shuffle=True, seed=0)
    sampler.set_epoch(epoch)
    return [names[i] for i in sampler]


def read_part(root: str, names: list[str], digests: dict, done: list, wrong: list, stop=None) -> None:
    for name in names:
        if stop is not None and stop.is_set():
            return
        path = os.path.join(root, name)
        try:
            drop_page_cache(path)
            with open(path, "rb", buffering=0) as f:
                if hashlib.sha256(f.read()).hexdigest() != digests[name]:
                    wrong.append(f"{root}: {name}: other bytes")
        except OSError as exc:
            wrong.append(f"{root}: {name}: {exc}")
        done.append(name)


def test_sixteen_nodes_read_their_parts_storage_once_two_killed_mid_epoch(mount, key_file, tmp_path):
    """16 daemons, 48 shards (3 each), each node's budget its own shards and two more."""
    pytest.importorskip("torch")
    count = 16
    shards = tmp_path / "shards"
    digests = write_shards(shards, shards=3 * count, members=8, largest=60_000)
    names = sorted(digests)
    total = tar_bytes(shards)
    peers = addresses(count)
    largest = max(footprint(p.stat().st_size) for p in shards.glob("*.tar"))

    def budget(i, me):  # what it owns and two shards more: owned shards stay, others come from owners
        return ("--cache-size", str(owned_bytes(shards, peers, me) + 2 * largest))

    nodes = start_together(mount, shards, peers, tmp_path, each=budget)
    # Epoch 0: every node its part; every shard read from storage by its owner alone.
    wrong, done = [], []
    readers = [threading.Thread(target=read_part, args=(n.path, distributed_part(names, count, i, 0), digests, done,
                                                         wrong)) for i, n in enumerate(nodes)]
    for t in readers:
        t.start()
    for t in readers:
        t.join()
    assert wrong == [] and len(done) == len(names)
    assert sum(n.stats()["cache"]["storage_bytes_read"] for n in nodes) <= 1.1 * total
    assert sum(n.stats()["indexes_built"] for n in nodes) <= 1.25 * 3 * count

    # Epoch 1: two nodes SIGKILLed once a quarter of the files are read; the others read theirs right.
    killed, survivors = nodes[1:3], [nodes[0], *nodes[3:]]
    wrong, done, stop = [], [], threading.Event()
    readers = {n.path: threading.Thread(target=read_part, args=(n.path, distributed_part(names, count, i, 1), digests,
                                                                 done, wrong, stop if n in killed else None))
               for i, n in enumerate(nodes)}
    for t in readers.values():
        t.start()
    wait_for(lambda: len(done) >= len(names) // 4, lambda: f"a quarter of {len(names)} files read ({len(done)} so far)")
    stop.set()
    for n in killed:
        readers[n.path].join(timeout=60)
        os.kill(n.pid, signal.SIGKILL)
    for n in survivors:
        readers[n.path].join()
    # (each error names its mount first: node1's are not node10's)
    assert [w for w in wrong if w.split(": ", 1)[0] not in {k.path for k in killed}] == []
    # One survivor reads every file (the killed nodes' shards among them): from the owners left,
    # and from storage where the shards fell to it.
    first = survivors[0]
    assert check_all(first.path, digests, drop=True) == []
    # Each killed node is found down by a survivor that asks it for one of its shards. (Which ones
    # asked so far depends on what each holds in its RAM cache: one holding a killed node's shards
    # never asks; the survivors read the killed node's files until one had to.)
    placed = owners(sorted(shards.glob("*.tar")), peers)
    for k in killed:
        theirs = {n: d for n, d in digests.items() if placed[shards / member_shard(n)] == k.address}
        for n in survivors:
            if k.address not in n.stats()["peers"]["down"]:
                assert check_all(n.path, theirs, drop=True) == []
            if k.address in n.stats()["peers"]["down"]:
                break
        else:
            raise AssertionError(f"no survivor found {k.address} down")
    assert first.stats()["read_errors"] == 0


def test_storage_counters_count_shared_storage_only(mount, key_file, tmp_path):
    """Every counter named storage counts shared storage alone; bytes from peers are counted as
    such, in the stats, the metrics and --watch (two nodes reading everything: 1x from storage)."""
    from conftest import shardfs_cmd

    shards = tmp_path / "shards"
    digests = write_shards(shards, shards=6, members=6, largest=200_000)
    nodes = start_together(mount, shards, addresses(2), tmp_path)
    for n in nodes:
        assert check_all(n.path, digests, drop=True) == []
    figures = [n.stats() for n in nodes]
    assert sum(f["cache"]["storage_bytes_read"] for f in figures) == tar_bytes(shards)
    for f in figures:
        assert f["cache"]["storage_bytes_read"] == f["peers"]["storage_bytes_read"]
        assert f["cache"]["peer_bytes_read"] == f["peers"]["bytes_from_peers"] > 0
    metrics = shardfs_cmd("stats", nodes[0].path, "--format", "prometheus", check=True).stdout
    assert "shardfs_cache_peer_read_bytes_total{" in metrics
    watch = shardfs_cmd("stats", nodes[0].path, "--watch", "--count", "1", check=True).stdout
    assert "(shared storage only; from peers" in watch
