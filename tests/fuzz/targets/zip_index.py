"""shardfs's zip reader (formats/zip.py): the end records (zip64 locator and record included), the
central directory's entries and extra fields (zip64, extended timestamp), the local headers checked
against them, and members read through the layout (stored, deflate, bzip2, lzma), on a zip's bytes.

Beyond "no crash": a zip that scans has every stored member's range inside the file; each member
read through the layout either fails cleanly (ShardFormatError) or gives exactly its size; where
Python's zipfile reads the same member (same name, one of that name), the bytes are zipfile's; the
columns path (index/plain.py) and the records path agree on the members; the scan and each read
allocate at most a few times the zip's size plus what the declared sizes allow (a zip bomb must not
become memory).
"""

from __future__ import annotations

import io
import zipfile

from fuzzlib import bounded
from test_fuzz_tar_writers import MemorySource

from shardfs.formats import zip as zipformat
from shardfs.formats.base import VIRTUAL, Kind, ShardFormatError
from shardfs.formats.lz4shard import BlockCache

_OEM_HOSTS = (0, 6, 10, 14)


def _zipfile_members(data: bytes) -> dict[bytes, bytes | None]:
    """Name (as shardfs names it) -> the bytes zipfile reads, None where it cannot; {} if it refuses."""
    try:
        z = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, IndexError, OverflowError, NotImplementedError):
        return {}
    found: dict[bytes, bytes | None] = {}
    counts: dict[bytes, int] = {}
    for info in z.infolist():
        if "\0" in info.filename:
            continue
        utf8 = info.flag_bits & 0x800 or info.create_system in _OEM_HOSTS
        name = info.filename.encode("utf-8" if utf8 else "cp437", "surrogateescape")
        counts[name] = counts.get(name, 0) + 1
        try:
            found[name] = z.read(info) if info.file_size <= 1 << 20 else None
        except Exception:  # noqa: BLE001 - whatever zipfile refuses is not compared
            found[name] = None
    return {n: v for n, v in found.items() if counts[n] == 1}


def one_input(data: bytes) -> None:
    src = MemorySource(data)
    with bounded(64 * len(data) + (4 << 20), "the scan"):
        result = zipformat.FORMAT.scan(src)
        columns = zipformat.FORMAT.scan(src, columns=True)
    if result.error is not None:
        assert not result.members and columns.error == result.error
        return
    if columns.columns is not None:
        assert [(r.path, r.kind, r.offset, r.size) for r in columns.columns.records()] == [
            (r.path, r.kind, r.offset, r.size) for r in result.members]
    layout = zipformat.ZipLayout(src)
    layout._cache = BlockCache(8 << 20)  # of its own: the process-wide one would carry bytes between inputs
    layout._id = layout._cache.owner()
    reference = _zipfile_members(data)
    for m in result.members:
        if m.kind != Kind.FILE:
            continue
        if not m.offset & VIRTUAL:
            assert 0 <= m.offset and m.offset + m.size <= len(data), f"{m.path!r}: beyond the file"
        if m.size > 1 << 20:
            continue
        try:
            with bounded(8 * (m.size + len(data)) + (4 << 20), f"a read of {m.path!r}"):
                got = bytes(layout.read(m.offset, m.size, src.pread))
        except ShardFormatError:
            continue
        assert len(got) == m.size, f"{m.path!r}: {len(got)} bytes read for {m.size}"
        want = reference.get(m.path)
        if want is not None:
            assert got == want, f"{m.path!r}: bytes differ from zipfile's"


def seeds() -> list[bytes]:
    out = []
    for method in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", method) as z:
            z.writestr("a/b.txt", b"hello " * 50)
            z.writestr("a/c.bin", bytes(range(256)))
            z.mkdir("empty")
            link = zipfile.ZipInfo("a/link")
            link.external_attr = 0o120777 << 16
            z.writestr(link, b"b.txt")
        out.append(buf.getvalue())
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:  # zip64 local headers
        with z.open("big", "w", force_zip64=True) as f:
            f.write(b"x" * 1000)
    out.append(buf.getvalue())

    class Pipe(io.RawIOBase):  # no seek: data descriptors
        def __init__(self):
            self.b = bytearray()

        def writable(self):
            return True

        def write(self, b):
            self.b += b
            return len(b)

    pipe = Pipe()
    with zipfile.ZipFile(pipe, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("streamed.txt", "w") as f:
            f.write(b"streamed " * 100)
    out.append(bytes(pipe.b))
    good = out[1]
    out += [good[: len(good) // 2], good[:-5], good[:-22] + b"PK\x05\x06" + b"\0" * 18]
    return out


def _warm() -> None:
    """What a first scan and read import (numpy's parts, the decompressors), imported now: the
    bounds above count what an input makes, not a module's first import."""
    for seed in seeds():
        src = MemorySource(seed)
        layout = zipformat.ZipLayout(src)
        for m in zipformat.FORMAT.scan(src).members:
            if m.kind == Kind.FILE:
                layout.read(m.offset, m.size, src.pread)


_warm()
