"""storage.deadline: a call that blocks (as a pread on a hung mount does) answers within its
timeout, its place then fails at once, and recovers when the blocked call returns."""

import threading

import pytest

from conftest import DEADLINE, wait_for
from shardfs.storage import deadline


def _stuck_place(pool, release, name: str) -> deadline.Place:
    """A place whose call blocks (on ``release``) and times out *while it runs*. A call that times
    out still waiting for a pool thread (a busy machine can start one later than any fixed
    timeout) is cancelled instead and never runs: then it is tried again, on a fresh place, with
    twice the timeout, until a call was running when its timeout expired."""
    timeout = 0.2
    for attempt in range(10):
        place, started = deadline.Place(f"{name}-{attempt}"), threading.Event()

        def blocked():
            started.set()
            release.wait()

        with pytest.raises(deadline.NotAnswering):
            pool.run(place, blocked, timeout=timeout)
        assert place.down_since is not None
        if place.stuck:
            assert started.wait(DEADLINE)  # it runs, blocked, holding a pool thread
            return place
        assert not started.is_set()  # cancelled before it ran
        timeout *= 2
    pytest.fail("no pool thread took a call within 200 s")


def test_a_blocked_call_times_out_its_place_fails_fast_then_recovers():
    pool, release, ran = deadline.LocalPool(threads=4), threading.Event(), []
    place = _stuck_place(pool, release, "hung-folder")
    assert place.stuck == 1
    with pytest.raises(deadline.NotAnswering, match="not answering"):  # at once: fn never runs
        pool.run(place, ran.append, 1, timeout=0.2)
    assert ran == []
    assert pool.run(deadline.Place("healthy-folder"), len, b"abc") == 3  # other places are not affected
    release.set()  # the hung call returns: the place answers again
    wait_for(lambda: place.down_since is None, "the place did not recover")
    assert place.stuck == 0
    assert pool.run(place, len, b"ab") == 2


def test_errors_are_answers_and_pass_through():
    pool, place = deadline.LocalPool(threads=2), deadline.Place("folder")
    with pytest.raises(FileNotFoundError):
        pool.run(place, open, "/nonexistent/shardfs-test")
    assert place.down_since is None


def test_at_most_the_pool_size_of_threads_is_ever_stuck():
    pool, release = deadline.LocalPool(threads=2), threading.Event()
    try:
        stuck = [_stuck_place(pool, release, f"folder-{i}") for i in range(2)]  # both threads blocked
        queued = [deadline.Place(f"folder-{i}") for i in range(2, 4)]
        for place in queued:  # no thread left: the calls wait in the queue and time out
            with pytest.raises(deadline.NotAnswering):
                pool.run(place, release.wait, timeout=0.2)
        assert pool._pool._threads == 2
        assert [p.stuck for p in stuck + queued] == [1, 1, 0, 0]  # the queued ones were cancelled, not left to run later
    finally:
        release.set()


def test_a_local_shard_is_changed_only_on_a_definite_answer(tmp_path):
    from shardfs.storage.base import ShardIOError
    from shardfs.storage.local import LocalShard

    path = tmp_path / "a.tar"
    path.write_bytes(b"x" * 1024)
    shard = LocalShard.open(str(path))
    assert shard.changed() is False
    shard.place.timed_out()  # its folder stopped answering: a stat cannot tell anything now
    with pytest.raises(ShardIOError, match="cannot tell whether it changed"):
        shard.changed()
    shard.place.answered()
    path.write_bytes(b"y" * 2048)
    assert shard.changed() is True
    path.unlink()
    assert shard.changed() is True  # gone is a definite answer
