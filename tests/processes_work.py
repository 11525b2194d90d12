"""What test_processes.py's worker pools run, in a module of its own: the processes it starts
import it, and nothing else of the suite (conftest's imports start native threads, and one test
needs a process with a single thread)."""

import os
import threading

HELD = threading.Lock()  # held by another thread while the pool starts: forked as held
PARENT = "not initialised"


def _takes_the_lock() -> int:
    with HELD:
        return os.getpid()


def _parent(parent):
    global PARENT
    PARENT = parent


def _work_and_parent() -> tuple[int, object]:
    with HELD:
        return os.getpid(), PARENT
