"""Storage that fails under the mount: EIO for what is affected, right bytes for the rest."""

import errno
import os
import subprocess
import sys
import time

import pytest

from conftest import force_unmount, needs_fuse
from tarcraft import archive, member

pytestmark = needs_fuse
HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def faulty(tmp_path):
    """Shards a.tar (ten 100 KB members) and b.tar behind a FUSE layer that fails reads of a
    range of a.tar, as a bad disk would. Yields (faulty mountpoint, {name: bytes}, bad member)."""
    src = tmp_path / "src"
    src.mkdir()
    files = {f"a/{i}.bin": bytes([i]) * 100_000 for i in range(10)}
    (src / "a.tar").write_bytes(archive(*(member(n.encode(), d) for n, d in files.items())))
    (src / "b.tar").write_bytes(archive(member(b"b/only.bin", b"b" * 5000)))
    files["b/only.bin"] = b"b" * 5000
    # member a/3.bin: its data starts after 3 members (512 B header + 100,352 B padded data each)
    bad_start = 3 * (512 + 100_352) + 512 + 1000
    faulty_mnt = tmp_path / "faulty"
    faulty_mnt.mkdir()
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "faultyfs.py"), str(src), str(faulty_mnt),
                             "a.tar", str(bad_start), str(bad_start + 10)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(faulty_mnt):
            assert proc.poll() is None and time.monotonic() < deadline, "faulty fs did not mount"
            time.sleep(0.05)
        yield faulty_mnt, files, "a/3.bin", proc
    finally:
        force_unmount(str(faulty_mnt))
        proc.terminate()
        proc.wait(timeout=10)


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
