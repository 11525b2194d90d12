"""Mounts inside users' jobs: `shardfs run`, the Python API, a budget that fits the job's cgroup."""

import contextlib
import fcntl
import json
import os
import subprocess
import signal
import sys
import termios
import tempfile
import time
import uuid

import pytest

import shardfs
from benchlib import sample
from conftest import DEADLINE, memory_v1_root, needs_fuse, read_within, remove_cgroup, shardfs_cmd
from shardfs.service.api import MountError

pytestmark = needs_fuse


def _shardfs_mounts(under: str) -> list[str]:
    """Our mounts only: other jobs on the machine may mount meanwhile."""
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f if " fuse.shardfs " in line and line.split()[1].startswith(under)]


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """TMPDIR of our own, where `shardfs run` and shardfs.mounted make their temporary mountpoints."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR in this process too
    return tmp


def test_run_propagates_exit_status_and_cleans_up(tar_shards, private_tmp):
    script = 'import os, sys; print(sorted(os.listdir(os.environ["SHARDFS_MOUNT"] + "/train"))[0]); sys.exit(7)'
    done = shardfs_cmd("run", str(tar_shards), "--", sys.executable, "-c", script)
    assert done.returncode == 7, done.stderr
    assert done.stdout.strip().endswith("n00000000")
    assert _shardfs_mounts(str(private_tmp)) == [] and os.listdir(private_tmp) == []
    assert shardfs_cmd("run", str(tar_shards), "--", "true").returncode == 0


def test_run_with_mountpoint_and_a_command_killed_by_a_signal(tar_shards, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = shardfs_cmd("run", str(tar_shards), str(mnt), "--", "sh", "-c", 'ls "$SHARDFS_MOUNT" && kill -KILL $$')
    assert done.returncode == 128 + 9
    assert "train" in done.stdout
    assert not os.path.ismount(mnt) and mnt.is_dir()


def test_run_creates_a_missing_mountpoint_and_removes_what_it_made(tar_shards, tmp_path):
    mnt = tmp_path / "job-42" / "imagenet"  # neither exists: a fresh per-job path
    script = 'import os; print(os.path.ismount(os.environ["SHARDFS_MOUNT"]), sorted(os.listdir(os.environ["SHARDFS_MOUNT"])))'
    done = shardfs_cmd("run", str(tar_shards), str(mnt), "--", sys.executable, "-c", script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "['train']"]
    assert not (tmp_path / "job-42").exists()
    # a mountpoint that was there before stays, also when the command fails
    mnt.mkdir(parents=True)
    assert shardfs_cmd("run", str(tar_shards), str(mnt), "--", "false").returncode == 1
    assert mnt.is_dir() and not os.path.ismount(mnt)


def test_run_forwards_sigterm_to_the_command(tar_shards, tmp_path):
    marker = tmp_path / "got-term"
    script = (f"import signal, sys, time, pathlib\n"
              f"signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path({str(marker)!r}).write_text('x'), sys.exit(5)))\n"
              f"print('ready', flush=True)\ntime.sleep(60)\n")
    runner = subprocess.Popen([sys.executable, "-m", "shardfs", "run", str(tar_shards), "--", sys.executable, "-c",
                               script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert runner.stdout.readline().strip().endswith("ready")
        runner.terminate()
        assert runner.wait(timeout=DEADLINE) == 5
        assert marker.exists()
    finally:
        if runner.poll() is None:
            runner.kill()


def test_python_api_unmounts_also_on_exceptions(tar_shards, private_tmp):
    datasets = pytest.importorskip("torchvision.datasets")
    before = _shardfs_mounts(str(private_tmp))
    with shardfs.mounted(tar_shards, cache_size="64M") as root:
        ds = datasets.ImageFolder(os.path.join(root, "train"))
        assert len(ds) == 72 and ds[0][0].size == (64, 64)
        assert json.loads(os.getxattr(root, "user.shardfs.stats"))["cache"]["budget_bytes"] == 64 << 20
    assert _shardfs_mounts(str(private_tmp)) == before and not os.path.exists(root)

    with pytest.raises(ZeroDivisionError):
        with shardfs.mounted(tar_shards) as root:
            assert os.path.ismount(root)
            1 / 0
    assert _shardfs_mounts(str(private_tmp)) == before and not os.path.exists(root)

    with pytest.raises(MountError, match="no such file or directory"):
        with shardfs.mounted(tar_shards / "nothing-here"):
            pass


def _memory_cgroup() -> tuple[str, bool] | None:
    """(the root of a hierarchy that has the memory controller, whether it is cgroup v2), if any.
    A cgroup v2 hierarchy without it (a hybrid machine's, as here) does not count."""
    with open("/proc/self/mounts") as f:
        for line in f:
            _dev, where, kind = line.split()[:3]
            with contextlib.suppress(OSError):
                if kind == "cgroup2" and "memory" in open(f"{where}/cgroup.controllers").read().split():
                    return where, True
    v1 = memory_v1_root()
    return (v1, False) if v1 else None


@pytest.mark.skipif(os.getuid() != 0 or _memory_cgroup() is None, reason="needs root and a memory cgroup")
def test_default_budget_fits_the_jobs_memory_cgroup(tar_shards, tmp_path):
    root, v2 = _memory_cgroup()
    group = os.path.join(root, f"shardfs-test-{uuid.uuid4().hex[:8]}")
    os.mkdir(group)  # (root and the controller are there: a refusal is a failure to see)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        limit_file = "memory.max" if v2 else "memory.limit_in_bytes"
        with open(os.path.join(group, limit_file), "w") as f:
            f.write(str(2 << 30))
        # The job: enter the cgroup, then mount (the daemon inherits the cgroup).
        script = (f"echo $$ > {group}/cgroup.procs && exec {sys.executable} -m shardfs mount "
                  f"{tar_shards} {mnt} --log-file {tmp_path}/log")
        done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=DEADLINE)
        assert done.returncode == 0, done.stderr
        budget = json.loads(os.getxattr(mnt, "user.shardfs.stats"))["cache"]["budget_bytes"]
        assert 0.4 * (2 << 30) < budget <= (1 << 30)  # half of what the 2 GiB limit leaves
        assert "cgroup limit" in open(tmp_path / "log").read()
    finally:
        shardfs_cmd("umount", str(mnt))
        remove_cgroup(group)  # once the daemon has left it


