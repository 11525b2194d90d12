"""Storage that fails under the mount: EIO for what is affected, right bytes for the rest."""

import errno
import os

import pytest

from conftest import (DEADLINE, drop_page_cache, needs_fuse, read_concurrently, read_in_background, read_or_none,
                      wait_for)
from faulty_storage import faulty_mount, held
from tarcraft import archive, member

pytestmark = needs_fuse


def _faulty_storage(tmp_path, hang_while=None):
    """Shards a.tar (ten 100 KB members) and b.tar behind a FUSE layer (faultyfs.py) that fails
    reads of a range of a.tar, as a bad disk would; with ``hang_while``, reads of all of a.tar
    block while that file exists, as on a hung network mount.
    Yields (faulty mountpoint, {name: bytes}, bad member, faultyfs process)."""
    src = tmp_path / "src"
    src.mkdir()
    files = {f"a/{i}.bin": bytes([i]) * 100_000 for i in range(10)}
    (src / "a.tar").write_bytes(archive(*(member(n.encode(), d) for n, d in files.items())))
    (src / "b.tar").write_bytes(archive(member(b"b/only.bin", b"b" * 5000)))
    files["b/only.bin"] = b"b" * 5000
    # member a/3.bin: its data starts after 3 members (512 B header + 100,352 B padded data each)
    bad_start, bad_end = 3 * (512 + 100_352) + 512 + 1000, 3 * (512 + 100_352) + 512 + 1010
    if hang_while:
        bad_start, bad_end = 0, (src / "a.tar").stat().st_size
    faulty_mnt = tmp_path / "faulty"
    with faulty_mount(src, faulty_mnt, "a.tar", bad_start, bad_end, hang_while) as proc:
        yield faulty_mnt, files, "a/3.bin", proc


@pytest.fixture
def faulty(tmp_path):
    yield from _faulty_storage(tmp_path)


@pytest.fixture
def hanging(tmp_path):
    """As ``faulty``, with reads of a.tar blocking while the yielded flag file exists."""
    flag = tmp_path / "hang"
    for faulty_mnt, files, _bad, _proc in _faulty_storage(tmp_path, hang_while=flag):
        yield faulty_mnt, files, flag


def _read(root, name):
    with open(os.path.join(root, name), "rb") as f:
        return f.read()


@pytest.mark.parametrize("cache", ["1G", "1"])  # shards cached whole / read member by member
def test_an_io_error_affects_only_the_reads_that_touch_it(faulty, mount, cache):
    faulty_mnt, files, bad, _proc = faulty
    m = mount(faulty_mnt, options=("--cache-size", cache))
    for _ in range(2):  # twice: a failed range stays failed, good members stay good
        for name, data in files.items():
            if name == bad:
                with pytest.raises(OSError) as exc:
                    _read(m.path, name)
                assert exc.value.errno == errno.EIO
            else:
                assert _read(m.path, name) == data
            os.posix_fadvise(os.open(os.path.join(m.path, name), os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED)
    assert "read error at offset" in m.log()
    stats = m.stats()
    assert stats["read_errors"] >= 2 and stats["shards_broken"] == 0


def test_storage_that_goes_away_answers_eio_and_the_daemon_survives(faulty, mount, tmp_path):
    faulty_mnt, files, _bad, proc = faulty
    m = mount(faulty_mnt, options=("--cache-size", "1"))  # nothing cached: every read goes to storage
    assert _read(m.path, "b/only.bin") == files["b/only.bin"]
    proc.kill()  # the storage's server dies: its mount stops answering ("not connected")
    proc.wait()
    with pytest.raises(OSError) as exc:
        _read(m.path, "a/5.bin")
    assert exc.value.errno == errno.EIO
    assert os.path.ismount(m.path) and os.listdir(os.path.join(m.path, "a"))  # the tree still answers
    assert m.stats()["read_errors"] >= 1


def test_a_hung_mount_holds_storage_threads_not_fuse_workers(mount, hanging, monkeypatch):
    """A pread on a hung mount blocks in the kernel: it must hold a storage thread, not the FUSE
    workers. Storage reads here wait as long as the hang lasts (the timeout is far beyond the
    test), so the rest of the tree must answer while they are provably held, and nothing but the
    end of the hang can release them. (``mount`` comes first so that ``hanging`` is torn down
    first: blocked reads are released before shardfs unmounts.)"""
    import threading

    monkeypatch.setenv("SHARDFS_STORAGE_TIMEOUT", "3600")
    faulty_mnt, files, flag = hanging
    m = mount(faulty_mnt, options=("--cache-size", "1G"))
    assert _read(m.path, "b/only.bin") == files["b/only.bin"]  # b.tar is in the RAM cache now
    flag.touch()  # reads of a.tar block from now on
    names = [f"a/{i}.bin" for i in range(4)]
    try:
        threads, results = read_in_background([os.path.join(m.path, n) for n in names])
        wait_for(lambda: held(flag) >= 1, "no read reached the hung storage")

        def rest_answers():  # cached bytes, listings, attributes
            for _ in range(3):
                drop_page_cache(os.path.join(m.path, "b/only.bin"))
                assert _read(m.path, "b/only.bin") == files["b/only.bin"]
                assert sorted(os.listdir(os.path.join(m.path, "a"))) == [f"{i}.bin" for i in range(10)]
                assert os.stat(os.path.join(m.path, "a/9.bin")).st_size == 100_000
            checked.set()

        checked = threading.Event()
        checker = threading.Thread(target=rest_answers, daemon=True)
        checker.start()
        assert checked.wait(DEADLINE), "the rest of the tree waited for the hung reads"
        assert held(flag) >= 1 and all(t.is_alive() for t in threads) and not results
    finally:
        flag.unlink()  # the storage answers again: the held reads get their bytes
    for t in threads:
        t.join(timeout=DEADLINE)
    assert results == {os.path.join(m.path, n): files[n] for n in names}


def test_a_hung_mount_gives_eio_in_bounded_time_and_reads_recover(mount, hanging, monkeypatch):
    """The reads a hung mount holds answer EIO within SHARDFS_STORAGE_TIMEOUT, and the same files
    are served again once it answers."""
    monkeypatch.setenv("SHARDFS_STORAGE_TIMEOUT", "5")
    faulty_mnt, files, flag = hanging
    m = mount(faulty_mnt, options=("--cache-size", "1G"))
    assert _read(m.path, "b/only.bin") == files["b/only.bin"]
    flag.touch()
    try:
        paths = [os.path.join(m.path, f"a/{i}.bin") for i in range(4)]
        assert read_concurrently(paths) == dict.fromkeys(paths, errno.EIO)
        assert "no answer within 5 s" in m.log()
    finally:
        flag.unlink()  # the mount answers again
    wait_for(lambda: read_or_none(os.path.join(m.path, "a/5.bin")) == files["a/5.bin"], "reads did not recover")
    for name, data in files.items():
        assert _read(m.path, name) == data
    assert "answers again" in m.log()
    stats = m.stats()
    assert stats["shards_broken"] == 0
    assert stats["cache"]["shards_cached"] == 2  # what failed in the outage was loaded again after it
