"""service.peer_indexes: a shard's index built once per node, whoever asks first (this node's own
build of the shards it owns, or a peer's request), with no lock held while builds are chained."""

import threading
from concurrent.futures import Executor, Future

from conftest import DEADLINE
from test_disk_tier import write_shards
from test_peers import addresses

from shardfs.formats.datafile import Columns
from shardfs.index import index_file
from shardfs.service.peer_indexes import IndexSharing
from shardfs.storage.peers.net import PeerNet


class RunsAtOnce(Executor):
    """An executor whose work has ended by the time submit returns: the Future a build gives back
    is done before anything is chained to it (what a fast build on a loaded machine does too)."""

    def __init__(self):
        self.submitted = 0

    def submit(self, fn, /, *args, **kwargs) -> Future:
        self.submitted += 1
        out = Future()
        out.set_running_or_notify_cancel()
        try:
            out.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed over as a pool would
            out.set_exception(exc)
        return out


def _sharing(tmp_path, shards):
    peers = addresses(2)
    net = PeerNet(peers, peers[0], key=b"k" * 32)
    sharing = IndexSharing(net, str(tmp_path / "idx"), Columns(), workers=1)
    sharing.know(sorted(str(p) for p in shards.glob("*.tar")))
    return net, sharing


def test_a_build_that_ended_before_it_was_chained_does_not_hang_the_node(tmp_path):
    shards = tmp_path / "shards"
    write_shards(shards, shards=2, members=4, largest=20_000)
    net, sharing = _sharing(tmp_path, shards)
    try:
        pool, got = RunsAtOnce(), {}
        path = sorted(str(p) for p in shards.glob("*.tar"))[0]
        digest = sharing._digests[path]

        def ask():
            got["first"] = sharing._build_once(digest, path, pool).result(DEADLINE)
            got["again"] = sharing._build_once(digest, path, pool).result(DEADLINE)

        t = threading.Thread(target=ask, daemon=True)
        t.start()
        t.join(DEADLINE)
        assert not t.is_alive(), "the node hung on its own lock"
        assert got["first"] == got["again"] and pool.submitted == 1  # built once
        assert sharing.built == 1
        with open(got["first"], "rb") as f:
            assert len(index_file.load(f)) == 4
    finally:
        sharing.close()
        net.close()
