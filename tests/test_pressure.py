"""Memory pressure: the daemon's cache gives memory back before the OOM killer acts, and takes
it again later. Parts on their own (a real ShardCache, real /proc and /sys files), and the
whole daemon in a real memory cgroup next to a process that allocates."""

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import time
import uuid

import pytest

from conftest import needs_fuse, shardfs_cmd
from shardfs.fuse.stats import STATS_XATTR
from shardfs.service.mount import process_alive
from shardfs.storage.local import LocalShard
from shardfs.storage.memory import memory_room, parse_size, share_budget
from shardfs.storage.pressure import PressureWatcher, psi_some_avg10
from shardfs.storage.ram import ShardCache

MiB = 1 << 20


def _shard_files(folder, count: int, size: int) -> list[str]:
    folder.mkdir(exist_ok=True)
    paths = []
    for i in range(count):
        path = folder / f"s{i}.bin"
        path.write_bytes(os.urandom(size))
        paths.append(str(path))
    return paths


def test_percent_is_a_share_of_what_the_daemon_may_use():
    room, why = memory_room()
    assert parse_size("50%", room=1000) == 500
    budget, said = share_budget("25%")
    # memory_room is read again inside: the node's free memory moves a little in between
    assert 0.2 * room < budget < 0.3 * room
    assert said.startswith("--cache-size 25% of the ") and ("available on the node" in said or "cgroup" in said)
    assert share_budget("64M") == (64 * MiB, "--cache-size 64M")


def test_psi_reader_reads_some_avg10(tmp_path):
    psi = tmp_path / "memory.pressure"
    psi.write_text("some avg10=12.50 avg60=1.00 avg300=0.10 total=5\nfull avg10=3.00 avg60=0 avg300=0 total=1\n")
    assert psi_some_avg10(str(psi)) == 12.5
    assert psi_some_avg10(str(tmp_path / "missing")) is None


def test_resize_evicts_least_recently_used_and_keeps_views_valid(tmp_path):
    paths = _shard_files(tmp_path / "shards", 4, 4 * MiB)  # whole huge pages: each costs its size
    shards = [LocalShard.open(p) for p in paths]
    cache = ShardCache(shards, budget=16 * MiB)
    try:
        views = []
        for shard in shards:  # s0 is the least recently used
            views.append(cache.fetch(shard, 0, 4 * MiB))
            time.sleep(0.01)
        assert len(cache.resident) == 4
        cache.resize(9 * MiB)
        assert [s.path for s in cache.resident] == paths[2:]
        assert cache.snapshot()["budget_bytes"] == 9 * MiB and cache.snapshot()["used_bytes"] == 8 * MiB
        # A reader still holding a view of an evicted shard sees its bytes, not freed memory.
        for path, view in zip(paths, views):
            assert hashlib.sha256(view).digest() == hashlib.sha256(open(path, "rb").read()).digest()
        # Evicted shards are served again, and admitted again once the budget grows.
        cache.resize(16 * MiB)
        assert bytes(cache.fetch(shards[0], 5, 10)) == open(paths[0], "rb").read()[5:15]
        assert shards[0] in cache.resident
    finally:
        cache.close()
        for shard in shards:
            shard.close()


class _FakeRoom(PressureWatcher):
    """A watcher over a real cache whose headroom the test sets (the decisions, not /proc)."""

    def __init__(self, cache, headroom: int):
        super().__init__(cache, calm=0.0)
        self.groups, self.low, self.high, self.room = [], 64 * MiB, 128 * MiB, headroom

    def _measure(self):
        return self.room, "test"


