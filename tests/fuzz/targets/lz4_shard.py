"""shardfs's lz4 shard reader (formats/lz4shard.py): header, footer, block table, member table,
strings, and the blocks read through its layout, on a shard's bytes.

The input's first byte says whether to recompute every checksum first (footer, tables, blocks):
the fuzzer cannot forge a CRC-32, and a writer's bug or an edited file has good ones, so half the
inputs reach the checks behind them. Beyond "no crash": a shard that scans has every file's range
inside the logical stream; each member read through the layout either fails cleanly
(ShardFormatError) or gives exactly its size, and the same bytes as the whole stream read at once
gives at its offset; a shard as the writer made it (a seed) gives back the very bytes written;
the scan allocates at most a few times the shard's size, a read at most what the format's block
size limit allows.
"""

from __future__ import annotations

import hashlib
import struct
import zlib

from fuzzlib import bounded, scratch_path
from test_fuzz_tar_writers import MemorySource

from shardfs.formats import lz4shard as lz
from shardfs.formats.base import Kind, ShardFormatError

_WRITTEN: dict[str, dict[bytes, bytes]] = {}  # sha256 of a seed shard -> what the writer was given
READ_BOUND = 3 * lz.MAX_BLOCK_SIZE + (1 << 20)  # a block decompressed, its copy, a member's bytes


def _fix_checksums(data: bytes) -> bytes:
    """The shard with every CRC-32 recomputed where the footer's offsets lie inside it."""
    out = bytearray(data)
    if len(out) < lz.HEADER_SIZE + lz.FOOTER_SIZE:
        return data
    end = len(out) - lz.FOOTER_SIZE
    fields = list(lz.FOOTER.unpack(bytes(out[end:])))
    bt_off, n_blocks, mt_off, str_off, str_size = fields[4], fields[5], fields[6], fields[8], fields[9]
    if 0 <= bt_off <= mt_off <= end and bt_off + n_blocks * lz.BLOCK_ENTRY.size <= mt_off:
        for i in range(n_blocks):
            at = bt_off + i * lz.BLOCK_ENTRY.size
            raw, stored, usize, flags, _ = lz.BLOCK_ENTRY.unpack(bytes(out[at : at + lz.BLOCK_ENTRY.size]))
            if raw + stored <= bt_off:
                out[at : at + lz.BLOCK_ENTRY.size] = lz.BLOCK_ENTRY.pack(raw, stored, usize, flags,
                                                                          zlib.crc32(out[raw : raw + stored]))
        fields[10] = zlib.crc32(out[bt_off:mt_off])
    if 0 <= mt_off <= str_off + str_size <= end:
        fields[11] = zlib.crc32(out[mt_off : str_off + str_size])
    fields[13] = 0
    footer = lz.FOOTER.pack(*fields)
    out[end:] = footer[:-4] + struct.pack("<I", zlib.crc32(footer[:-4]))
    return bytes(out)


def one_input(data: bytes) -> None:
    if not data:
        return
    shard = _fix_checksums(data[1:]) if data[0] & 1 else data[1:]
    src = MemorySource(shard)
    with bounded(4 * len(shard) + (1 << 20), "the lz4 shard scan"):
        result = lz.FORMAT.scan(src)
    if result.error is not None:
        assert not result.members
        return
    files = [m for m in result.members if m.kind == Kind.FILE]
    try:
        layout = lz.FORMAT.open_layout(src, len(shard))
    except ShardFormatError as exc:
        raise AssertionError(f"the layout refuses a shard whose scan passed: {exc}") from None
    assert all(0 <= m.offset and m.offset + m.size <= layout.logical_size for m in files)
    cache = lz.BlockCache(8 << 20)  # of its own: the process-wide one would carry bytes between inputs
    layout = lz.Lz4Layout(layout.block_size, layout.logical_size, layout._blocks, cache)
    whole = _read(layout, 0, layout.logical_size, shard) if layout.logical_size <= lz.MAX_BLOCK_SIZE else None
    got = {}
    for m in files:
        part = _read(layout, m.offset, m.size, shard)
        if part is not None:
            assert len(part) == m.size, f"{m.path!r}: {len(part)} bytes read for {m.size}"
            assert whole is None or part == whole[m.offset : m.offset + m.size], f"{m.path!r}: reads disagree"
            got[m.path] = part
    written = _WRITTEN.get(hashlib.sha256(shard).hexdigest())
    if written is not None:
        assert got == written, "a shard as the writer made it does not give back what was written"


def _read(layout, offset: int, size: int, shard: bytes) -> bytes | None:
    with bounded(READ_BOUND, "an lz4 read"):
        try:
            return layout.read(offset, size, lambda at, n: shard[at : at + n])
        except ShardFormatError:
            return None


def seeds() -> list[bytes]:
    out = []
    for block_size, files in [
        (512, {b"a/one.txt": b"hello\n" * 10, b"a/empty": b"", b"b/rand.bin": bytes(range(256)) * 5}),
        (1024, {b"x/%d.cls" % i: b"%d" % i for i in range(20)}),
        (4096, {b"big/zeros": b"\0" * 9000, b"big/text": b"the quick brown fox " * 100}),
    ]:
        path = scratch_path("seed.lz4shard")
        with lz.Lz4ShardWriter(path, block_size=block_size) as w:
            for name, body in files.items():
                w.add_file(name, body)
            w.add_dir(b"a/sub")
            w.add_symlink(b"a/link", b"one.txt")
        with open(path, "rb") as f:
            shard = f.read()
        _WRITTEN[hashlib.sha256(shard).hexdigest()] = dict(files)
        out += [b"\0" + shard, b"\1" + shard]
    damaged = bytearray(out[0][1:])
    damaged[lz.HEADER_SIZE + 3] ^= 0xFF  # a data block's byte: its CRC-32 no longer matches
    out.append(b"\0" + bytes(damaged))
    return out
