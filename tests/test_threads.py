"""DaemonPool: an Executor whose work still under way never keeps the process from exiting."""

import os
import signal
import subprocess
import sys
import threading

import pytest

from conftest import DEADLINE, wait_for
from shardfs.storage.threads import DaemonPool

# A job that never returns (a read of storage that hangs), then the end of the program. SIGUSR1
# prints where every thread is (faulthandler); an atexit handler runs once the interpreter has
# joined (or abandoned) the pool's threads.
STUCK_AT_EXIT = """
import atexit, faulthandler, signal, threading, sys
from concurrent.futures import ThreadPoolExecutor
from shardfs.storage.threads import DaemonPool
faulthandler.register(signal.SIGUSR1, all_threads=True)
atexit.register(lambda: print("exited", flush=True))
pool = {pool}
started = threading.Event()
pool.submit(lambda: (started.set(), threading.Event().wait()))
started.wait()
pool.shutdown(wait=False, cancel_futures=True)
print("done", flush=True)
"""


def _stuck_at_exit(pool: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", STUCK_AT_EXIT.format(pool=pool)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "done\n"
    return proc


def test_work_under_way_at_exit_is_abandoned_not_waited_for():
    proc = _stuck_at_exit("DaemonPool(2, 'test')")
    try:
        assert proc.wait(timeout=DEADLINE) == 0
        assert proc.stdout.read() == "exited\n"
    finally:
        proc.kill()
        proc.wait()


def test_a_plain_executor_would_wait_for_it_at_exit():
    """The reason DaemonPool exists: at exit the interpreter joins a ThreadPoolExecutor's threads,
    so a job stuck in a read keeps the process alive."""
    _waits_at_exit_for_the_stuck_job("ThreadPoolExecutor(2)")


def _waits_at_exit_for_the_stuck_job(pool: str) -> None:
    """Seen in the stack of the process (not by how long it takes): it is in the exit hook that
    joins the pool's threads. Fails at once if the process exits instead."""
    proc = _stuck_at_exit(pool)
    stacks = []
    try:
        os.set_blocking(proc.stderr.fileno(), False)

        def joining_at_exit() -> bool:
            try:
                stacks.append(os.read(proc.stderr.fileno(), 1 << 16).decode())
            except BlockingIOError:  # nothing printed since the last look
                pass
            if "in _python_exit" in "".join(stacks):  # concurrent.futures' exit hook, joining its threads
                return True
            assert proc.poll() is None, "the process exited: nothing waited for the stuck job"
            proc.send_signal(signal.SIGUSR1)  # the stacks of all threads, to stderr
            return False

        wait_for(joining_at_exit, lambda: "the interpreter is not joining the pool at exit:\n" + "".join(stacks))
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
    assert "exited" not in proc.stdout.read()


def test_results_errors_cancelled_work_and_the_thread_bound():
    pool, release = DaemonPool(2, "test", initializer=lambda: setattr(marks, "ran", True)), threading.Event()
    marks = threading.local()
    assert pool.submit(lambda: getattr(marks, "ran", False)).result(timeout=DEADLINE) is True  # on a pool thread
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(timeout=DEADLINE)
    started = threading.Semaphore(0)
    busy = [pool.submit(lambda: (started.release(), release.wait(), threading.current_thread().daemon)[2])
            for _ in range(2)]
    assert started.acquire(timeout=DEADLINE) and started.acquire(timeout=DEADLINE)  # both under way
    queued = pool.submit(lambda: "never")
    assert pool._threads == 2  # no third thread: the third job waits in the queue
    pool.shutdown(cancel_futures=True)
    assert queued.cancelled()
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)
    release.set()
    assert [f.result(timeout=DEADLINE) for f in busy] == [True, True]  # work under way finishes, on daemon threads
