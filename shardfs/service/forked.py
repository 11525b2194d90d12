"""The daemon of a detaching `shardfs mount` as a forked child of the command, not a new interpreter.

A new interpreter costs its start and every import again (measured ~0.4 s of each mount). The child
is what ``subprocess.Popen(start_new_session=True, stdin/stdout=DEVNULL, pass_fds=...)`` made
before: a session of its own, /dev/null for stdin and stdout, stderr shared until it detaches, and
no descriptor but the ones it is given. It then runs the daemon's work and leaves with os._exit, so
nothing of the command's (atexit handlers, finally blocks up the stack, buffered output) runs twice.

Forking is safe only while this process has a single thread (another thread's locks would be held
forever in the child): ``can_fork`` says so. The command forks after parsing and its checks, before
the daemon's imports (numpy's OpenBLAS starts threads) and before the progress bar's thread.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable

from shardfs import processes
from shardfs.errors import ShardfsError, one_line


def can_fork() -> bool:
    return processes.single_threaded()


class ForkedDaemon:
    """A forked child, waited for as a subprocess.Popen is (pid, poll, wait, returncode)."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its status is lost
                self.returncode = 1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"shardfs daemon (pid {self.pid})", timeout)
            time.sleep(0.02)
        return self.returncode


def _keep_only(fds: set[int]) -> None:
    """Close every descriptor but ``fds`` (as Popen's close_fds): the daemon must not hold the
    caller's pipes open, or `out=$(shardfs mount ...)` would wait for it to end."""
    low = 0
    for fd in sorted(fds) + [os.sysconf("SC_OPEN_MAX")]:
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1


def start(work: Callable[[], int], keep_fds: tuple[int, ...]) -> ForkedDaemon:
    """Fork; the child runs ``work()`` (its exit status) in a session of its own. keep_fds: the
    descriptors it keeps besides stderr (the ready pipe, a /dev/fd/N FUSE descriptor)."""
    sys.stdout.flush()
    sys.stderr.flush()  # else the child would write what is buffered here once more
    pid = os.fork()
    if pid:
        return ForkedDaemon(pid)
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        _keep_only({0, 1, 2, *keep_fds})
        code = _exit_status(work)
    finally:
        try:
            logging.shutdown()  # the daemon's log file, flushed
            sys.stderr.flush()
        finally:
            os._exit(code)


def _exit_status(work: Callable[[], int]) -> int:
    """``work()``'s status, or what `shardfs` would exit with had it raised (see cli.main)."""
    try:
        return work()
    except (ShardfsError, OSError) as exc:
        error = one_line(exc)
        print(f"shardfs: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:
        traceback.print_exc()
        return 1
