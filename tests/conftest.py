"""Fixtures: real sample data, real tar shards, real FUSE mounts that are always unmounted."""

from __future__ import annotations

import functools
import json
import os
import shutil
import threading
import time

import pytest

from benchlib import sample
from benchlib.cli import shardfs
from benchlib.mounts import Mounted, mount_stats

shardfs_cmd = functools.partial(shardfs, timeout=300)


def fuse_available() -> bool:
    return os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None


needs_fuse = pytest.mark.skipif(not fuse_available(), reason="needs /dev/fuse and fusermount3")


def force_unmount(path: str, pid: int | None = None) -> None:
    """fusermount3 -u, then lazy; wait for the daemon (by pid, never by name), SIGTERM when it stays."""
    Mounted(path, pid=pid).unmount(wait=10)


def wait_for(condition, what: str, seconds: float = 90) -> None:
    """Until ``condition()`` holds (a state, looked at every 50 ms); fails with ``what`` after
    ``seconds``, a bound for a broken case, not a wait that a slow machine could outrun."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def read_in_background(paths: list) -> tuple[list[threading.Thread], dict]:
    """Read each file in a thread of its own: (the threads, path -> bytes or the OSError)."""
    results: dict = {}

    def read(path):
        try:
            with open(path, "rb") as f:
                results[path] = f.read()
        except OSError as exc:
            results[path] = exc

    threads = [threading.Thread(target=read, args=(p,), daemon=True) for p in paths]
    for t in threads:
        t.start()
    return threads, results


def drop_page_cache(path) -> None:
    """Make the next read of ``path`` reach its filesystem (a FUSE daemon) again."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class Mount:
    def __init__(self, path: str, pid: int, log_file: str, output: str):
        self.path, self.pid, self.log_file, self.output = path, pid, log_file, output

    def stats(self) -> dict:
        return json.loads(os.getxattr(self.path, "user.shardfs.stats"))

    def log(self) -> str:
        with open(self.log_file) as f:
            return f.read()


@pytest.fixture
def mount(tmp_path):
    """``mount(src, *options)`` mounts through the real CLI; every mount is undone at teardown."""
    made: list[Mount] = []

    def do_mount(*sources: str, options: tuple[str, ...] = (), name: str = "mnt", expect_ok: bool = True):
        mnt = tmp_path / name
        mnt.mkdir(exist_ok=True)
        log_file = str(tmp_path / f"{name}.log")
        done = shardfs_cmd("mount", *map(str, sources), str(mnt), "--log-file", log_file, *options)
        if not expect_ok:
            return done
        assert done.returncode == 0, f"mount failed:\n{done.stdout}\n{done.stderr}"
        m = Mount(str(mnt), mount_stats(str(mnt))["pid"], log_file, done.stdout + done.stderr)
        made.append(m)
        return m

    try:
        yield do_mount
    finally:
        for m in made:
            force_unmount(m.path, m.pid)


@pytest.fixture(scope="session")
def sample_tree(tmp_path_factory):
    """An ImageFolder tree of real JPEGs: 6 classes x 12 images."""
    root = tmp_path_factory.mktemp("sample")
    sample.make_imagefolder(str(root / "src"), classes=6, per_class=12, side=64)
    return root / "src"


@pytest.fixture
def tar_shards(sample_tree, tmp_path):
    """The sample packed into 4 tar shards (classes span shards), in a fresh directory per test."""
    out = tmp_path / "shards"
    sample.pack_tar_round_robin(str(sample_tree), str(out), shards=4)
    return out
