"""Peers through real mounts: three daemons as nodes on 127.0.0.2-4, each with its own peer
server, serving shards to each other. Every file read through every node is checked by sha256;
shared storage is read about once per dataset; a peer killed or frozen during reads costs no
reader an error; damaged or foreign replies are never served; requests without the key are refused."""

import hashlib
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from conftest import drop_page_cache, needs_fuse, shardfs_cmd
from test_disk_tier import tar_bytes, write_shards
from shardfs.service.daemon import _peers_status
from shardfs.storage.peers import auth, owner
from shardfs.storage.peers.server import FAULT_ENV

pytestmark = needs_fuse

SMALL_RAM = "1M"  # no shard fits: every read is one member's bytes, asked from the owner each time


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def addresses(count: int) -> list[str]:
    return [f"127.0.0.{2 + i}:{free_port(f'127.0.0.{2 + i}')}" for i in range(count)]


@pytest.fixture
def key_file(tmp_path, monkeypatch):
    path = tmp_path / "home" / "peer.key"
    monkeypatch.setenv(auth.KEY_ENV, str(path))
    return path


@pytest.fixture
def nodes(mount, key_file, monkeypatch):
    """``nodes(sources, options=..., faults={i: fault})``: one mount per source, all peers of each other."""

    def start(sources: list, options=(), faults: dict | None = None, each=None):
        """``each(i, address, peers)``: options of node i alone."""
        peers = addresses(len(sources))
        made = []
        for i, (src, me) in enumerate(zip(sources, peers)):
            if faults and i in faults:
                monkeypatch.setenv(FAULT_ENV, faults[i])
            else:
                monkeypatch.delenv(FAULT_ENV, raising=False)
            own = each(i, me, peers) if each else ()
            made.append(mount(src, options=("--peers", ",".join(peers), "--peer-self", me, *options, *own),
                              name=f"node{i}"))
        monkeypatch.delenv(FAULT_ENV, raising=False)
        for m in made:
            m.address = peers[made.index(m)]
        return made

    return start


@pytest.fixture
def dataset(tmp_path):
    out = tmp_path / "shards"
    digests = write_shards(out, shards=8, members=8, largest=400_000)
    return out, digests


def check_all(mnt: str, digests: dict, drop: bool = False) -> list[str]:
    """Paths whose bytes through ``mnt`` differ from the source's, or fail to read."""
    wrong = []
    for name, want in digests.items():
        path = os.path.join(mnt, name)
        try:
            if drop:
                drop_page_cache(path)
            with open(path, "rb") as f:
                if hashlib.sha256(f.read()).hexdigest() != want:
                    wrong.append(f"{name}: other bytes")
        except OSError as exc:
            wrong.append(f"{name}: {exc}")
    return wrong


