"""storage.readers_first: readers' storage reads before background loads, and the background's turns."""

import threading

from conftest import DEADLINE, wait_for
from shardfs.storage.readers_first import QUIET_S, SHORT_RUN, ReadersFirst

FULL = 8


class Clock:
    """Time that moves only when the test says: whether readers waited "recently" does not
    depend on how soon a thread runs on a loaded machine."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _held_back(priority: ReadersFirst, entered: threading.Event) -> bool:
    """A background thread is provably waiting for its turn: it sleeps on the condition (the state,
    not a pause long enough for it to have got there), and has not entered."""
    def waiting() -> bool:
        assert not entered.is_set(), "it got a turn"
        return len(priority._cv._waiters) == 1

    wait_for(waiting, "no thread waits for a turn")
    return not entered.is_set()


def _background_in_thread(priority: ReadersFirst, run: int = FULL):
    """A thread that takes a background turn and holds it until ``release`` is set."""
    entered, release, got = threading.Event(), threading.Event(), []

    def take():
        with priority.background(run) as allowed:
            got.append(allowed)
            entered.set()
            release.wait(DEADLINE)

    t = threading.Thread(target=take, daemon=True)
    t.start()
    return t, entered, release, got


def test_without_readers_the_background_runs_full_runs_side_by_side():
    priority = ReadersFirst(background=2)
    a = _background_in_thread(priority)
    b = _background_in_thread(priority)
    c = None
    try:
        assert a[1].wait(DEADLINE) and b[1].wait(DEADLINE)
        assert a[3] == [FULL] and b[3] == [FULL]
        # Started only now: threads started together may enter in any order.
        c = _background_in_thread(priority)
        assert _held_back(priority, c[1])  # a third waits for one of the two
        a[2].set()
        assert c[1].wait(DEADLINE) and c[3] == [FULL]
    finally:
        for t, _, release, _ in filter(None, (a, b, c)):
            release.set()
            t.join(DEADLINE)


def test_a_reader_waiting_holds_the_background_back_until_its_read_ends():
    priority = ReadersFirst(background=2, clock=Clock())
    with priority.demand():
        t, entered, release, got = _background_in_thread(priority)
        assert _held_back(priority, entered)  # no turn while the reader's read is under way
    try:
        # The read ended: the background gets one short turn at once, while readers may still wait.
        assert entered.wait(DEADLINE) and got == [SHORT_RUN]
    finally:
        release.set()
        t.join(DEADLINE)


def test_one_background_request_per_demand_read_while_readers_wait_then_full_runs_when_quiet():
    clock = Clock()
    priority = ReadersFirst(background=2, clock=clock)
    with priority.demand():
        pass  # one demand read ended: one short turn owed
    first = _background_in_thread(priority)
    assert first[1].wait(DEADLINE) and first[3] == [SHORT_RUN]
    first[2].set()
    first[0].join(DEADLINE)
    # No turn is owed any more: the next goes only once the readers are quiet, with a full run.
    second = _background_in_thread(priority)
    try:
        assert _held_back(priority, second[1])
        clock.now += QUIET_S
        assert second[1].wait(DEADLINE) and second[3] == [FULL]
    finally:
        second[2].set()
        second[0].join(DEADLINE)
