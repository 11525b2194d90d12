"""Peers' parts alone (the owner rule: test_peers_placement.py): the shard identity, the key file and its proofs, the peer list from every
front door (command line, -o, TOML, the Python API, a Slurm job)."""

import multiprocessing
import os
import secrets
import socket

import pytest

from conftest import needs_scontrol
from shardfs.errors import UsageError
from shardfs.service.api import mount_command
from shardfs.service.config import MountConfig, apply_options, check, parse_config, to_args
from shardfs.service.jobpeers import job_port, slurm_peers
from shardfs.storage.peers import addresses, auth, owner

def test_identity_covers_name_size_mtime_and_tag():
    base = owner.identity("/d/a.tar", 10, 5, "etag1")
    assert len({base, owner.identity("/d/b.tar", 10, 5, "etag1"), owner.identity("/d/a.tar", 11, 5, "etag1"),
                owner.identity("/d/a.tar", 10, 6, "etag1"), owner.identity("/d/a.tar", 10, 5, "etag2")}) == 5


def _make_key(path, barrier, out):
    barrier.wait()
    out.put(auth.load_or_create(path))


def test_nodes_starting_at_once_agree_on_one_private_key(tmp_path):
    path = str(tmp_path / "home" / ".config" / "shardfs" / "peer.key")
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(8), ctx.Queue()
    procs = [ctx.Process(target=_make_key, args=(path, barrier, out)) for _ in range(8)]
    for p in procs:
        p.start()
    keys = {out.get(timeout=30) for _ in procs}
    for p in procs:
        p.join(timeout=30)
    assert len(keys) == 1 and len(keys.pop()) >= 32
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert os.listdir(os.path.dirname(path)) == ["peer.key"]  # no candidate left behind


def test_a_key_others_can_read_is_refused(tmp_path):
    path = tmp_path / "peer.key"
    path.write_text("a" * 64)
    path.chmod(0o644)
    with pytest.raises(UsageError, match="chmod 600"):
        auth.load_or_create(str(path))


def test_request_proofs():
    key = secrets.token_hex(32).encode()
    proof = auth.sign_request(key, "GET", "/shard/ab", "bytes=0-9")
    assert auth.check_request(key, proof, "GET", "/shard/ab", "bytes=0-9") is None
    assert auth.check_request(key, None, "GET", "/shard/ab", "bytes=0-9") == "no proof of the key"
    assert auth.check_request(b"k" * 64, proof, "GET", "/shard/ab", "bytes=0-9") == "wrong key"
    assert auth.check_request(key, proof, "GET", "/shard/cd", "bytes=0-9") == "wrong key"
    old = auth.sign_request(key, "GET", "/shard/ab", "bytes=0-9", now=1_000_000)
    assert "too long ago" in auth.check_request(key, old, "GET", "/shard/ab", "bytes=0-9")
    assert auth.check_request(key, "shardfs-hmac garbage", "GET", "/shard/ab", "bytes=0-9") == "malformed proof"
    reply = auth.sign_reply(key, proof, 1234, 10)
    assert auth.check_reply(key, proof, 1234, 10, reply)
    assert not auth.check_reply(key, proof, 1235, 10, reply) and not auth.check_reply(key, proof, 1234, 10, None)


@pytest.mark.parametrize("text, message", [
    ("host", "'host'"), ("host:", "'host:'"), ("host:0", "'host:0'"), (":7000", "':7000'"),
    ("::1:7000", "brackets"), ("a:1,b:2,a:1", "'a:1' is listed twice"),
    ("a:1,@b:2", "does not start with '@'"),  # (first in a config's list, the daemon read it as a file)
])
def test_bad_peer_lists_name_the_value(text, message):
    with pytest.raises(UsageError, match=message):
        addresses.parse_list(text)


def test_peer_lists_from_a_file_and_off(tmp_path):
    listing = tmp_path / "peers"
    listing.write_text("# the job's nodes\nnode1:7000\n\nnode2:7000  # the second\n[::1]:7000\n")
    assert addresses.parse_list(f"@{listing}") == ["node1:7000", "node2:7000", "[::1]:7000"]
    assert addresses.split("[::1]:7000") == ("::1", 7000)
    assert addresses.parse_list("off") == []


def test_this_node_is_found_by_name_or_address():
    me = socket.gethostname()
    assert addresses.pick_self(["elsewhere.invalid:1", f"{me}:2"], None) == f"{me}:2"
    assert addresses.pick_self(["elsewhere.invalid:1", "127.0.0.1:2"], None) == "127.0.0.1:2"
    with pytest.raises(UsageError, match="2 peers .* are this machine"):
        addresses.pick_self(["127.0.0.2:1", "127.0.0.3:1"], None)
    with pytest.raises(UsageError, match="none of the peers is this machine"):
        addresses.pick_self(["elsewhere.invalid:1", "elsewhere2.invalid:1"], None)
    assert addresses.pick_self(["127.0.0.2:1", "127.0.0.3:1"], "127.0.0.3:1") == "127.0.0.3:1"


