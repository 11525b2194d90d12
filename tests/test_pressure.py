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

from conftest import (DEADLINE, memory_v1_root, needs_fuse, needs_memory_v1, remove_cgroup, shardfs_cmd,
                      wait_for)
from shardfs.fuse.stats import STATS_XATTR
from shardfs.service.mount import process_alive
from shardfs.storage.local import LocalShard
from shardfs.storage.memory import cgroup_memory_limit, memory_cgroups, memory_room, parse_size, share_budget
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
    assert said.startswith("--cache-size 25% of the ")
    # the same kind of room as memory_room names: this process's cgroup limit, else the node's memory
    assert ("left under the cgroup limit" in said) == ("cgroup limit" in why) != ("available on the node" in said)
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


# ---- cgroup v2, laid out as the kernel writes it ----------------------------------------
# This machine kind binds the memory controller to cgroup v1 (its unified hierarchy has only
# hugetlb), so the v2 path cannot run for real here. These tests give the watcher's own reading
# code (memory_cgroups, meminfo, PSI) a /proc and a cgroup2 tree with the files and formats a
# v2 node has, as a Slurm job (cgroup/v2 plugin) sees them; the v1 path runs for real below.

class V2Node:
    """A /proc and a mounted cgroup2 tree under ``root``, for a process in a Slurm job's step
    whose job cgroup has ``memory.max`` = ``limit`` (the levels above and below have none)."""

    JOB = "system.slice/slurmstepd.scope/job_42"
    TASK = f"{JOB}/step_0/user/task_0"

    def __init__(self, root, limit: int, node_available: int = 64 << 30):
        self.proc, self.cgroup_root, self.limit = root / "proc", root / "sys/fs/cgroup", limit
        (self.proc / "self").mkdir(parents=True)
        (self.proc / "pressure").mkdir()
        (self.proc / "self/mounts").write_text(
            "/dev/vda1 / ext4 rw,relatime 0 0\n"
            f"cgroup2 {self.cgroup_root} cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate,memory_recursiveprot 0 0\n")
        (self.proc / "self/cgroup").write_text(f"0::/{self.TASK}\n")  # v2 only: one line, no controllers
        (self.proc / "meminfo").write_text(
            f"MemTotal:       {(128 << 30) >> 10} kB\nMemFree:        {node_available >> 10} kB\n"
            f"MemAvailable:   {node_available >> 10} kB\n")
        self.node_psi(0.0)
        # the root cgroup has no memory.max; every level below it has one, "max" where unlimited
        parts = self.TASK.split("/")
        for depth in range(len(parts) + 1):
            folder = self.cgroup_root.joinpath(*parts[:depth])
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
            if depth:
                (folder / "memory.max").write_text("max\n")
                (folder / "memory.current").write_text("0\n")
        self.job = self.cgroup_root / self.JOB
        (self.job / "memory.max").write_text(f"{limit}\n")
        self.set(current=0, inactive_file=0, limit_hits=0, psi=0.0)

    def set(self, current=None, inactive_file=None, limit_hits=None, psi=None) -> None:
        """What the kernel would write in the job's cgroup now."""
        if current is not None:
            (self.job / "memory.current").write_text(f"{current}\n")
        if inactive_file is not None:
            (self.job / "memory.stat").write_text(
                f"anon 1048576\nfile {inactive_file + 4096}\nkernel 262144\nshmem 0\n"
                f"inactive_anon 0\nactive_anon 1048576\ninactive_file {inactive_file}\nactive_file 4096\n"
                "unevictable 0\npgfault 1234\n")
        if limit_hits is not None:
            (self.job / "memory.events").write_text(
                f"low 0\nhigh 0\nmax {limit_hits}\noom 0\noom_kill 0\noom_group_kill 0\n")
        if psi is not None:
            (self.job / "memory.pressure").write_text(_psi_text(psi))

    def headroom(self, left: int) -> None:
        """Usage such that ``left`` bytes remain under the limit (no reclaimable cache)."""
        self.set(current=self.limit - left, inactive_file=0)

    def node_psi(self, avg10: float) -> None:
        (self.proc / "pressure/memory").write_text(_psi_text(avg10))


