"""Compressed tar shards (formats/compressed.py, formats/ctar.py): the bytes of a `.tar.gz`,
`.tar.zst`, `.tar.xz` or `.tar.bz2` shard as a user's file would hold them, indexed (one
decompression, spooled) and then read back member by member through the serving path
(``StreamShard``, which decompresses again front to back).

Checked beyond "no crash": a stream shardfs accepts decompresses to exactly what the codec's
reference decoder gives (gzip: the standard library's zlib; zstd: zstandard's decompressobj, frame
by frame; xz, bzip2: the standard library, every stream); every file member is served as those
bytes at its offset, and as Python's tarfile reads that member where tarfile reads it. Damage
is a ShardFormatError (the index's error), never bytes served. Each read is bounded (the spool
goes to a scratch file, the stream hands out at most what is asked). The spool a daemon's build
makes in the RAM cache's room (none, some, more than the stream needs) holds those bytes too,
and gives back or hands over every byte of room it took.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import tarfile
import tempfile

import zstandard
from fuzzlib import tar_bytes
from test_compressed_tars import CountedRoom

from shardfs.formats import compressed
from shardfs.formats.base import Kind
from shardfs.formats.ctar import SpooledShard, StreamShard
from shardfs.index import shard_index
from shardfs.storage.base import ShardIOError
from shardfs.storage.buffers import HUGE
from shardfs.storage.local import LocalShard

_DIR = tempfile.mkdtemp(prefix="ctar-fuzz-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)


def _zstd_reference(data: bytes) -> bytes:
    out, rest = [], data
    while rest:
        obj = zstandard.ZstdDecompressor().decompressobj()
        out.append(obj.decompress(rest))
        if not obj.eof:
            raise zstandard.ZstdError("cut short")
        rest = obj.unused_data
    return b"".join(out)


_REFERENCE = {"gzip": gzip.decompress, "zstd": _zstd_reference,
              "xz": lambda d: lzma.decompress(d, format=lzma.FORMAT_XZ), "bzip2": bz2.decompress}


def _reference(codec: str, data: bytes) -> bytes | None:
    try:
        return _REFERENCE[codec](data)
    except (OSError, EOFError, ValueError, lzma.LZMAError, zstandard.ZstdError):
        return None


def one_input(data: bytes) -> None:
    path = os.path.join(_DIR, "x.tar.gz")  # (the first bytes choose the codec, whatever the suffix)
    with open(path, "wb") as f:
        f.write(data)
    ix = shard_index.build(path)
    codec = compressed.codec_of(data)
    if codec is None:
        assert ix.format != "ctar" or len(ix) == 0, "members of a stream no codec reads"
        return  # read as a plain tar (the tar targets fuzz that)
    if ix.error is not None:
        assert len(ix) == 0, "members served from a refused stream"
        return
    reference = _reference(codec.name, data)
    assert reference is not None, f"{codec.name}: accepted a stream its reference decoder refuses"
    assert ix.logical_size == len(reference), "a decompressed size the reference does not give"
    try:
        members = {m.name: tar.extractfile(m).read() for tar in [tarfile.open(fileobj=io.BytesIO(reference), mode="r:")]
                   for m in tar.getmembers() if m.isfile()}
    except (tarfile.TarError, OSError, ValueError, EOFError):
        members = {}
    st = os.stat(path)
    _spooled_in_memory(LocalShard(path, st.st_size, st.st_mtime_ns), reference, room=len(data) % 3 * HUGE)
    shard = StreamShard(LocalShard(path, st.st_size, st.st_mtime_ns), ix.logical_size)
    try:
        for i in range(len(ix)):
            if ix.kind[i] != Kind.FILE or i in ix.sparse:
                continue
            start, size = int(ix.offset[i]), int(ix.size[i])
            got = shard.pread(start, size)
            assert got == reference[start : start + size], f"member {ix.name(i)!r}: wrong bytes"
            name = ix.name(i).decode("utf-8", "surrogateescape")
            if name in members and len(members[name]) == size:
                assert got == members[name], f"member {name!r}: not what tarfile reads"
    except ShardIOError:
        raise AssertionError("a stream the index was built from fails when served") from None
    finally:
        shard.close()


def _spooled_in_memory(stored: LocalShard, reference: bytes, room: int) -> None:
    """The spool a daemon's build makes, in a RAM room of ``room`` bytes (none, one huge page,
    two: on disk, in memory, moved from memory to disk as it grows): the reference's bytes, and
    every byte of room given back or handed over with the buffer."""
    r = CountedRoom(room)
    spooled = SpooledShard(stored, scratch=_DIR, room=r)
    try:
        assert spooled.size == len(reference) and spooled.pread(0, spooled.size) == reference, "spooled bytes differ"
        buf = spooled.take_buffer()
        if buf is not None:
            assert len(buf) == r.held and buf[: len(reference)] == reference, "the spool's buffer differs"
            r.give_back(len(buf))
            buf.close()
    finally:
        spooled.close()
        stored.close()
    assert r.held == 0, f"{r.held} bytes of room kept"


def seeds() -> list[bytes]:
    plain = tar_bytes({"a/one.txt": b"one\n" * 50, "a/b/two.bin": bytes(range(256)) * 8, "c.cls": b"3"})
    half = len(plain) // 2
    cctx = zstandard.ZstdCompressor(write_checksum=True)
    whole = [gzip.compress(plain), cctx.compress(plain), lzma.compress(plain), bz2.compress(plain)]
    pieces = [
        gzip.compress(plain[:half]) + gzip.compress(plain[half:]),  # two gzip members
        cctx.compress(plain[:half]) + cctx.compress(plain[half:]),  # two zstd frames
        lzma.compress(plain[:half]) + lzma.compress(plain[half:]),  # two xz streams
        bz2.compress(plain[:half]) + bz2.compress(plain[half:]),  # two bzip2 streams
        gzip.compress(plain) + bytes(512),  # zero padding after the member
    ]
    damaged = []
    for good in whole:
        damaged.append(good[: len(good) * 2 // 3])  # cut short
        flipped = bytearray(good)
        flipped[len(good) // 2] ^= 0x20
        damaged.append(bytes(flipped))
    return whole + pieces + damaged + [b"\x1f\x8b", b"\x28\xb5\x2f\xfd" + bytes(8), b"BZh9", b""]
