"""Peers through real mounts: three daemons as nodes on 127.0.0.2-4, each with its own peer
server, serving shards to each other. Every file read through every node is checked by sha256;
shared storage is read about once per dataset; a peer killed or frozen during reads costs no
reader an error; damaged or foreign replies are never served; requests without the key are refused."""

import contextlib
import hashlib
import json
import os
import signal
import socket
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request

import pytest

from conftest import drop_page_cache, force_unmount, needs_fuse, needs_scontrol, shardfs_cmd, wait_for
from test_disk_tier import hanging_storage, tar_bytes, write_shards
from test_metrics import samples

from shardfs.service.daemon import _peers_status
from shardfs.service.mount import process_alive
from shardfs.storage.buffers import footprint
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

    def start(sources: list, options=(), faults: dict | None = None, each=None, peers=None):
        """``each(i, address, peers)``: options of node i alone."""
        peers = peers or addresses(len(sources))
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
        # (the ports are random, so which node owns how many of the 8 shards changes from run to run)
        assert (peers["bytes_from_peers"] > 0) == (peers["shards_owned"] < 8)
        assert (peers["bytes_to_peers"] > 0) == (peers["shards_owned"] > 0)
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


def owners(files, peers: list[str], seen_as=None, down=()) -> dict:
    """{shard file: its owner}, by the rule every node applies (``seen_as(file)``: the path the nodes see;
    ``down``: the peers taken to be down)."""
    digests = [owner.digest(owner.identity(str(seen_as(p) if seen_as else p), p.stat().st_size, p.stat().st_mtime_ns))
               for p in files]
    placed = owner.Placement(digests, [p.stat().st_size for p in files], peers, down=frozenset(down))
    return {p: placed.owner_of(d) for p, d in zip(files, digests)}


def owned(shards, peers: list[str], me: str, down=()) -> list:
    """The shard files node ``me`` owns (with ``down`` down)."""
    return [p for p, who in owners(sorted(shards.glob("*.tar")), peers, down=down).items() if who == me]


def owned_bytes(shards, peers: list[str], me: str) -> int:
    """What the shards this node owns cost of its RAM budget."""
    return sum(footprint(p.stat().st_size) for p in owned(shards, peers, me))


def shards_owned_by(shards, peers: list[str], me: str, down=()) -> int:
    return len(owned(shards, peers, me, down))


def addresses_each_owning(shards, count: int) -> list[str]:
    """Peer addresses (random ports) by which every node owns at least one of the shards."""
    for _ in range(100):
        peers = addresses(count)
        if all(owned(shards, peers, me) for me in peers):
            return peers
    raise AssertionError(f"no {count} addresses found that each own a shard of {shards}")


def test_the_nodes_ram_adds_up_owned_shards_go_first(nodes, tmp_path):
    """Each node's budget holds what it owns and two shards more, far from the whole dataset:
    epochs 1 and 2 through every node read shared storage once in all, as owned shards evict others."""
    shards = tmp_path / "many"
    digests = write_shards(shards, shards=12, members=6, largest=400_000)
    largest = max(footprint(p.stat().st_size) for p in shards.glob("*.tar"))
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
        assert cache["used_bytes"] <= budgets[m.address] < sum(footprint(p.stat().st_size) for p in shards.glob("*.tar"))


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


@pytest.mark.slow
def test_without_peers_every_node_reads_storage_itself(mount, dataset):
    """The baseline: three mounts of one dataset read it three times."""
    shards, digests = dataset
    mounts = [mount(shards, name=f"alone{i}") for i in range(3)]
    for m in mounts:
        assert check_all(m.path, digests) == []
        assert "peers" not in m.stats()
    # (no disk tier, no --prefetch all: the first mount's index builds keep nothing, count nothing)
    assert sum(m.stats()["cache"]["storage_bytes_read"] for m in mounts) == 3 * tar_bytes(shards)