def _psi_text(avg10: float) -> str:
    return (f"some avg10={avg10:.2f} avg60=0.00 avg300=0.00 total=1234\n"
            "full avg10=0.00 avg60=0.00 avg300=0.00 total=567\n")


@pytest.fixture
def cached_shards(tmp_path):
    """A real cache holding 4 shards of 8 MiB, budget 64 MiB."""
    shards = [LocalShard.open(p) for p in _shard_files(tmp_path / "shards", 4, 8 * MiB)]
    cache = ShardCache(shards, budget=64 * MiB)
    try:
        for shard in shards:
            cache.fetch(shard, 0, 1)
        assert cache.snapshot()["used_bytes"] == 32 * MiB
        yield cache
    finally:
        cache.close()
        for shard in shards:
            shard.close()


def test_v2_job_limit_is_found_and_its_headroom_measured(tmp_path, cached_shards):
    node = V2Node(tmp_path, limit=2 << 30)
    node.set(current=1 << 30, inactive_file=300 * MiB)
    job_max = f"{node.job}/memory.max"
    groups = memory_cgroups(str(node.proc))
    # only the job's level binds: "max" above and below it is no limit, the root has no memory.max
    assert [(g.folder, g.v2, g.limit, g.limit_file) for g in groups] == [(str(node.job), True, 2 << 30, job_max)]
    assert cgroup_memory_limit(str(node.proc)) == ((1 << 30), job_max)  # the budget's room: no cache counted
    watcher = PressureWatcher(cached_shards, calm=0.0, proc_root=str(node.proc))
    assert (watcher.low, watcher.high) == (128 * MiB, 256 * MiB)  # 1/16 of the 2 GiB limit, and twice that
    assert watcher.psi_file == f"{node.job}/memory.pressure"  # the job's own stalls, not the node's
    watcher.check()
    assert watcher.figures()["headroom_bytes"] == (1 << 30) + 300 * MiB  # inactive file cache counts as free
    assert watcher.figures()["state"] == "calm"
    node.set(current=(2 << 30) - 64 * MiB, inactive_file=0)
    watcher.check()
    assert watcher.figures()["headroom_bytes"] == 64 * MiB and watcher.counts["shrinks"] == 1
    # a limit tighter than the node: MemAvailable is not what counts, however large
    node.headroom(1 << 30)
    (node.proc / "meminfo").write_text(f"MemTotal: {(128 << 30) >> 10} kB\nMemAvailable: {(200 * MiB) >> 10} kB\n")
    watcher.check()
    assert watcher.figures()["headroom_bytes"] == 200 * MiB  # now the node is the tighter one


def test_v2_limit_hits_and_the_jobs_own_psi_shrink_only_below_high_water(tmp_path, cached_shards, caplog):
    cache, node = cached_shards, V2Node(tmp_path, limit=2 << 30)
    watcher = PressureWatcher(cache, calm=3600.0, proc_root=str(node.proc))

    def short_now() -> bool:
        cache.resize(64 * MiB)  # the full budget again before each look, so that a shortage shrinks it
        caplog.clear()
        with caplog.at_level("WARNING", logger="shardfs.storage.pressure"):
            watcher.check()
        assert watcher.short == (cache.budget < 64 * MiB)
        return watcher.short

    node.headroom(200 * MiB)  # between low (128 MiB) and high (256 MiB) water
    assert not short_now()  # nothing says the kernel struggles
    node.node_psi(90.0)  # other jobs on the node stall: not this job's business
    assert not short_now()
    node.set(psi=25.0)  # this job's cgroup stalls
    assert short_now() and "memory PSI some avg10=25%" in caplog.text
    node.set(psi=0.0, limit_hits=3)  # the job reached memory.max three times since the last look
    assert short_now() and f"limit reached ({node.job}/memory.max)" in caplog.text
    assert not short_now()  # no new hits since: not struggling any more
    node.set(limit_hits=9, psi=50.0)
    node.headroom(1 << 30)  # both signals, but a gigabyte left: reclaim, not shortage
    assert not short_now()
    assert watcher.counts["shrinks"] == 2


