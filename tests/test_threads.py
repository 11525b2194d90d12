"""DaemonPool: an Executor whose work still under way never keeps the process from exiting."""

import subprocess
import sys
import threading

import pytest

from shardfs.storage.threads import DaemonPool

# A job that never returns (a read of storage that hangs), then the end of the program.
STUCK_AT_EXIT = """
import threading, sys
from concurrent.futures import ThreadPoolExecutor
from shardfs.storage.threads import DaemonPool
pool = {pool}
started = threading.Event()
pool.submit(lambda: (started.set(), threading.Event().wait()))
started.wait()
pool.shutdown(wait=False, cancel_futures=True)
print("done", flush=True)
"""


@pytest.mark.parametrize("pool, exits", [("DaemonPool(2, 'test')", True),
                                         ("ThreadPoolExecutor(2)", False)])  # the reason DaemonPool exists
def test_work_under_way_at_exit_is_abandoned_not_waited_for(pool, exits):
    proc = subprocess.Popen([sys.executable, "-c", STUCK_AT_EXIT.format(pool=pool)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "done\n"
        try:
            assert proc.wait(timeout=5) == 0
            assert exits
        except subprocess.TimeoutExpired:
            assert not exits
    finally:
        proc.kill()
        proc.wait()


def test_results_errors_cancelled_work_and_the_thread_bound():
    pool, release = DaemonPool(2, "test", initializer=lambda: setattr(marks, "ran", True)), threading.Event()
    marks = threading.local()
    assert pool.submit(lambda: getattr(marks, "ran", False)).result(timeout=10) is True  # on a pool thread
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(timeout=10)
    started = threading.Semaphore(0)
    busy = [pool.submit(lambda: (started.release(), release.wait())[1]) for _ in range(2)]
    assert started.acquire(timeout=10) and started.acquire(timeout=10)  # both under way
    queued = pool.submit(lambda: "never")
    assert pool._threads == 2  # no third thread: the third job waits in the queue
    pool.shutdown(cancel_futures=True)
    assert queued.cancelled()
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)
    release.set()
    assert all(f.result(timeout=10) is True for f in busy)  # work under way finishes
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("test-"))
