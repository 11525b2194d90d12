"""processes: worker pools started from a process whose other threads hold locks."""

import os
import select
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor

from shardfs import processes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HELD = threading.Lock()  # held by another thread while the pool starts: forked as held


def _takes_the_lock() -> int:
    with HELD:
        return os.getpid()


class HeldElsewhere:
    """HELD, taken by a thread of its own for the duration of the block."""

    def __enter__(self):
        self.taken, self.done = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold, daemon=True)
        self.thread.start()
        assert self.taken.wait(60)
        return self

    def _hold(self):
        with HELD:
            self.taken.set()
            self.done.wait(120)

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join(60)


def _stop(pool: ProcessPoolExecutor) -> None:
    workers = list(pool._processes)  # the pids of processes we started (a hung one never ends)
    pool.shutdown(wait=False, cancel_futures=True)
    for pid in workers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _parent(parent):
    global PARENT
    PARENT = parent


PARENT = "not initialised"


def _work_and_parent() -> tuple[int, object]:
    with HELD:
        return os.getpid(), PARENT


def test_a_pool_made_while_another_thread_holds_a_lock_runs_work_that_takes_it():
    with HeldElsewhere():
        pool = processes.pool(1, _parent)
        future = pool.submit(_work_and_parent)
    try:
        worker, parent = future.result(timeout=120)
        assert worker != os.getpid()
        assert parent is None  # a fork server's child: not ours to watch
    finally:
        _stop(pool)


def test_a_single_threaded_process_forks_its_workers_itself():
    """(In a process of its own: this one has other tests' threads.)"""
    code = ("import os, test_processes as t; from shardfs import processes\n"
            "pool = processes.pool(1, t._parent)\n"
            "worker, parent = pool.submit(t._work_and_parent).result(timeout=120)\n"
            "print(parent == os.getpid() and worker != os.getpid())\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), REPO])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.stdout.strip() == "True", done.stderr


def test_the_helpers_a_threaded_process_starts_do_not_hold_its_stderr():
    """As a daemon does before it is ready: stderr is the pipe its `shardfs mount` reads to its
    end. The process makes a pool (it has a thread: from a fork server), runs work, then lets go
    of that pipe and lives on; the pipe must end then, not when the fork server does."""
    code = ("import os, threading, time, test_processes as t; from shardfs import processes\n"
            "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
            "with processes.pool(1) as pool:\n"
            "    pool.submit(t._takes_the_lock).result(timeout=120)\n"
            "print('built', flush=True)\n"
            "null = os.open(os.devnull, os.O_WRONLY); os.dup2(null, 1); os.dup2(null, 2)\n"
            "time.sleep(600)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), REPO])}
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        out, deadline = b"", time.monotonic() + 120
        waiting = select.poll()  # (not select(): the suite may have over 1,024 descriptors open)
        waiting.register(child.stdout, select.POLLIN)
        while time.monotonic() < deadline:
            if waiting.poll(1000):
                chunk = os.read(child.stdout.fileno(), 4096)
                if not chunk:
                    break  # the pipe's end: nobody holds it
                out += chunk
        else:
            raise AssertionError(f"the pipe never ended (output so far: {out!r})")
        assert out.strip() == b"built" and child.poll() is None  # it lives on, as a daemon does
    finally:
        child.kill()
        child.wait(60)
