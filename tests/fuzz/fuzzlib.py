"""What the fuzz targets (tests/fuzz/targets/) share: a bound on what one input may allocate, and
a scratch file for parsers that read a path. Not a target itself (tools/fuzz.py and
tests/test_fuzz_targets.py take the modules under targets/ only)."""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
import tempfile
import tracemalloc

from shardfs.errors import UsageError
from shardfs.formats import ShardFormatError, format_for
from shardfs.formats.base import Kind
from shardfs.index import shard_index
from shardfs.storage import open_shard

_SCRATCH = None


@contextlib.contextmanager
def bounded(limit: int, what: str = "the parser"):
    """Fails (AssertionError) when the block's Python allocations (numpy's too) peak above ``limit``
    bytes more than before it: a size read from the input must not become an allocation of that
    size. (libFuzzer's -rss_limit_mb bounds the whole process too, C allocations included, but only
    after the fact.) Tracing is started once and left on: started and stopped for each input, it
    leaked ~8 KB an input in CPython 3.11 (zip_index's corpus replayed in one process)."""
    if not tracemalloc.is_tracing():
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    yield
    peak = tracemalloc.get_traced_memory()[1] - base
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


def _libraries_imported() -> None:
    """What the parsers import lazily, imported before an input is measured: pyarrow imports pandas
    (~30 MB) at the first file whose schema carries pandas metadata, once per process, as in a
    daemon (an input that was the process's first counted it: a false finding when reproduced)."""
    with contextlib.suppress(ImportError):
        import pandas  # noqa: F401


def check_data_file(data: bytes, filename: str, reference) -> None:
    """A dataset file (Parquet, Arrow, HDF5) indexed as a mount indexes it (shard_index.build), from
    ``data`` written to ``filename`` (its suffix picks the format, its stem the split). Checks: a
    damaged file is refused (UsageError) or indexed with its damage recorded, never raised; every
    member's bytes read through the format's layout either fail cleanly (ShardFormatError: EIO) or
    are exactly its size and, where ``reference(path)`` (the format's own library: {(split, row):
    image bytes}, asked for the rows served only) reads the file, the bytes it gives for that row."""
    path = write_scratch(filename, data)
    _libraries_imported()
    with bounded(16 * len(data) + (16 << 20), "a dataset file's index build"):
        try:
            index = shard_index.build(path)
        except UsageError:  # no image and label columns (the damage renamed one): refused, naming them
            return
    served = {}
    shard = open_shard(path)
    try:
        layout = format_for(path).open_layout(shard, shard.size)
        for i in range(len(index)):
            if index.kind[i] != Kind.FILE:
                continue
            offset, size = int(index.offset[i]), int(index.size[i])
            try:
                got = layout.read(offset, size, shard.pread)
            except ShardFormatError:
                continue  # a damaged page: EIO for this member only
            assert len(got) == size, f"{index.name(i)!r}: {len(got)} bytes read for {size}"
            split, _, base = index.name(i).decode("utf-8", "surrogateescape").rpartition("/")
            row = base.split(".")[0]
            if row.isdigit():
                served[split, int(row)] = (index.name(i), got)
    finally:
        shard.close()
    if not served:  # nothing to compare; and a footer's absurd row count makes pyarrow allocate it
        return
    try:
        wanted = reference(path, set(served))
    except Exception:  # noqa: BLE001 - the library refuses the damaged file its own way: nothing to compare
        return
    for key, value in wanted.items():
        assert value == served[key][1], f"{served[key][0]!r}: not the bytes the format's library reads"


def sample_images(count: int, size: int = 300) -> list[bytes]:
    """Small distinct "JPEGs" (the magic bytes a member's name takes its extension from, then noise)."""
    import random

    rng = random.Random(count)
    return [b"\xff\xd8\xff\xe0" + rng.randbytes(size + 17 * i) for i in range(count)]


def tar_bytes(files: dict[str, bytes], fmt: int = tarfile.GNU_FORMAT) -> bytes:
    """A tar of ``files`` (name: bytes) written by tarfile in ``fmt``, every mtime alike: a seed."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(body), 1_600_000_000
            tar.addfile(info, io.BytesIO(body))
    return out.getvalue()
