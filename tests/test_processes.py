"""processes: worker pools started from a process whose other threads hold locks."""

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor

from conftest import DEADLINE, read_within
from processes_work import HELD, _parent, _work_and_parent
from shardfs import processes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD_PATH = os.pathsep.join([os.path.dirname(__file__), REPO])

class HeldElsewhere:
    """HELD, taken by a thread of its own for the duration of the block."""

    def __enter__(self):
        self.taken, self.done = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold, daemon=True)
        self.thread.start()
        assert self.taken.wait(DEADLINE)
        return self

    def _hold(self):
        with HELD:
            self.taken.set()
            self.done.wait(DEADLINE)

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join(DEADLINE)


def _stop(pool: ProcessPoolExecutor) -> None:
    workers = list(pool._processes)  # the pids of processes we started (a hung one never ends)
    pool.shutdown(wait=False, cancel_futures=True)
    for pid in workers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass




def test_a_pool_made_while_another_thread_holds_a_lock_runs_work_that_takes_it():
    with HeldElsewhere():
        pool = processes.pool(1, _parent)
        future = pool.submit(_work_and_parent)
    try:
        worker, parent = future.result(timeout=DEADLINE)
        assert worker != os.getpid()
        assert parent is None  # a fork server's child: not ours to watch
    finally:
        _stop(pool)


def test_a_single_threaded_process_forks_its_workers_itself():
    """(In a process of its own: this one has other tests' threads.)"""
    code = ("import os, processes_work as t; from shardfs import processes\n"
            "pool = processes.pool(1, t._parent)\n"
            f"worker, parent = pool.submit(t._work_and_parent).result(timeout={DEADLINE})\n"
            "print(parent == os.getpid() and worker != os.getpid())\n")
    env = {**os.environ, "PYTHONPATH": CHILD_PATH}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=DEADLINE, env=env)
    assert done.stdout.strip() == "True", done.stderr


def test_the_helpers_a_threaded_process_starts_do_not_hold_its_stderr():
    """As a daemon does before it is ready: stderr is the pipe its `shardfs mount` reads to its
    end. The process makes a pool (it has a thread: from a fork server), runs work, then lets go
    of that pipe and lives on; the pipe must end then, not when the fork server does."""
    code = ("import os, threading, time, processes_work as t; from shardfs import processes\n"
            "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
            "with processes.pool(1) as pool:\n"
            f"    pool.submit(t._takes_the_lock).result(timeout={DEADLINE})\n"
            "print('built', flush=True)\n"
            "null = os.open(os.devnull, os.O_WRONLY); os.dup2(null, 1); os.dup2(null, 2)\n"
            "time.sleep(600)\n")
    env = {**os.environ, "PYTHONPATH": CHILD_PATH}
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        out, ends = b"", time.monotonic() + DEADLINE
        while chunk := read_within(child.stdout.fileno(), ends, lambda: f"the pipe's end (output so far: {out!r})"):
            out += chunk  # (b"": the pipe's end, nobody holds it)
        assert out.strip() == b"built" and child.poll() is None  # it lives on, as a daemon does
    finally:
        child.kill()
        child.wait(DEADLINE)
