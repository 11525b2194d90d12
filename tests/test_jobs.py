"""Mounts inside users' jobs: `shardfs run`, the Python API, a budget that fits the job's cgroup."""

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

import shardfs
from conftest import needs_fuse, shardfs_cmd
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
        assert runner.wait(timeout=60) == 5
        assert marker.exists()
    finally:
        if runner.poll() is None:
            runner.kill()


def test_run_usage_errors(tar_shards):
    assert shardfs_cmd("run", str(tar_shards)).returncode == 2
    missing = shardfs_cmd("run", str(tar_shards), "--", "no-such-command-xyz")
    assert missing.returncode == 2 and "command not found" in missing.stderr


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


def _memory_cgroup() -> str | None:
    for line in open("/proc/self/mounts"):
        _dev, where, kind, options = line.split()[:4]
        if kind == "cgroup2":
            return where
        if kind == "cgroup" and "memory" in options.split(","):
            return where
    return None


@pytest.mark.skipif(os.getuid() != 0 or _memory_cgroup() is None, reason="needs root and a memory cgroup")
def test_default_budget_fits_the_jobs_memory_cgroup(tar_shards, tmp_path):
    root = _memory_cgroup()
    group = os.path.join(root, f"shardfs-test-{uuid.uuid4().hex[:8]}")
    v2 = os.path.exists(os.path.join(root, "cgroup.controllers"))
    try:
        os.mkdir(group)
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup here: {exc}")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        limit_file = "memory.max" if v2 else "memory.limit_in_bytes"
        try:
            with open(os.path.join(group, limit_file), "w") as f:
                f.write(str(2 << 30))
        except OSError as exc:
            pytest.skip(f"cannot set a memory limit: {exc}")
        # The job: enter the cgroup, then mount (the daemon inherits the cgroup).
        script = (f"echo $$ > {group}/cgroup.procs && exec {sys.executable} -m shardfs mount "
                  f"{tar_shards} {mnt} --log-file {tmp_path}/log")
        done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        budget = json.loads(os.getxattr(mnt, "user.shardfs.stats"))["cache"]["budget_bytes"]
        assert 0.4 * (2 << 30) < budget <= (1 << 30)  # half of what the 2 GiB limit leaves
        assert "cgroup limit" in open(tmp_path / "log").read()
    finally:
        shardfs_cmd("umount", str(mnt))
        for _ in range(50):
            try:
                os.rmdir(group)
                break
            except OSError:  # the daemon is still leaving the cgroup
                time.sleep(0.1)
