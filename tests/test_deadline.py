"""storage.deadline: a call that blocks (as a pread on a hung mount does) answers within its
timeout, its place then fails at once, and recovers when the blocked call returns."""

import threading

import pytest

from shardfs.storage import deadline


def test_a_blocked_call_times_out_its_place_fails_fast_then_recovers():
    pool, place = deadline.LocalPool(threads=4), deadline.Place("hung-folder")
    release, ran = threading.Event(), []
    with pytest.raises(deadline.NotAnswering):
        pool.run(place, release.wait, timeout=0.2)
    assert place.down_since is not None and place.stuck == 1
    with pytest.raises(deadline.NotAnswering, match="not answering"):  # at once: fn never runs
        pool.run(place, ran.append, 1, timeout=0.2)
    assert ran == []
    assert pool.run(deadline.Place("healthy-folder"), len, b"abc") == 3  # other places are not affected
    release.set()  # the hung call returns: the place answers again
    for _ in range(100):
        if place.down_since is None:
            break
        threading.Event().wait(0.02)
    assert place.down_since is None and place.stuck == 0
    assert pool.run(place, len, b"ab") == 2


def test_errors_are_answers_and_pass_through():
    pool, place = deadline.LocalPool(threads=2), deadline.Place("folder")
    with pytest.raises(FileNotFoundError):
        pool.run(place, open, "/nonexistent/shardfs-test")
    assert place.down_since is None


def test_at_most_the_pool_size_of_threads_is_ever_stuck():
    pool, release = deadline.LocalPool(threads=2), threading.Event()
    places = [deadline.Place(f"folder-{i}") for i in range(4)]
    try:
        for place in places:  # each blocks; beyond two threads the calls wait in the queue and time out
            with pytest.raises(deadline.NotAnswering):
                pool.run(place, release.wait, timeout=0.2)
        assert pool._pool._threads == 2
        assert sum(p.stuck for p in places) == 2  # the queued ones were cancelled, not left to run later
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
