"""A thread pool whose threads never keep the daemon from exiting.

``concurrent.futures.ThreadPoolExecutor`` joins its threads when the interpreter exits, even
after ``shutdown(wait=False)``: one stuck in a storage read (a hung mount, a capped disk, a
peer's request read from storage) keeps an unmounted daemon alive until that read gives up.
Here every thread is a daemon thread: work still under way at exit is abandoned, as after a
SIGKILL, so only work that a SIGKILL may cut short belongs here (storage reads; disk-tier chunk
writes, which are recorded only once whole)."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Executor, Future


class DaemonPool(Executor):
    """Up to ``threads`` daemon threads named ``name-N``, made as work arrives; ``initializer()``
    runs first on each. An Executor, so asyncio's ``run_in_executor`` takes it."""

    def __init__(self, threads: int, name: str, initializer=None):
        self._size, self._name, self._initializer = threads, name, initializer
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = 0
        self._pending = 0  # jobs queued or running
        self._closed = False
        self._lock = threading.Lock()

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._pending += 1
            if self._pending > self._threads and self._threads < self._size:
                self._threads += 1
                threading.Thread(target=self._work, name=f"{self._name}-{self._threads}", daemon=True).start()
        self._jobs.put((future, fn, args, kwargs))
        return future

    def _work(self) -> None:
        if self._initializer is not None:
            self._initializer()
        while True:
            job = self._jobs.get()
            if job is None:  # shut down
                return
            future, fn, args, kwargs = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # handed to the caller, whatever it is
                    future.set_exception(exc)
            with self._lock:
                self._pending -= 1

    def shutdown(self, wait: bool = False, *, cancel_futures: bool = False) -> None:
        """No new work; idle threads end. Never waits for work under way (``wait`` is accepted for
        the Executor interface and ignored): whoever needs that waits for its own work, boundedly."""
        with self._lock:
            self._closed = True
            threads = self._threads
        while cancel_futures:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[0].cancel()
                with self._lock:
                    self._pending -= 1
        for _ in range(threads):
            self._jobs.put(None)