def test_a_peer_killed_and_one_frozen_during_reads_cost_no_reader_an_error(nodes, dataset):
    shards, digests = dataset
    # B and C each own a shard, so that A has to ask each of them (and find it down)
    a, b, c = nodes([shards] * 3, options=("--cache-size", SMALL_RAM), peers=addresses_each_owning(shards, 3))
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
        wait_for(lambda: a.stats()["peers"]["bytes_from_peers"] > 0, "A got nothing from its peers")
        os.kill(c.pid, signal.SIGKILL)
        # A's next request to C finds it gone: C is marked down (whenever the loaded machine gets there)
        wait_for(lambda: c.address in a.stats()["peers"]["down"], "the killed peer C is not marked down")
        wait_for(passes_after(2), "the reader made no two passes")
        figures = a.stats()["peers"]
        assert c.address in figures["down"]
        # C's shards fell to the next candidates on the ring; A keeps those that fell to it first.
        # (The placement is of every listed peer with C down: the load bound stays where it was.)
        listed = [a.address, *figures["failures_by_peer"]]
        assert figures["shards_owned"] == shards_owned_by(shards, listed, a.address, down=figures["down"])
        os.kill(b.pid, signal.SIGSTOP)
        try:
            wait_for(passes_after(2), "the reader made no two passes with B frozen")
            assert b.address in a.stats()["peers"]["down"]
        finally:
            os.kill(b.pid, signal.SIGCONT)
        # B answers again: after its backoff, A asks it again and counts it up.
        wait_for(lambda: b.address not in a.stats()["peers"]["down"], "B, thawed, is still marked down")
        wait_for(passes_after(1), "the reader made no pass after B came back")
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


@needs_scontrol
@pytest.mark.parametrize("extra, expect", [((), ["127.0.0.2:11234", "127.0.0.3:11234"]), (("--peers", "off"), None)])
def test_shardfs_run_in_a_slurm_job_makes_the_job_nodes_peers(dataset, tmp_path, key_file, extra, expect):
    shards, _ = dataset
    env = slurm_job_env(tmp_path, "1234", "127.0.0.[2-3]", "127.0.0.2")
    show = ("import json, os; figures = os.getxattr(os.environ['SHARDFS_MOUNT'], 'user.shardfs.stats'); "
            "print(json.dumps(json.loads(figures).get('peers')))")
    done = shardfs_cmd("run", shards, tmp_path / "mnt", *extra, "--", sys.executable, "-c", show, env=env)
    assert done.returncode == 0, done.stderr
    peers = json.loads(done.stdout)
    if expect is None:
        assert peers is None
    else:
        assert peers is not None, done.stderr  # the job's nodes were not made peers
        assert peers["self"] == expect[0] and peers["peers"] == len(expect)


def rewrite_in_place(shards) -> dict:
    """A new version of every shard, of the same size: each first member's bytes flipped, a later
    mtime. Returns {member: sha256} of the new version."""
    digests = {}
    for path in sorted(shards.glob("*.tar")):
        with tarfile.open(path) as tf:
            first = tf.getmembers()[0]
        with open(path, "r+b") as f:
            f.seek(first.offset_data)
            head = f.read(16)
            f.seek(first.offset_data)
            f.write(bytes(b ^ 0xFF for b in head))
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        with tarfile.open(path) as tf:
            for m in tf.getmembers():
                digests[m.name] = hashlib.sha256(tf.extractfile(m).read()).hexdigest()
    return digests


def test_a_peer_holding_an_older_version_of_a_shard_is_never_trusted(nodes, dataset, tmp_path):
    """Node 0 mounts the shards and reads them all into its RAM cache, then they change in place
    (same sizes), then node 1 mounts them: node 1 serves the new bytes, never node 0's."""
    shards, digests = dataset
    changed = {}

    def change_before_node_1(i, me, peers):
        if i == 1:
            assert check_all(str(tmp_path / "node0"), digests) == []  # the mount fixture's path
            changed.update(rewrite_in_place(shards))
        return ()

    older, newer = nodes([shards] * 2, each=change_before_node_1)
    assert check_all(newer.path, changed) == []
    assert newer.stats()["peers"]["bytes_from_peers"] == 0