def test_watcher_shrinks_under_pressure_and_grows_back_with_hysteresis(tmp_path):
    paths = _shard_files(tmp_path / "shards", 4, 8 * MiB)
    shards = [LocalShard.open(p) for p in paths]
    cache = ShardCache(shards, budget=64 * MiB)
    try:
        for shard in shards:
            cache.fetch(shard, 0, 1)
        watcher = _FakeRoom(cache, headroom=1 << 30)
        watcher.check()
        assert cache.budget == 64 * MiB and watcher.counts == {"shrinks": 0, "grows": 0}
        watcher.room = 20 * MiB  # below low water: give back enough to reach high water
        watcher.check()
        assert cache.budget == 0 and cache.snapshot()["used_bytes"] == 0  # 108 MiB short, 32 MiB cached
        assert watcher.figures()["state"] == "short" and watcher.counts["shrinks"] == 1
        watcher.room = 200 * MiB  # above low, below twice high water: neither shrink nor grow
        watcher.check()
        assert watcher.counts == {"shrinks": 1, "grows": 0} and watcher.figures()["state"] == "recovering"
        watcher.room = 1 << 30
        watcher.check()
        assert cache.budget == 64 * MiB and watcher.counts["grows"] == 1
        assert watcher.figures()["state"] == "calm"
    finally:
        cache.close()
        for shard in shards:
            shard.close()


# ---- the daemon in a real memory cgroup --------------------------------------------------

def _memory_v1_root() -> str | None:
    for line in open("/proc/self/mounts"):
        _dev, where, kind, options = line.split()[:4]
        if kind == "cgroup" and "memory" in options.split(","):
            return where
    return None


def _in_cgroup(group: str, *cmd: str) -> list[str]:
    return ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh", *cmd]


ALLOCATOR = r"""
import sys, time
held = []
for _ in range(int(sys.argv[1])):
    held.append(b"\x01" * (8 << 20))  # written, so really resident
    time.sleep(0.2)
print("holding", flush=True)
sys.stdin.read()  # until the test lets go
"""


def _oom_kills(group: str) -> int:
    for line in open(f"{group}/memory.oom_control"):
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


HEADROOM = r"""
import json, sys
from shardfs.storage.memory import memory_cgroups, memory_room
from shardfs.storage.pressure import PressureWatcher, psi_some_avg10
from shardfs.storage.ram import ShardCache

cache = ShardCache([], budget=1 << 20)
watcher = PressureWatcher(cache)  # the real measurement: /proc/meminfo, the cgroup's files, PSI
out = {"groups": [[g.folder, g.limit] for g in memory_cgroups()], "room": memory_room(),
       "psi": psi_some_avg10(watcher.psi_file)}
watcher.check()
out["before"] = watcher.figures()["headroom_bytes"]
held = b"\x01" * (int(sys.argv[1]) << 20)  # written, so really resident: charged to the cgroup
watcher.check()
out["after"] = watcher.figures()["headroom_bytes"]
print(json.dumps(out))
"""


