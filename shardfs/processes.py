"""Worker process pools that are safe to start from a process that has threads.

fork() copies only the thread that calls it: a lock another thread held at that moment (an I/O
buffer's, a C library's, an extension's allocator) stays held forever in the child, and a worker
that needs it hangs. The daemon has threads by the time it builds indexes (the peer server, the
storage threads, the loaders), and Python 3.12 warns of every such fork. So a pool forks its workers directly only from a single-threaded process (`shardfs index`: fast,
nothing imported again); otherwise they fork from a fork server, a single-threaded interpreter
started once (it imports ``preload`` first, so each worker does not).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when a pool is made: `shardfs mount` forks its daemon without them
    from concurrent.futures import ProcessPoolExecutor


def single_threaded() -> bool:
    """One thread in this process (native ones included: /proc counts those Python did not start)."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def pool(workers: int, initializer=None, initargs: tuple = (), preload: tuple[str, ...] = ()) -> ProcessPoolExecutor:
    """A ProcessPoolExecutor whose workers never inherit another thread's held lock. Each worker
    first runs ``initializer(parent, *initargs)``: parent is this process's pid where the workers
    are its own children (forked directly), else None (a fork server's)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    direct = single_threaded() or "forkserver" not in multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if direct else "forkserver")
    if not direct:
        context.set_forkserver_preload(list(preload))
        _start_helpers_detached()
    if initializer is not None:
        initargs = (os.getpid() if direct else None, *initargs)
    return ProcessPoolExecutor(workers, mp_context=context, initializer=initializer, initargs=initargs)


def _start_helpers_detached() -> None:
    """Start the fork server and multiprocessing's resource tracker (each once per process) with
    /dev/null for stdout and stderr. They live as long as this process, and a daemon's stderr is
    the pipe its `shardfs mount` reads until the mount is ready: inherited, it would keep that
    command waiting for the pipe's end. (What workers raise reaches us through their futures. A
    line another thread writes in these few milliseconds is lost.)"""
    from multiprocessing import forkserver, resource_tracker

    null = os.open(os.devnull, os.O_WRONLY)
    saved = {}
    for fd in (1, 2):
        try:
            saved[fd] = os.dup(fd)
        except OSError:  # not open: nothing to keep from them
            saved[fd] = None
        os.dup2(null, fd)
    try:
        resource_tracker.ensure_running()
        forkserver.ensure_running()
    finally:
        for fd, was in saved.items():
            if was is None:
                os.close(fd)
            else:
                os.dup2(was, fd)
                os.close(was)
        os.close(null)
