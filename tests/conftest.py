"""Fixtures: real sample data, real tar shards, real FUSE mounts that are always unmounted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from shardfs import sample
from shardfs.service.mount import is_stale, process_alive

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def shardfs_cmd(*args: str, check: bool = False, timeout: float = 300, env=None) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "shardfs", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)
    if check and done.returncode != 0:
        raise AssertionError(f"shardfs {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


def fuse_available() -> bool:
    return os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None


needs_fuse = pytest.mark.skipif(not fuse_available(), reason="needs /dev/fuse and fusermount3")


def force_unmount(path: str, pid: int | None = None) -> None:
    """fusermount3 -u, then lazy, then the daemon we started (by pid, never by name)."""
    for cmd in (["fusermount3", "-u", path], ["fusermount3", "-u", "-z", path]):
        if not os.path.ismount(path) and not is_stale(path):
            break
        subprocess.run(cmd, capture_output=True)
    if pid:
        try:
            os.kill(pid, 15)
        except ProcessLookupError:
            pass



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
        return json.loads(os.getxattr(self.path, "user.shardfs.fuse.stats"))

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
        m = Mount(str(mnt), json.loads(os.getxattr(mnt, "user.shardfs.fuse.stats"))["pid"], log_file,
                  done.stdout + done.stderr)
        made.append(m)
        return m

    try:
        yield do_mount
    finally:
        for m in made:
            force_unmount(m.path, None if shardfs_cmd("umount", m.path).returncode == 0 else m.pid)
            deadline = time.monotonic() + 10
            while process_alive(m.pid) and time.monotonic() < deadline:
                time.sleep(0.05)


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
