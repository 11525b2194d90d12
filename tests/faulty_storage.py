"""Storage that fails or hangs on purpose, for a test: faultyfs.py run as a real FUSE mount,
waited for, and torn down (hung reads released first) however the test ends."""

import contextlib
import os
import subprocess
import sys

from conftest import force_unmount, wait_mounted

FAULTYFS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "faultyfs.py")


@contextlib.contextmanager
def faulty_mount(src, mnt, name: str, start: int, end: int, hang_while=None):
    """``src`` served at ``mnt``; reads of ``name`` overlapping [start, end) fail with EIO, or
    with ``hang_while`` (a path) block while that file exists. Yields the faultyfs process."""
    os.makedirs(mnt, exist_ok=True)
    proc = subprocess.Popen([sys.executable, FAULTYFS, str(src), str(mnt), name, str(start), str(end),
                             *([str(hang_while)] if hang_while else [])], stderr=subprocess.DEVNULL)
    try:
        wait_mounted(mnt, proc)
        yield proc
    finally:
        if hang_while:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(hang_while)  # release blocked reads before anything is unmounted
        force_unmount(str(mnt))
        proc.terminate()
        proc.wait(timeout=10)


def held(hang_while) -> int:
    """How many reads faultyfs holds blocked now (it writes HANG_WHILE.held)."""
    try:
        with open(f"{hang_while}.held") as f:
            return int(f.read())
    except FileNotFoundError:
        return 0
