"""Fixtures: real sample data, real tar shards, real FUSE mounts that are always unmounted."""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import select
import shutil
import signal
import sys
import threading
import time
import tracemalloc

import pytest

# The suite makes its own conditions: shardfs settings from the shell that starts it (a storage
# timeout, a libfuse, a saved view, a peer key...) would change what its daemons do. Tests set
# what they need; only the suite's own knobs (SHARDFS_TEST_*) come from outside. (Before the
# imports below: some of shardfs's modules read theirs when imported.)
for _name in [name for name in os.environ if name.startswith("SHARDFS_") and not name.startswith("SHARDFS_TEST_")]:
    del os.environ[_name]

from benchlib import mounts, sample  # noqa: E402
from benchlib.cli import shardfs  # noqa: E402
from benchlib.mounts import Mounted, mount_stats  # noqa: E402

shardfs_cmd = functools.partial(shardfs, timeout=300)

# The suite runs from the venv tools/setup.sh makes (.venv/bin/python -m pytest), not activated: its
# commands (python3, shardfs, ...) come first on PATH for every process a test starts, as they would
# in an activated venv, so a job script's `python3` is the one with the packages.
if sys.prefix != sys.base_prefix:
    os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])


def fuse_available() -> bool:
    return os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None


needs_fuse = pytest.mark.skipif(not fuse_available(), reason="needs /dev/fuse and fusermount3")


needs_scontrol = pytest.mark.skipif(shutil.which("scontrol") is None,
                                    reason="needs Slurm's scontrol to expand node lists (apt-get install slurm-client)")


def force_unmount(path: str, pid: int | None = None) -> None:
    """fusermount3 -u, then lazy; wait for the daemon (by pid, never by name), SIGTERM when it stays."""
    Mounted(path, pid=pid).unmount(wait=10)


# The suite's one bound on waiting for a state: generous, so a loaded machine never reaches it
# and only a broken case does (SHARDFS_TEST_DEADLINE to change it); under half of pytest's
# --timeout (300 s, pyproject.toml), so that a wait that fails reports what it waited for
# before pytest's timeout stops the test with a bare stack.
DEADLINE = float(os.environ.get("SHARDFS_TEST_DEADLINE", "120"))


def wait_for(condition, what):
    """Until ``condition()`` returns something true, looked at every 50 ms; returns that value.
    Fails with ``what`` (a message, or a callable giving one at that moment) after DEADLINE.
    A condition may itself fail at once (an assert that the daemon still runs)."""
    deadline = time.monotonic() + DEADLINE
    while not (got := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE:.0f} s: {what() if callable(what) else what}")
        time.sleep(0.05)
    return got


def wait_mounted(mnt, proc) -> None:
    """Until ``mnt`` is a mount point (within DEADLINE); fails at once if ``proc`` (what mounts
    it) exits first, and stops it when the deadline passes."""
    mounts.wait_mounted(str(mnt), proc, DEADLINE)


def read_within(fd: int, ends: float, what) -> bytes:
    """What ``fd`` (a pipe, a pty's master) gives next, waiting for it until ``ends`` (a
    time.monotonic()); b"" at its end (a pty whose other side is closed, too). Fails as
    ``wait_for`` does, with ``what``, when ``ends`` passes first."""
    ready = select.poll()  # (not select(): the suite may have over 1,024 descriptors open)
    ready.register(fd, select.POLLIN)
    while not ready.poll(1000 * max(0.0, min(1.0, ends - time.monotonic()))):
        if time.monotonic() >= ends:
            raise AssertionError(f"not within {DEADLINE:.0f} s: {what() if callable(what) else what}")
    try:
        return os.read(fd, 65536)
    except OSError as exc:
        if exc.errno == errno.EIO:  # a pty's master once the last process holding its other side is gone
            return b""
        raise


def memory_v1_root() -> str | None:
    """Where the cgroup v1 memory controller is mounted, if it is (this machine kind: yes)."""
    with open("/proc/self/mounts") as f:
        for line in f:
            _dev, where, kind, options = line.split()[:4]
            if kind == "cgroup" and "memory" in options.split(","):
                return where
    return None


needs_memory_v1 = pytest.mark.skipif(os.getuid() != 0 or memory_v1_root() is None,
                                     reason="needs root and the cgroup v1 memory controller mounted")


def remove_cgroup(group: str) -> None:
    """rmdir a cgroup once the processes that were in it have left."""
    def removed() -> bool:
        try:
            os.rmdir(group)
        except FileNotFoundError:
            return True
        except OSError:  # a process still leaving it
            return False
        return True

    wait_for(removed, f"{group} still holds processes")


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


def read_concurrently(paths: list) -> dict:
    """Read each file on a thread of its own and wait for every read to end (fails if one is still
    waiting after DEADLINE): path -> its bytes, or the errno of its OSError."""
    threads, results = read_in_background(paths)
    for t in threads:
        t.join(DEADLINE)
    assert not any(t.is_alive() for t in threads), f"reads still waiting after {DEADLINE:.0f} s"
    return {path: got.errno if isinstance(got, OSError) else got for path, got in results.items()}


def read_or_none(path) -> bytes | None:
    """The file's bytes, or None where reading it fails (for waiting until reads recover)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


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

    def rescan(self) -> None:
        """SIGHUP, and wait until the daemon serves the new view (or logs that it kept the old):
        the stats count a changed shard as broken as the rescan finds it, before that."""
        ended = ("rescan: ", "rescan failed")
        before = sum(self.log().count(e) for e in ended)
        os.kill(self.pid, signal.SIGHUP)
        wait_for(lambda: sum(self.log().count(e) for e in ended) > before, "the rescan to end")


@pytest.fixture(autouse=True)
def memory_tracing_as_found():
    """A fuzz target run in the test process turns tracemalloc on and leaves it on (as a fuzzing
    process wants); in the suite that would slow every later test and carry its peak into the
    next test that measures one."""
    was = tracemalloc.is_tracing()
    yield
    if tracemalloc.is_tracing() and not was:
        tracemalloc.stop()


@pytest.fixture(autouse=True)
def logging_as_found():
    """A command run in the test process (cli.main) puts its own handler on the root logger, on
    the stderr pytest captured for that test; left there, every later log line went to a closed
    stream ("--- Logging error ---" in later tests' output)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in [h for h in root.handlers if h not in handlers]:
        if not type(handler).__module__.startswith("_pytest"):  # (pytest's own come and go by phase)
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)


@pytest.fixture
def mount(tmp_path):
    """``mount(src, *options)`` mounts through the real CLI; every mount is undone at teardown."""
    made: list[Mount] = []
    tried: list[str] = []  # every mountpoint asked for: a mount that never returned is undone too

    def do_mount(*sources: str, options: tuple[str, ...] = (), name: str = "mnt", expect_ok: bool = True):
        mnt = tmp_path / name
        mnt.mkdir(exist_ok=True)
        tried.append(str(mnt))
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
        for path in tried:
            if os.path.ismount(path):  # its `shardfs mount` failed or hung after the daemon mounted
                try:
                    pid = mount_stats(path)["pid"]
                except (OSError, ValueError, KeyError):
                    pid = None
                force_unmount(path, pid)


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