def test_run_never_takes_a_second_source_for_the_mountpoint(tar_shards, tmp_path):
    extra = tmp_path / "extra"
    for i in range(2):
        (extra / "val").mkdir(parents=True, exist_ok=True)
        (extra / "val" / f"{i}.bin").write_bytes(b"v" * 100)
    other = tmp_path / "other-shards"
    sample.pack_tar_round_robin(str(extra), str(other), shards=2, prefix="val")
    count = 'import os; print(sum(len(f) for _, _, f in os.walk(os.environ["SHARDFS_MOUNT"])))'
    # Two sources and no mountpoint: an error naming -m, not a mount of the first over the second.
    for second in (str(other), str(other / "val-000000.tar"), str(other / "*.tar")):
        done = shardfs_cmd("run", str(tar_shards), second, "--", sys.executable, "-c", count)
        assert done.returncode == 2, done
        assert "looks like a source, not a mountpoint" in done.stderr and "-m MOUNTPOINT" in done.stderr
    assert sorted(os.listdir(other)) == ["val-000000.tar", "val-000001.tar"]  # nothing mounted over it
    # With -m both are sources, merged at MNT: 72 images in train/ and 2 files in val/.
    mnt = tmp_path / "mnt"
    done = shardfs_cmd("run", str(tar_shards), str(other), "-m", str(mnt), "--", sys.executable, "-c", count)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "74"
    assert not mnt.exists()