def test_v2_watcher_shrinks_under_pressure_and_grows_back_with_hysteresis(tmp_path, cached_shards):
    cache, node = cached_shards, V2Node(tmp_path, limit=2 << 30)
    node.headroom(1 << 30)
    watcher = PressureWatcher(cache, calm=0.0, proc_root=str(node.proc))
    watcher.check()
    assert cache.budget == 64 * MiB and watcher.counts == {"shrinks": 0, "grows": 0}
    node.headroom(20 * MiB)  # below low water: give back enough to reach high water
    watcher.check()
    assert cache.budget == 0 and cache.snapshot()["used_bytes"] == 0  # 236 MiB short, 32 MiB cached
    assert watcher.figures()["state"] == "short" and watcher.counts["shrinks"] == 1
    node.headroom(300 * MiB)  # above low, below twice high water: neither shrink nor grow
    watcher.check()
    assert watcher.counts == {"shrinks": 1, "grows": 0} and watcher.figures()["state"] == "recovering"
    node.headroom(1 << 30)
    watcher.check()
    assert cache.budget == 64 * MiB and watcher.counts["grows"] == 1
    assert watcher.figures()["state"] == "calm"


# ---- the daemon in a real memory cgroup --------------------------------------------------

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


@needs_memory_v1
def test_headroom_is_measured_in_a_real_memory_cgroup():
    """The measurement the daemon relies on (no fake): in a cgroup with a 256 MiB limit, the
    headroom is what the limit leaves, and it falls by what a process in it allocates."""
    limit, grab = 256 * MiB, 96 * MiB
    group = os.path.join(memory_v1_root(), f"shardfs-headroom-{uuid.uuid4().hex[:8]}")
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
        remove_cgroup(group)


@needs_fuse
@pytest.mark.slow
@needs_memory_v1
def test_daemon_gives_memory_back_before_the_oom_killer(tmp_path):
    limit = 1 << 30
    group = os.path.join(memory_v1_root(), f"shardfs-pressure-{uuid.uuid4().hex[:8]}")
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

    try:
        with open(f"{group}/memory.limit_in_bytes", "w") as f:
            f.write(str(limit))
        done = subprocess.run(_in_cgroup(group, sys.executable, "-m", "shardfs", "mount", str(shards), str(mnt),
                                         "--cache-size", "300M", "--prefetch", "all", "--log-file", str(log_file)),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        daemon_pid = figures()["pid"]
        assert read_all_correct()
        wait_for(lambda: figures()["cache"]["shards_cached"] == 6, lambda: figures()["cache"])
        assert figures()["memory"]["budget_bytes"] == 300 * MiB

        # A job in the same cgroup allocates 720 MiB: with the full cache that is past the limit.
        allocator = subprocess.Popen(_in_cgroup(group, sys.executable, "-c", ALLOCATOR, "90"),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert allocator.stdout.readline().strip() == "holding", "the allocator did not get its memory"
        # The watcher looks once a second: the shrink it makes is waited for, then looked at.
        wait_for(lambda: figures()["memory"]["shrinks"] >= 1, lambda: figures()["memory"])
        squeezed = figures()
        assert squeezed["memory"]["budget_bytes"] < 300 * MiB
        assert squeezed["cache"]["used_bytes"] <= squeezed["memory"]["budget_bytes"]
        assert squeezed["cache"]["shards_evicted"] >= 1
        assert _oom_kills(group) == 0 and process_alive(daemon_pid)
        assert read_all_correct()  # served member by member now, still the right bytes

        allocator.stdin.close()
        assert allocator.wait(timeout=DEADLINE) == 0  # it exited by itself: not OOM-killed
        wait_for(lambda: figures()["memory"]["budget_bytes"] == 300 * MiB, lambda: figures()["memory"])
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
            wait_for(lambda: not process_alive(daemon_pid), "the daemon outlived its unmount")
        remove_cgroup(group)