@pytest.mark.skipif(os.getuid() != 0 or _memory_v1_root() is None, reason="needs root and cgroup v1 memory")
def test_headroom_is_measured_in_a_real_memory_cgroup():
    """The measurement the daemon relies on (no fake): in a cgroup with a 256 MiB limit, the
    headroom is what the limit leaves, and it falls by what a process in it allocates."""
    limit, grab = 256 * MiB, 96 * MiB
    group = os.path.join(_memory_v1_root(), f"shardfs-headroom-{uuid.uuid4().hex[:8]}")
    os.mkdir(group)
    try:
        with open(f"{group}/memory.limit_in_bytes", "w") as f:
            f.write(str(limit))
        done = subprocess.run(_in_cgroup(group, sys.executable, "-c", HEADROOM, str(grab >> 20)),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        got = json.loads(done.stdout)
        assert [group, limit] in got["groups"]  # found by walking /proc/self/cgroup
        room, why = got["room"]
        assert 0 < room < limit and "cgroup limit" in why and "memory.limit_in_bytes" in why
        assert got["before"] <= limit and got["before"] - got["after"] >= grab * 0.9
        assert got["after"] > 0
        assert got["psi"] is not None or not os.path.exists("/proc/pressure/memory")  # PSI read where the kernel has it
    finally:
        for _ in range(100):
            try:
                os.rmdir(group)
                break
            except OSError:  # the process still leaving the cgroup
                time.sleep(0.1)
    assert not os.path.exists(group)


@needs_fuse
@pytest.mark.slow
@pytest.mark.skipif(os.getuid() != 0 or _memory_v1_root() is None, reason="needs root and cgroup v1 memory")
def test_daemon_gives_memory_back_before_the_oom_killer(tmp_path):
    limit = 1 << 30
    group = os.path.join(_memory_v1_root(), f"shardfs-pressure-{uuid.uuid4().hex[:8]}")
    os.mkdir(group)
    shards = tmp_path / "shards"
    shards.mkdir()
    expected = {}
    for i in range(6):  # 6 shards of 48 MiB: the whole dataset fits the 300 MiB budget
        with tarfile.open(shards / f"s{i}.tar", "w") as tar:
            for j in range(4):
                data = os.urandom(12 * MiB)
                member = tmp_path / "m"
                member.write_bytes(data)
                tar.add(member, arcname=f"d{i}/f{j}.bin")
                expected[f"d{i}/f{j}.bin"] = hashlib.sha256(data).hexdigest()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log_file = tmp_path / "daemon.log"
    allocator = daemon_pid = None

    def figures() -> dict:
        return json.loads(os.getxattr(mnt, STATS_XATTR))

    def read_all_correct() -> bool:
        return all(hashlib.sha256(open(mnt / name, "rb").read()).hexdigest() == digest
                   for name, digest in expected.items())

    def wait_for(condition, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(0.5)
        return condition()

    try:
        with open(f"{group}/memory.limit_in_bytes", "w") as f:
            f.write(str(limit))
        done = subprocess.run(_in_cgroup(group, sys.executable, "-m", "shardfs", "mount", str(shards), str(mnt),
                                         "--cache-size", "300M", "--prefetch", "all", "--log-file", str(log_file)),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        daemon_pid = figures()["pid"]
        assert read_all_correct()
        assert wait_for(lambda: figures()["cache"]["shards_cached"] == 6, 60)
        assert figures()["memory"]["budget_bytes"] == 300 * MiB

        # A job in the same cgroup allocates 720 MiB: with the full cache that is past the limit.
        allocator = subprocess.Popen(_in_cgroup(group, sys.executable, "-c", ALLOCATOR, "90"),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert allocator.stdout.readline().strip() == "holding", "the allocator did not get its memory"
        squeezed = figures()
        assert squeezed["memory"]["budget_bytes"] < 300 * MiB and squeezed["memory"]["shrinks"] >= 1
        assert squeezed["cache"]["used_bytes"] <= squeezed["memory"]["budget_bytes"]
        assert squeezed["cache"]["shards_evicted"] >= 1
        assert _oom_kills(group) == 0 and process_alive(daemon_pid)
        assert read_all_correct()  # served member by member now, still the right bytes

        allocator.stdin.close()
        assert allocator.wait(timeout=60) == 0  # it exited by itself: not OOM-killed
        assert wait_for(lambda: figures()["memory"]["budget_bytes"] == 300 * MiB, 90)
        assert figures()["memory"]["state"] == "calm"
        assert read_all_correct()
        assert _oom_kills(group) == 0
        log = log_file.read_text()
        assert "memory short" in log and "memory calm" in log and "memory.limit_in_bytes" in log
    finally:
        if allocator is not None and allocator.poll() is None:
            allocator.kill()
            allocator.wait()
        shardfs_cmd("umount", str(mnt))
        if daemon_pid:
            wait_for(lambda: not process_alive(daemon_pid), 20)
        for _ in range(100):
            try:
                os.rmdir(group)
                break
            except OSError:  # processes still leaving the cgroup
                time.sleep(0.1)