def wait_for(what, timeout: float = 30.0, step: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(step)
    raise AssertionError(f"not within {timeout} s: {what.__doc__ or what}")


def storage_read(nodes) -> int:
    return sum(n.stats()["peers"]["storage_bytes_read"] for n in nodes)


def test_every_node_serves_every_file_and_storage_is_read_once(nodes, dataset):
    shards, digests = dataset
    mounts = nodes([shards] * 3)
    for m in mounts:
        assert check_all(m.path, digests) == []
    total = tar_bytes(shards)
    # Each shard is read from storage by its owner only, whole, once: 1x the dataset (not 3x).
    assert storage_read(mounts) == total
    for m in mounts:
        peers = m.stats()["peers"]
        assert peers["bytes_from_peers"] > 0 and peers["bytes_to_peers"] > 0
        assert peers["peers_up"] == 3 and peers["failures"] == 0
    # A second pass through new page-cache misses: answered from the RAM caches, storage untouched.
    for m in mounts:
        assert check_all(m.path, digests, drop=True) == []
    assert storage_read(mounts) == total
    a, b = mounts[:2]
    prometheus = shardfs_cmd("stats", a.path, "--format", "prometheus", check=True).stdout
    assert "shardfs_peer_fetched_bytes_total" in prometheus and f'peer="{b.address}"' in prometheus
    assert "peers     3 up, 0 down" in shardfs_cmd("stats", a.path, "--watch", "--count", "1", check=True).stdout
    assert "; peers 3 up, 0 down" in _peers_status(a.stats()["peers"])  # the service's STATUS line


def owned_bytes(shards, peers: list[str], me: str) -> int:
    """What node ``me`` owns of the shards, by the rule every node applies."""
    return sum(p.stat().st_size for p in shards.glob("*.tar")
               if owner.owner(owner.identity(str(p), p.stat().st_size, p.stat().st_mtime_ns), peers) == me)


def test_the_nodes_ram_adds_up_owned_shards_go_first(nodes, tmp_path):
    """Each node's budget holds what it owns and two shards more, far from the whole dataset:
    epochs 1 and 2 through every node read shared storage once in all, as owned shards evict others."""
    shards = tmp_path / "many"
    digests = write_shards(shards, shards=12, members=6, largest=400_000)
    largest = max(p.stat().st_size for p in shards.glob("*.tar"))
    budgets = {}

    def budget(i, me, peers):
        budgets[me] = owned_bytes(shards, peers, me) + 2 * largest
        return ("--cache-size", str(budgets[me]))

    mounts = nodes([shards] * 3, each=budget)
    for epoch in range(2):
        for m in mounts:
            assert check_all(m.path, digests, drop=True) == []
    assert storage_read(mounts) == tar_bytes(shards)
    for m in mounts:
        cache = m.stats()["cache"]
        assert cache["used_bytes"] <= budgets[m.address] < tar_bytes(shards)


def test_owners_serve_from_their_disk_tier(nodes, dataset, tmp_path):
    """No shard fits in RAM: members come from the owners' disk tiers, filled from storage once;
    the other nodes fill their tiers from the owners."""
    shards, digests = dataset
    mounts = nodes([shards] * 3, options=("--cache-size", SMALL_RAM),
                   each=lambda i, me, peers: ("--disk-cache", str(tmp_path / f"tier{i}")))
    for m in mounts:
        assert check_all(m.path, digests, drop=True) == []
    assert storage_read(mounts) == tar_bytes(shards)
    for m in mounts:
        assert m.stats()["peers"]["bytes_from_peers"] > 0


def test_without_peers_every_node_reads_storage_itself(mount, dataset):
    """The baseline: three mounts of one dataset read it three times."""
    shards, digests = dataset
    mounts = [mount(shards, name=f"alone{i}") for i in range(3)]
    for m in mounts:
        assert check_all(m.path, digests) == []
        assert "peers" not in m.stats()
    assert sum(m.stats()["cache"]["storage_bytes_read"] for m in mounts) == 3 * tar_bytes(shards)


def test_a_peer_killed_and_one_frozen_during_reads_cost_no_reader_an_error(nodes, dataset):
    shards, digests = dataset
    a, b, c = nodes([shards] * 3, options=("--cache-size", SMALL_RAM))
    errors, passes, stop = [], [0], threading.Event()

    def reader():
        while not stop.is_set():
            errors.extend(check_all(a.path, digests, drop=True))
            passes[0] += 1

    def passes_after(n):
        start = passes[0]
        return lambda: passes[0] >= start + n

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        wait_for(lambda: a.stats()["peers"]["bytes_from_peers"] > 0)
        os.kill(c.pid, signal.SIGKILL)
        wait_for(passes_after(2))
        assert c.address in a.stats()["peers"]["down"]
        os.kill(b.pid, signal.SIGSTOP)
        try:
            wait_for(passes_after(2), timeout=60)
            assert b.address in a.stats()["peers"]["down"]
        finally:
            os.kill(b.pid, signal.SIGCONT)
        # B answers again: after its backoff, A asks it again and counts it up.
        wait_for(lambda: b.address not in a.stats()["peers"]["down"], timeout=90)
        wait_for(passes_after(1))
    finally:
        stop.set()
        thread.join(timeout=60)
    assert errors == []
    assert a.stats()["read_errors"] == 0


def test_damaged_or_unsigned_peer_replies_are_never_served(nodes, tmp_path):
    """Three of four nodes send bad replies (a flipped byte, half the bytes, another key's proof):
    the good node serves every file right, from the next peer in each shard's order or storage."""
    shards = tmp_path / "many"
    digests = write_shards(shards, shards=16, members=4, largest=200_000)
    faults = {1: "corrupt", 2: "truncate", 3: "foreign"}
    good, *bad = nodes([shards] * 4, options=("--cache-size", SMALL_RAM), faults=faults)
    assert check_all(good.path, digests, drop=True) == []
    peers = good.stats()["peers"]
    for node in bad:  # each is before the good node in some shard's order (of 16: all but surely)
        assert peers["failures_by_peer"][node.address] > 0 and node.address in peers["down"]
    assert peers["bytes_from_peers"] == 0  # nothing of the bad replies counted, nor served


def test_a_peer_serving_another_dataset_is_never_trusted(nodes, dataset, tmp_path):
    shards, digests = dataset
    other = tmp_path / "other"
    write_shards(other, seed=99, shards=8, members=8, largest=400_000)
    for a, b in zip(sorted(shards.glob("*.tar")), sorted(other.glob("*.tar"))):
        os.utime(b, ns=(a.stat().st_atime_ns, a.stat().st_mtime_ns))  # alike but for their bytes and place
    ours, theirs = nodes([shards, other])
    assert check_all(ours.path, digests) == []
    peers = ours.stats()["peers"]
    assert peers["bytes_from_peers"] == 0 and peers["storage_bytes_read"] == tar_bytes(shards)


def request(address: str, digest: str, headers: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://{address}/shard/{digest}", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_requests_without_the_key_or_replayed_late_are_refused(nodes, dataset, key_file):
    shards, _ = dataset
    a, b = nodes([shards] * 2)
    first = sorted(shards.glob("*.tar"))[0]
    st = first.stat()
    digest = owner.digest(owner.identity(str(first), st.st_size, st.st_mtime_ns))
    target, byte_range = f"/shard/{digest}", "bytes=0-511"
    key = auth.load_or_create(str(key_file))
    with open(first, "rb") as f:
        head = f.read(512)

    def ask(proof):
        return request(b.address, digest, {"Range": byte_range, **({auth.HEADER: proof} if proof else {})})

    status, body = ask(auth.sign_request(key, "GET", target, byte_range))
    assert (status, body) == (206, head)  # the test's own request is right: the refusals below are not by accident
    for proof in (None, auth.sign_request(b"x" * 64, "GET", target, byte_range),
                  auth.sign_request(key, "GET", target, byte_range, now=time.time() - 3600),
                  auth.sign_request(key, "GET", target, "bytes=0-1023")):  # signed for another range
        status, body = ask(proof)
        assert status == 403 and head[:64] not in body
    assert b.stats()["peers"]["requests_refused"] == 4


@pytest.mark.parametrize("peers, self_, message", [
    ("127.0.0.2", None, "'127.0.0.2'"),
    ("127.0.0.2:1,127.0.0.3:99999", None, "'127.0.0.3:99999'"),
    ("127.0.0.2:7001,127.0.0.2:7001", None, "listed twice"),
    ("127.0.0.2:7001,127.0.0.3:7001", "127.0.0.9:7001", "'127.0.0.9:7001' is not among"),
    ("@/nonexistent/peers", None, "/nonexistent/peers"),
])
def test_bad_peers_are_refused_naming_the_value(dataset, tmp_path, peers, self_, message):
    shards, _ = dataset
    done = shardfs_cmd("mount", shards, tmp_path / "mnt", "--peers", peers,
                       *(["--peer-self", self_] if self_ else []))
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_a_peer_port_in_use_is_an_error_that_says_so(dataset, tmp_path, key_file):
    shards, _ = dataset
    (tmp_path / "mnt").mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.2", 0))
        taken.listen()
        me = f"127.0.0.2:{taken.getsockname()[1]}"
        done = shardfs_cmd("mount", shards, tmp_path / "mnt", "--peers", f"{me},127.0.0.3:7001", "--peer-self", me)
    assert done.returncode == 2 and "in use" in done.stderr, done.stderr
    assert not os.path.ismount(tmp_path / "mnt")


def slurm_job_env(tmp_path, job_id: str, nodes: str, me: str) -> dict:
    conf = tmp_path / "slurm.conf"  # scontrol wants a configuration, though it only expands the list
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\n")
    return {**os.environ, "SLURM_CONF": str(conf), "SLURM_JOB_ID": job_id, "SLURM_JOB_NODELIST": nodes,
            "SLURMD_NODENAME": me}


@pytest.mark.parametrize("extra, expect", [((), ["127.0.0.2:11234", "127.0.0.3:11234"]), (("--peers", "off"), None)])
def test_shardfs_run_in_a_slurm_job_makes_the_job_nodes_peers(dataset, tmp_path, key_file, extra, expect):
    shards, _ = dataset
    env = slurm_job_env(tmp_path, "1234", "127.0.0.[2-3]", "127.0.0.2")
    show = "import json, os; print(json.dumps(json.loads(os.getxattr(os.environ['SHARDFS_MOUNT'], 'user.shardfs.stats')).get('peers')))"
    done = shardfs_cmd("run", shards, tmp_path / "mnt", *extra, "--", sys.executable, "-c", show, env=env)
    assert done.returncode == 0, done.stderr
    peers = json.loads(done.stdout)
    if expect is None:
        assert peers is None
    else:
        assert peers["self"] == expect[0] and peers["peers"] == len(expect)
