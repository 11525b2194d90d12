"""What the fuzz targets (tests/fuzz/targets/) share: a bound on what one input may allocate, and
a scratch file for parsers that read a path. Not a target itself (tools/fuzz.py and
tests/test_fuzz_targets.py take the modules under targets/ only)."""

from __future__ import annotations

import contextlib
import os
import tempfile
import tracemalloc

_SCRATCH = None


@contextlib.contextmanager
def bounded(limit: int, what: str = "the parser"):
    """Fails (AssertionError) when the block's Python allocations (numpy's too) peak above ``limit``
    bytes: a size read from the input must not become an allocation of that size. (libFuzzer's
    -rss_limit_mb bounds the whole process too, C allocations included, but only after the fact.)"""
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= limit, f"{what} allocated {peak} bytes for one input (bound {limit})"


def scratch_path(name: str) -> str:
    """A path in this process's own temporary directory (removed at exit), for parsers that take a
    file name: the same path each time, so an input costs one write, no directory churn."""
    global _SCRATCH
    if _SCRATCH is None:
        _SCRATCH = tempfile.TemporaryDirectory(prefix="shardfs-fuzz-", dir=os.environ.get("TMPDIR", "/var/tmp"))
    return os.path.join(_SCRATCH.name, name)


def write_scratch(name: str, data: bytes) -> str:
    path = scratch_path(name)
    with open(path, "wb") as f:
        f.write(data)
    return path