def test_shards_added_by_a_rescan_are_served_by_their_owners(tmp_path, key_file):
    """Through the Python API; SIGHUP on both nodes: the new shards' files, from their owners."""
    import shardfs

    shards = tmp_path / "shards"
    digests = write_shards(shards, shards=2, members=4, largest=200_000)
    peers = addresses(2)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with shardfs.mounted(shards, tmp_path / "a", peers=peers, peer_self=peers[0]) as a, \
            shardfs.mounted(shards, tmp_path / "b", peers=peers, peer_self=peers[1]) as b:
        assert check_all(a, digests) == []
        old = sorted(shards.glob("*.tar"))
        digests.update(write_shards(shards, seed=8, shards=6, members=4, largest=200_000, first=2))
        for root in (a, b):
            os.kill(json.loads(os.getxattr(root, "user.shardfs.stats"))["pid"], signal.SIGHUP)
        for root in (a, b):
            wait_for(lambda: json.loads(os.getxattr(root, "user.shardfs.stats"))["shards"] == 8,
                     "the mount has not 8 shards")
        assert check_all(a, digests) == [] and check_all(b, digests) == []
        figures = [json.loads(os.getxattr(root, "user.shardfs.stats"))["peers"] for root in (a, b)]
        # Owners are placed by load over all the shards: an added shard may move an old one to the
        # other node, which then reads it from storage once more (at most).
        before, after = owners(old, peers), owners(sorted(shards.glob("*.tar")), peers)
        moved = sum(p.stat().st_size for p in old if after[p] != before[p])
        assert tar_bytes(shards) <= sum(f["storage_bytes_read"] for f in figures) <= tar_bytes(shards) + moved
        assert all(f["bytes_from_peers"] > 0 for f in figures)


@contextlib.contextmanager
def a_read_waiting_for_its_owner(nodes, tmp_path):
    """Nodes A and B on storage whose reads of a shard B owns hang (while the flag exists): a read
    of its first member through A, on a thread, is waiting for B, who is reading storage.
    Yields (A, B, the member's digest, the flag, the thread, [the bytes it read])."""
    src = tmp_path / "src"
    digests = write_shards(src, shards=4, members=4, largest=200_000)
    mnt = tmp_path / "storage"
    for _ in range(100):  # the ports are random: until B owns a shard (half of the tries do)
        peers = addresses(2)
        owned = [p.name for p, who in owners(sorted(src.glob("*.tar")), peers, lambda p: mnt / p.name).items()
                 if who == peers[1]]
        if owned:
            break
    slow = owned[0]
    flag = tmp_path / "hang"
    with hanging_storage(tmp_path, src, slow, flag) as storage:
        a, b = nodes([storage] * 2, peers=peers)
        try:
            with tarfile.open(src / slow) as tf:
                name = tf.getmembers()[0].name
            flag.touch()
            got = []
            thread = threading.Thread(target=lambda: got.append(open(os.path.join(a.path, name), "rb").read()),
                                      daemon=True)
            thread.start()
            wait_for(lambda: a.stats()["peers"]["waits_for_owner"] > 0, "no read through A waits for its owner")
            yield a, b, digests[name], flag, thread, got
        finally:  # the nodes before the storage they read
            flag.unlink(missing_ok=True)
            for node in (a, b):
                force_unmount(node.path, node.pid)


def test_an_owner_busy_reading_storage_is_waited_for_not_marked_down(nodes, tmp_path):
    """The owner's storage read takes longer than the 2 s a peer gets to answer: it is alive
    (it answers the sign-of-life request), so the reader waits for it and gets the bytes from it;
    no node reads that shard from storage but the owner."""
    with a_read_waiting_for_its_owner(nodes, tmp_path) as (a, _b, digest, flag, thread, got):
        flag.unlink()
        thread.join(timeout=60)
        assert got and hashlib.sha256(got[0]).hexdigest() == digest
        figures = a.stats()["peers"]
        assert figures["down"] == [] and figures["storage_bytes_read"] == 0 and figures["bytes_from_peers"] > 0


