"""The owners made anew off the readers' threads (storage/peers/net.py): a real PeerNet with real
peers on loopback, and a placement made slow on purpose (it waits on a gate when a peer is down).
While it is made, a read of a shard whose owner is up is answered by that owner; a read of a
shard whose owner went down waits for the new owner and gets it, never the next peer along the
ring nor storage (where the new owner would read the shard too); repeated changes are coalesced
into one builder."""

from __future__ import annotations

import os
import threading

import pytest
from conftest import DEADLINE, wait_for
from test_peers import addresses

from shardfs.storage.local import LocalShard
from shardfs.storage.peers import owner
from shardfs.storage.peers import shard as peer_shard
from shardfs.storage.peers.client import PeerFailure
from shardfs.storage.peers.net import PeerNet

KEY = b"k" * 64


class Gate:
    """Placements with a peer down wait until ``opened`` (a rebuild that takes as long as the test likes)."""

    def __init__(self, monkeypatch):
        self.opened, self.entered, self.made = threading.Event(), threading.Event(), []
        plain = owner.Placement
        gate = self

        class Gated(plain):
            def __init__(self, *args, down=frozenset(), **kwargs):
                if down:
                    gate.entered.set()
                    gate.opened.wait(3 * DEADLINE)  # (longer than any wait_for: the test opens it)
                    gate.made.append(frozenset(down))
                super().__init__(*args, down=down, **kwargs)

        monkeypatch.setattr(owner, "Placement", Gated)


def local_shards(root, count: int) -> list[LocalShard]:
    root.mkdir()
    out = []
    for i in range(count):
        path = root / f"part-{i:04d}.tar"
        path.write_bytes(os.urandom(2000 + 7 * i))
        st = path.stat()
        out.append(LocalShard(str(path), st.st_size, st.st_mtime_ns))
    return out


def peers_where_a_lost_shard_skips_its_next_candidate(digests, sizes):
    """(me, b, c, a shard b owns with c up or down, a shard of c that goes to b when c is down
    although the ring's next peer after c is me): the ports are random, so until they give both."""
    for _ in range(200):
        peers = addresses(3)
        me, b, c = peers
        before, after = owner.Placement(digests, sizes, peers), owner.Placement(digests, sizes, peers, down={c})
        healthy = [d for d in digests if before.owner_of(d) == b == after.owner_of(d)]
        lost = [d for d in digests if before.owner_of(d) == c and after.owner_of(d) == b
                and list(before.candidates(d))[1] == me]
        if healthy and lost:
            return me, b, c, healthy[0], lost[0]
    raise AssertionError("no 3 addresses found by which a shard of the lost peer skips its next candidate")


@pytest.fixture
def close_later():
    nets = []
    yield nets.append
    for net in nets:
        net.close()


def test_while_the_owners_are_made_anew_healthy_owners_answer_and_a_lost_shard_waits_for_its_new_owner(
        tmp_path, monkeypatch, close_later):
    shards = local_shards(tmp_path / "shards", 240)
    digests = [owner.digest(owner.identity(s.path, s.size, s.mtime_ns)) for s in shards]
    me, b, c, healthy, lost = peers_where_a_lost_shard_skips_its_next_candidate(digests, [s.size for s in shards])
    net, b_net = PeerNet([me, b, c], me, key=KEY), PeerNet([me, b, c], b, key=KEY)  # (c: nothing listens)
    close_later(net)
    close_later(b_net)
    placed = {s.digest: s for s in net.place(shards)}
    b_net.place([LocalShard(s.path, s.size, s.mtime_ns) for s in shards])
    b_net.ready(lambda shard, offset, length: shard.pread(offset, length), lambda *_: None)
    monkeypatch.setattr(peer_shard, "PEER_BUDGET_S", DEADLINE)  # (a slow machine: the wait is the gate's alone)
    gate = Gate(monkeypatch)
    got: dict[str, bytes] = {}

    def read(digest: str) -> None:
        got[digest] = placed[digest].pread(0, placed[digest].size)

    def source(digest: str) -> bytes:
        with open(placed[digest].path, "rb") as f:
            return f.read()

    lost_reader = threading.Thread(target=read, args=(lost,), daemon=True)
    healthy_reader = threading.Thread(target=read, args=(healthy,), daemon=True)
    try:
        lost_reader.start()  # c refuses: down, and the owners are made anew without it
        wait_for(gate.entered.is_set, "the owners without c under way")
        assert net.client.is_down(c)
        healthy_reader.start()
        wait_for(lambda: healthy in got, "a read of a shard whose owner is up answered while the owners are made")
        assert got[healthy] == source(healthy)
        assert lost not in got, "the read of c's shard went on before its new owner was known"
        assert net.placement().down == frozenset()  # (the one in force, meanwhile)
    finally:
        gate.opened.set()
    wait_for(lambda: lost in got, "the read of c's shard answered once the owners without c are made")
    lost_reader.join(DEADLINE)
    healthy_reader.join(DEADLINE)
    assert got[lost] == source(lost)
    assert net.placement().owner_of(lost) == b
    # Both from b (the lost one from its new owner): nothing from storage here, c asked once.
    assert net.storage_bytes_read == 0
    assert b_net.server.counts["bytes_to_peers"] == len(got[lost]) + len(got[healthy])
    assert net.client.counts["failures"] == 1
    assert gate.made == [frozenset({c})]


def test_changes_of_the_peers_down_while_the_owners_are_made_start_one_builder_that_ends_on_the_latest(
        tmp_path, monkeypatch, close_later):
    shards = local_shards(tmp_path / "shards", 50)
    me, b, c = addresses(3)  # (b and c: nothing listens)
    net = PeerNet([me, b, c], me, key=KEY)
    close_later(net)
    net.place(shards)
    everyone = net.placement()
    gate = Gate(monkeypatch)

    def builders() -> int:
        return sum(t.name == "shardfs-peer-placement" for t in threading.enumerate())

    try:
        for peer in (b, c):
            with pytest.raises(PeerFailure):
                net.client.fetch(peer, everyone.digests[0], 0, 10, 5.0)
            assert net.placement() is everyone  # never made here, never waited for
            wait_for(gate.entered.is_set, "the owners without b under way")
            assert builders() == 1
    finally:
        gate.opened.set()
    wait_for(lambda: net.placement().down == {b, c}, "the owners without b and c")
    assert gate.made == [frozenset({b}), frozenset({b, c})]
    assert set(net.placement().owner) == {net.ring.peers.index(me)}
    wait_for(lambda: builders() == 0, "the builder ends")