COUNTER = r"""
import collections, os, signal, sys, threading
# sigwaitinfo takes each signal as soon as it arrives and says who sent it. (Two copies sent
# close together can still merge into one, so the sender is what shows a double delivery.)
SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1}
signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
got = collections.Counter()
def count():
    while True:
        info = signal.sigwaitinfo(SIGNALS)
        sender = "terminal" if info.si_code == 0x80 else info.si_pid  # SI_KERNEL
        got[f"{signal.Signals(info.si_signo).name}<-{sender}"] += 1
        print("got", signal.Signals(info.si_signo).name, flush=True)
threading.Thread(target=count, daemon=True).start()
print("ready", os.getpid(), flush=True)
for line in sys.stdin:
    if line.strip() == "report":
        foreground = os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
        print("counts", ",".join(f"{k}={v}" for k, v in sorted(got.items())), "foreground" * foreground, flush=True)
    if line.strip() == "exit":
        break
"""

class _Command:
    """`shardfs run ... -- COUNTER`, read line by line from a pipe or a terminal."""

    def __init__(self, runner: subprocess.Popen, read_fd: int, write):
        self.runner, self.fd, self.write, self.pending = runner, read_fd, write, b""
        self.pid = int(self.until("ready ").split()[1])

    def until(self, word: str) -> str:
        """The next line with ``word``, from there on (a terminal echoes Ctrl-C as "^C" before it),
        within DEADLINE."""
        ends = time.monotonic() + DEADLINE
        while True:
            while b"\n" in self.pending:
                line, self.pending = self.pending.split(b"\n", 1)
                text = line.decode(errors="replace").strip()
                if word in text:
                    return text[text.index(word):]
            chunk = read_within(self.fd, ends, f"a line with {word!r}")
            assert chunk, f"no line with {word!r}"
            self.pending += chunk

    def counts(self) -> str:
        """What it received (after the signals' "got" lines, so duplicates would be there too); then exit."""
        self.write(b"report\n")
        counts = self.until("counts")
        self.write(b"exit\n")
        assert self.runner.wait(timeout=DEADLINE) == 0
        return counts

    def end(self) -> None:
        """On failure: kill the command (a pid we learned), so that `shardfs run` unmounts and exits."""
        if self.runner.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self.runner.wait(timeout=DEADLINE)


def test_run_passes_each_signal_to_the_command_once(tar_shards):
    runner = subprocess.Popen([sys.executable, "-m", "shardfs", "run", str(tar_shards), "--", sys.executable, "-c",
                               COUNTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)

    def write(data: bytes) -> None:
        runner.stdin.write(data)
        runner.stdin.flush()

    command = _Command(runner, runner.stdout.fileno(), write)
    try:
        os.kill(runner.pid, signal.SIGUSR1)  # to `shardfs run` alone: passed on
        command.until("got SIGUSR1")
        os.killpg(runner.pid, signal.SIGTERM)  # to its process group, as Slurm does on scancel
        command.until("got SIGTERM")
        # Each came once, from `shardfs run`: the command has a process group of its own, so the
        # group's signal did not reach it a second time, straight from the sender.
        assert command.counts().split() == ["counts", f"SIGTERM<-{runner.pid}=1,SIGUSR1<-{runner.pid}=1"]
    finally:
        command.end()


def test_run_in_a_terminal_ctrl_c_reaches_the_command_once(tar_shards):
    master, slave = os.openpty()

    def controlling_terminal() -> None:  # a new session whose terminal is the pty, as a login shell's
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    runner = subprocess.Popen([sys.executable, "-m", "shardfs", "run", str(tar_shards), "--", sys.executable, "-c",
                               COUNTER], stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                              preexec_fn=controlling_terminal)
    os.close(slave)
    try:
        command = _Command(runner, master, lambda data: os.write(master, data))
        try:
            os.write(master, b"\x03")  # Ctrl-C: the terminal signals its foreground process group
            command.until("got SIGINT")
            # From the terminal itself, once; the command owns the terminal while it runs.
            assert command.counts().split() == ["counts", "SIGINT<-terminal=1", "foreground"]
        finally:
            command.end()
    finally:
        os.close(master)
