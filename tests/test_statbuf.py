"""statbuf.fill writes libfuse's struct stat as mfusepy's ctypes layout reads it, and nothing else."""

from __future__ import annotations

import ctypes
import stat
import threading

from shardfs.fuse import statbuf
from shardfs.fuse.statbuf import fuse
from shardfs.fuse.stats import Stats


def test_fill_matches_the_ctypes_fields_and_zeroes_the_rest():
    st = fuse.c_stat()
    ctypes.memset(ctypes.byref(st), 0xAB, ctypes.sizeof(st))  # libfuse's buffer may hold anything
    statbuf.fill(st, ino=2**63 - 1, mode=stat.S_IFREG | 0o640, nlink=3, uid=1000, gid=2**32 - 2,
                 size=2**40 + 5, blocks=(2**40 + 5 + 511) // 512, mtime_ns=1_600_000_000_123_456_789)
    assert (st.st_ino, st.st_mode, st.st_nlink, st.st_uid, st.st_gid) == (2**63 - 1, stat.S_IFREG | 0o640, 3,
                                                                          1000, 2**32 - 2)
    assert (st.st_size, st.st_blocks) == (2**40 + 5, (2**40 + 5 + 511) // 512)
    for spec in (st.st_atimespec, st.st_mtimespec, st.st_ctimespec):
        assert (spec.tv_sec, spec.tv_nsec) == (1_600_000_000, 123_456_789)
    assert st.st_dev == 0 and st.st_rdev == 0 and st.st_blksize == 0
    assert statbuf._STRUCT.size == ctypes.sizeof(fuse.c_stat)


def test_counters_from_many_threads_add_up():
    stats = Stats()

    def work():
        for _ in range(10_000):
            stats.op("getattr")
            stats.served(10)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = stats.snapshot()
    assert snap["fuse_ops"] == {"getattr": 80_000, "read": 80_000}
    assert snap["bytes_served"] == 800_000 and snap["read_errors"] == 0