def test_peers_from_every_front_door(tmp_path):
    peers = ["127.0.0.2:7001", "127.0.0.3:7001"]
    toml = parse_config({"sources": ["/d"], "mountpoint": "/m", "peers": peers, "peer_self": peers[1]})
    as_text = parse_config({"sources": ["/d"], "mountpoint": "/m", "peers": ",".join(peers), "peer_self": peers[1]})
    cfg = MountConfig(sources=["/d"], mountpoint="/m")
    apply_options(cfg, f"ro,peers={','.join(peers)},peer_self={peers[1]},allow_other")
    check(cfg)
    assert toml.peers == as_text.peers == cfg.peers == peers and toml.peer_self == cfg.peer_self == peers[1]
    assert cfg.allow_other
    args = to_args(cfg)
    assert args[args.index("--peers") + 1] == ",".join(peers) and args[args.index("--peer-self") + 1] == peers[1]
    cmd = mount_command(["/d"], "/m", {"peers": peers, "peer_self": peers[1]})
    assert cmd[cmd.index("--peers") + 1] == ",".join(peers)
    assert mount_command(["/d"], "/m", {"peers": []})[-1] == "off"
    with pytest.raises(UsageError, match="peers: .*'127.0.0.9:1' is not among"):
        parse_config({"sources": ["/d"], "mountpoint": "/m", "peers": peers, "peer_self": "127.0.0.9:1"})


@needs_scontrol
def test_a_slurm_job_of_several_nodes_makes_its_nodes_peers(tmp_path):
    conf = tmp_path / "slurm.conf"  # scontrol wants a configuration, though it only expands the list
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\nNodeName=node[1-3] CPUs=1\n")
    env = {**os.environ, "SLURM_CONF": str(conf), "SLURM_JOB_ID": "113456", "SLURM_JOB_NODELIST": "node[1-3]",
           "SLURMD_NODENAME": "node2"}
    assert job_port("113456") == 13456
    assert slurm_peers(env) == (["node1:13456", "node2:13456", "node3:13456"], "node2:13456")
    assert slurm_peers({**env, "SLURM_JOB_NODELIST": "node1"}) == (None, None)  # one node: today's behaviour
    assert slurm_peers({k: v for k, v in env.items() if k != "SLURM_JOB_ID"}) == (None, None)


def _shards(tmp_path, count: int, size: int) -> list:
    from shardfs.storage.local import LocalShard

    shards = []
    for i in range(count):
        path = tmp_path / f"{i}.tar"
        path.write_bytes(bytes([i]) * size)
        st = path.stat()
        shards.append(LocalShard(str(path), st.st_size, st.st_mtime_ns))
    return shards


def test_owned_shards_evict_others_from_the_ram_cache_others_only_take_room(tmp_path):
    from shardfs.storage.buffers import footprint
    from shardfs.storage.ram import CHUNK, ShardCache

    a, b, mine, c = _shards(tmp_path, 4, CHUNK)
    cache = ShardCache([], 2 * footprint(CHUNK), keep_first=lambda shard: shard is mine)
    try:
        for shard in (a, b):
            assert bytes(cache.fetch(shard, 0, 10)) == bytes([int(os.path.basename(shard.path)[0])]) * 10
        assert set(cache.resident) == {a, b}  # room for two, taken by shards we do not own
        assert bytes(cache.fetch(mine, 0, 10)) == b"\x02" * 10
        assert mine in cache.resident and len(cache.resident) == 2  # evicted one of them, though in use
        cache.fetch(c, 0, 10)
        assert c not in cache.resident and mine in cache.resident  # read directly: never evicts ours
    finally:
        cache.close()


def test_owned_shards_evict_others_from_the_disk_tier_others_only_take_room(tmp_path):
    from shardfs.storage import tierfile
    from shardfs.storage.disk import DiskTier

    a, b, theirs, mine = _shards(tmp_path, 4, tierfile.CHUNK)
    bound = str(2 * (tierfile.CHUNK + 8192))  # two shards and their headers
    first = DiskTier(str(tmp_path / "tier"), bound)
    for shard in (a, b):
        first.pread(shard, 0, 100)
    first.close()  # two idle files, the tier full
    tier = DiskTier(str(tmp_path / "tier"), bound, keep_first=lambda shard: shard is mine)
    try:
        assert tier.pread(theirs, 0, 100) == b"\x02" * 100
        assert tier.snapshot()["shards_evicted"] == 0 and tier.snapshot()["shards_refused"] == 1
        assert tier.pread(mine, 0, 100) == b"\x03" * 100
        assert tier.snapshot()["shards_evicted"] == 1
        assert mine.path in {c.source for c in tierfile.describe(str(tmp_path / "tier"))}
    finally:
        tier.close()