def test_an_owner_unmounted_while_serving_a_read_of_hung_storage_exits_at_once(nodes, tmp_path, monkeypatch):
    """A peer request in flight at unmount (the owner reading storage that hangs) must not keep
    the owner's daemon alive: it exits within `shardfs umount`'s wait, not when storage gives up."""
    monkeypatch.setenv("SHARDFS_STORAGE_TIMEOUT", "120")  # far longer than the wait below
    with a_read_waiting_for_its_owner(nodes, tmp_path) as (_a, b, _digest, _flag, _thread, _got):
        done = shardfs_cmd("umount", "--wait", "10", b.path)
        assert done.returncode == 0, done.stderr
        assert not process_alive(b.pid)  # (a zombie until its parent, init, reaps it)
        assert "unmounted" in b.log()


def member_shard(name: str) -> str:
    """The shard file write_shards put a member in (``c1/f3_4.bin``: part-03.tar)."""
    return f"part-{int(name.split('/f')[1].split('_')[0]):02d}.tar"


def test_a_shard_moved_between_survivors_comes_from_its_former_owner(nodes, dataset):
    """Node D is killed. With D down the bounded loads move some shard M from survivor S1 to
    survivor S2 (addresses chosen so they do): S2 gets M's bytes from S1, who holds them in RAM,
    not from storage. Storage then reads D's shards alone, once; every file right through each
    survivor."""
    shards, digests = dataset
    files = sorted(shards.glob("*.tar"))
    for _ in range(200):  # the ports are random: until losing the last node moves a shard between the others
        peers = addresses(4)
        before, after = owners(files, peers), owners(files, peers, down=[peers[3]])
        moved = [p for p in files if before[p] != peers[3] and after[p] != before[p]]
        if moved:
            break
    else:
        raise AssertionError("no 4 addresses found by which losing one moves a shard between the others")
    mounts = nodes([shards] * 4, peers=peers)
    survivors, d = mounts[:3], mounts[3]
    # Each node reads only what it owns: every shard in its owner's RAM, nowhere else.
    for m in mounts:
        mine = {name: want for name, want in digests.items() if before[shards / member_shard(name)] == m.address}
        assert check_all(m.path, mine) == []
    # (the owners' loaders fill the rest of each shard after the reads: every shard whole in RAM)
    wait_for(lambda: storage_read(mounts) == tar_bytes(shards), "the owners have not loaded their shards whole")
    stored = storage_read(survivors)
    os.kill(d.pid, signal.SIGKILL)
    lost = {name: want for name, want in digests.items() if before[shards / member_shard(name)] == d.address}
    for m in survivors:  # a read of D's shards finds D down
        assert check_all(m.path, lost, drop=True) == []
        wait_for(lambda m=m: d.address in m.stats()["peers"]["down"], f"{m.address} has not found D down")
    for m in survivors:
        assert check_all(m.path, digests, drop=True) == []
    # D's shards from storage once; the moved ones from their former owners' RAM.
    assert storage_read(survivors) - stored == sum(p.stat().st_size for p in files if before[p] == d.address)
    assert sum(m.stats()["peers"]["bytes_from_previous_owners"] for m in survivors) == \
        sum(p.stat().st_size for p in moved)
    assert all(m.stats()["read_errors"] == 0 for m in survivors)
    # (the new owners load the moved shards as soon as they find D down, before their former owners evict them)
    assert any("moved to this node from peers that are up" in m.log() for m in survivors)
    metrics = [samples(shardfs_cmd("stats", m.path, "--format", "prometheus", check=True).stdout) for m in survivors]
    assert sum(got[("shardfs_peer_previous_owner_bytes_total", None)][0] for got in metrics) == \
        sum(p.stat().st_size for p in moved)
