"""Tests for the lz4shard format: round trips, determinism, and hostile input.

The helpers at the top parse and assemble shards straight from the written spec
(docs/lz4shard-format.md) with struct, independently of the module under test,
so they double as a check that the spec is enough to read and write the format.
"""

from __future__ import annotations

import collections
import itertools
import math
import os
import random
import struct
import threading
import zlib

import lz4.block
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from shardfs.storage import open_shard
from shardfs.formats import lz4shard
from shardfs.formats.base import Kind, MemberRecord, ShardFormatError
from shardfs.formats.lz4shard import FORMAT, BlockCache, Lz4ShardWriter

# --------------------------------------------------------------------------- spec-level helpers

HDR = struct.Struct("<8sII")
FTR = struct.Struct("<8sIIQQQQQQQIIII")
BLK = struct.Struct("<QIIII")
MEM = struct.Struct("<B3xIQQdII")
FIELDS = (
    "magic version block_size logical_size bt_off block_count mt_off member_count "
    "str_off str_size bt_crc mt_crc reserved footer_crc"
).split()


def disassemble(data: bytes):
    """(footer dict, block entries, member entries, strings, data region) per the spec."""
    f = dict(zip(FIELDS, FTR.unpack(data[-FTR.size :])))
    blocks = [list(BLK.unpack_from(data, f["bt_off"] + BLK.size * i)) for i in range(f["block_count"])]
    members = [list(MEM.unpack_from(data, f["mt_off"] + MEM.size * i)) for i in range(f["member_count"])]
    strings = data[f["str_off"] : f["str_off"] + f["str_size"]]
    return f, blocks, members, strings, data[HDR.size : f["bt_off"]]


def assemble(f, blocks, members, strings, body, header=None, **overrides) -> bytes:
    """Build a shard with consistent offsets and checksums, then apply ``overrides`` to the footer."""
    header = HDR.pack(b"LZ4SHARD", 1, 0) if header is None else header
    bt = b"".join(BLK.pack(*b) for b in blocks)
    mt = b"".join(MEM.pack(*m) for m in members) + strings
    bt_off = HDR.size + len(body)
    f = dict(f)
    f.update(
        bt_off=bt_off, block_count=len(blocks), mt_off=bt_off + len(bt), member_count=len(members),
        str_off=bt_off + len(bt) + MEM.size * len(members), str_size=len(strings),
        bt_crc=zlib.crc32(bt), mt_crc=zlib.crc32(mt),
    )  # fmt: skip
    f.update(overrides)
    footer = FTR.pack(*(f[k] for k in FIELDS))
    if "footer_crc" not in overrides:
        footer = footer[:-4] + struct.pack("<I", zlib.crc32(footer[:-4]))
    return header + body + bt + mt + footer


def file_fetch(path):
    def fetch(offset, length):
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read(length)

    return fetch


def bytes_fetch(data: bytes):
    return lambda offset, length: data[offset : offset + length]


def write(path, entries, block_size=512):
    """entries: (kind, name, payload, mode, mtime); payload is data or a link target."""
    with Lz4ShardWriter(path, block_size=block_size) as w:
        for kind, name, payload, mode, mtime in entries:
            if kind == Kind.FILE:
                w.add_file(name, payload, mode=mode, mtime=mtime)
            elif kind == Kind.DIR:
                w.add_dir(name, mode=mode, mtime=mtime)
            else:
                w.add_symlink(name, payload, mode=mode, mtime=mtime)


def check_round_trip(path, entries):
    """Scan and read back every member; compare with what was written."""
    members = FORMAT.read_members(open_shard(str(path)))
    layout = FORMAT.open_layout(open_shard(str(path)), os.path.getsize(path))
    fetch = file_fetch(path)
    assert len(members) == len(entries)
    for m, (kind, name, payload, mode, mtime) in zip(members, entries):
        assert m.path == (name.encode() if isinstance(name, str) else name)
        assert (m.kind, m.mode, m.mtime) == (kind, mode, mtime)
        if kind == Kind.FILE:
            assert m.size == len(payload) and m.link == b""
            assert layout.read(m.offset, m.size, fetch) == payload
        elif kind == Kind.SYMLINK:
            assert m.link == (payload.encode() if isinstance(payload, str) else payload)
            assert m.size == 0
        else:
            assert (m.size, m.link) == (0, b"")
    return members, layout


def assert_refused(path):
    """The strict reader raises; scan() reports the damage instead of raising."""
    with pytest.raises(ShardFormatError) as exc:
        FORMAT.read_members(open_shard(str(path)))
    result = FORMAT.scan(open_shard(str(path)))
    assert result.members == [] and result.error == str(exc.value)


def text_blob(rng: random.Random, n: int) -> bytes:
    words = [b"cat", b"dog", b"label", b"0.5", b"shard", b"\n", b" "]
    out = bytearray()
    while len(out) < n:
        out += rng.choice(words)
    return bytes(out[:n])


# A small shard with every kind of member and both kinds of block; block_size
# 512 so that it has many blocks and flips hit blocks and tables alike.
_rng = random.Random(1234)
REF_ENTRIES = [
    (Kind.DIR, "imgs", b"", 0o755, 1.5),
    *[(Kind.FILE, f"imgs/{i}.txt", text_blob(_rng, _rng.randrange(0, 200)), 0o644, 100.0 + i) for i in range(8)],
    (Kind.FILE, "imgs/noise.bin", _rng.randbytes(1200), 0o600, 2.25),
    (Kind.FILE, "big.txt", text_blob(_rng, 1800), 0o644, 3.0),
    (Kind.FILE, "empty", b"", 0o644, 0.0),
    (Kind.SYMLINK, "latest", "imgs/0.txt", 0o777, -5.0),
]
REF_FILES = {e[1].encode(): e[2] for e in REF_ENTRIES if e[0] == Kind.FILE}


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    """(path, bytes, members) of the reference shard."""
    path = tmp_path_factory.mktemp("ref") / "ref.lz4shard"
    write(path, REF_ENTRIES)
    return path, path.read_bytes(), FORMAT.read_members(open_shard(str(path)))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("scratch")


# --------------------------------------------------------------------------- round trips


def test_reference_round_trip(ref):
    path, data, _ = ref
    check_round_trip(path, REF_ENTRIES)
    assert data[:8] == lz4shard.MAGIC and data[-88:-80] == lz4shard.FOOTER_MAGIC


def test_small_files_share_blocks(tmp_path):
    rng = random.Random(1)
    entries = [(Kind.FILE, f"f{i:04d}", text_blob(rng, rng.randrange(1, 300)), 0o644, float(i)) for i in range(300)]
    write(tmp_path / "s.lz4shard", entries, block_size=4096)
    members, layout = check_round_trip(tmp_path / "s.lz4shard", entries)
    total = sum(len(e[2]) for e in entries)
    # No per-file padding: the stream is exactly the contents, back to back.
    assert layout.logical_size == total
    assert [m.offset for m in members] == list(itertools.accumulate([0] + [m.size for m in members[:-1]]))
    _, blocks, *_ = disassemble((tmp_path / "s.lz4shard").read_bytes())
    assert len(blocks) == math.ceil(total / 4096) < len(entries)


def test_file_spanning_blocks_and_subranges(tmp_path):
    data = text_blob(random.Random(2), 5 * 1024 + 300)
    path = tmp_path / "big.lz4shard"
    write(path, [(Kind.FILE, "a", b"xyz", 0o644, 0.0), (Kind.FILE, "big", data, 0o644, 0.0)], block_size=1024)
    m = FORMAT.read_members(open_shard(str(path)))[1]
    layout = FORMAT.open_layout(open_shard(str(path)), os.path.getsize(path))
    fetch = file_fetch(path)
    assert layout.read(m.offset, m.size, fetch) == data
    for start, length in [(0, 1), (1020, 10), (1021, 2048), (m.size - 1, 1), (0, m.size), (500, 0)]:
        assert layout.read(m.offset + start, length, fetch) == data[start : start + length]


def test_empty_shard_and_dirs_only(tmp_path):
    write(tmp_path / "e.lz4shard", [])
    assert FORMAT.read_members(open_shard(str(tmp_path / "e.lz4shard"))) == []
    entries = [(Kind.DIR, "a", b"", 0o700, 0.0), (Kind.DIR, "a/b", b"", 0o755, 7.0)]
    entries.append((Kind.FILE, "a/e", b"", 0o644, 0.0))
    write(tmp_path / "d.lz4shard", entries)
    _, layout = check_round_trip(tmp_path / "d.lz4shard", entries)
    assert layout.logical_size == 0 and layout.read(0, 0, file_fetch(tmp_path / "d.lz4shard")) == b""


def test_raw_and_compressed_blocks(tmp_path):
    noise = random.Random(3).randbytes(64 * 1024)
    zeros = bytes(64 * 1024)
    write(tmp_path / "n.lz4shard", [(Kind.FILE, "n", noise, 0o644, 0.0)], block_size=16384)
    write(tmp_path / "z.lz4shard", [(Kind.FILE, "z", zeros, 0o644, 0.0)], block_size=16384)
    _, nblocks, *_ = disassemble((tmp_path / "n.lz4shard").read_bytes())
    _, zblocks, *_ = disassemble((tmp_path / "z.lz4shard").read_bytes())
    assert [b[3] for b in nblocks] == [0] * 4 and all(b[1] == b[2] for b in nblocks)
    assert [b[3] for b in zblocks] == [1] * 4 and all(b[1] < b[2] // 10 for b in zblocks)
    assert os.path.getsize(tmp_path / "z.lz4shard") < 2000
    check_round_trip(tmp_path / "n.lz4shard", [(Kind.FILE, "n", noise, 0o644, 0.0)])
    check_round_trip(tmp_path / "z.lz4shard", [(Kind.FILE, "z", zeros, 0o644, 0.0)])


def test_names_are_raw_bytes(tmp_path):
    entries = [(Kind.FILE, b"\xff\xfe/latin-\xe9", b"x", 0o644, 0.0), (Kind.FILE, "ünï/../../x", b"y", 0o644, 0.0)]
    write(tmp_path / "b.lz4shard", entries)
    members = FORMAT.read_members(open_shard(str(tmp_path / "b.lz4shard")))
    assert [m.path for m in members] == [b"\xff\xfe/latin-\xe9", "ünï/../../x".encode()]


def test_writer_masks_file_type_bits_and_validates(tmp_path):
    with Lz4ShardWriter(tmp_path / "m.lz4shard") as w:
        w.add_file("f", b"", mode=0o100644)
        for bad in ("", "a\0b", "f", "x" * 4097):
            with pytest.raises(ValueError):
                w.add_file(bad, b"")
        with pytest.raises(ValueError):
            w.add_symlink("l", "")
        with pytest.raises(ValueError):
            w.add_dir("d", mtime=float("nan"))
        with pytest.raises(ValueError):  # refused before its data reaches the stream
            w.add_file("g", b"orphan", mtime=float("inf"))
    path = tmp_path / "m.lz4shard"
    assert [(m.path, m.mode) for m in FORMAT.read_members(open_shard(str(path)))] == [(b"f", 0o644)]
    assert FORMAT.open_layout(open_shard(str(path)), os.path.getsize(path)).logical_size == 0
    for bs in (0, 511, (64 << 20) + 1):
        with pytest.raises(ValueError):
            Lz4ShardWriter(tmp_path / "x.lz4shard", block_size=bs)


def test_writer_is_atomic(tmp_path):
    path = tmp_path / "a.lz4shard"
    w = Lz4ShardWriter(path, block_size=512)
    w.add_file("f", bytes(2000))
    assert not path.exists() and (tmp_path / "a.lz4shard.tmp").exists()
    w.close()
    assert path.exists() and not (tmp_path / "a.lz4shard.tmp").exists()
    with pytest.raises(RuntimeError):
        with Lz4ShardWriter(tmp_path / "b.lz4shard") as w:
            w.add_file("f", b"data")
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == ["a.lz4shard"]


def test_deterministic(tmp_path):
    write(tmp_path / "1.lz4shard", REF_ENTRIES)
    write(tmp_path / "2.lz4shard", REF_ENTRIES)
    assert (tmp_path / "1.lz4shard").read_bytes() == (tmp_path / "2.lz4shard").read_bytes()


# --------------------------------------------------------------------------- scan touches only the tables


def test_scan_reads_only_footer_and_tables(ref, monkeypatch):
    path, data, members = ref
    f, *_ = disassemble(data)
    reads = []
    real = lz4shard._read_at
    monkeypatch.setattr(lz4shard, "_read_at", lambda fh, off, n: (reads.append((off, n)), real(fh, off, n))[1])
    result = FORMAT.scan(open_shard(str(path)))
    assert (result.members, result.warnings, result.error) == (members, [], None)
    data_region = range(HDR.size, f["bt_off"])
    assert all(off + n <= data_region.start or off >= data_region.stop for off, n in reads)
    assert sum(n for _, n in reads) == len(data) - len(data_region)


def test_scan_ignores_garbage_data_blocks_but_read_fails(ref, scratch):
    path, data, members = ref
    f, *_ = disassemble(data)
    garbage = random.Random(4).randbytes(f["bt_off"] - HDR.size)
    bad = scratch / "garbage-data.lz4shard"
    bad.write_bytes(data[: HDR.size] + garbage + data[f["bt_off"] :])
    assert FORMAT.read_members(open_shard(str(bad))) == members
    layout = FORMAT.open_layout(open_shard(str(bad)), len(data))
    big = next(m for m in members if m.path == b"big.txt")
    with pytest.raises(ShardFormatError, match="checksum"):
        layout.read(big.offset, big.size, file_fetch(bad))


# --------------------------------------------------------------------------- the block cache


def test_sequential_reads_decompress_each_block_once(tmp_path):
    data = text_blob(random.Random(5), 3 << 20)
    path = tmp_path / "seq.lz4shard"
    write(path, [(Kind.FILE, "f", data, 0o644, 0.0)], block_size=1 << 20)
    layout = FORMAT.open_layout(open_shard(str(path)), os.path.getsize(path))
    fetched = []
    real = file_fetch(path)
    fetch = lambda off, n: (fetched.append(off), real(off, n))[1]  # noqa: E731
    chunk = 128 << 10
    out = b"".join(layout.read(o, min(chunk, len(data) - o), fetch) for o in range(0, len(data), chunk))
    assert out == data
    _, blocks, *_ = disassemble(path.read_bytes())
    assert fetched == [b[0] for b in blocks]  # one fetch (and one decompression) per block


def test_block_cache_is_bounded_lru():
    entry = 100 + BlockCache.ENTRY_COST
    cache = BlockCache(max_bytes=3 * entry)
    for i in range(5):
        cache.put((0, i), bytes(100))
    assert [cache.get((0, i)) is not None for i in range(5)] == [False, False, True, True, True]
    cache.get((0, 2))  # now most recent
    cache.put((0, 9), bytes(100))
    assert cache.get((0, 3)) is None and cache.get((0, 2)) is not None
    cache.put((0, 10), bytes(3 * entry))  # larger than the whole cache: not kept
    assert cache.get((0, 10)) is None


def test_block_cache_counts_its_entries_not_only_their_bytes():
    """Found by reading: empty blocks (a damaged shard's, or empty Parquet pages) cost nothing
    against the bound, so a million of them stayed (~200 MB in a cache of 1 MB)."""
    cache = BlockCache(max_bytes=1 << 20)
    for i in range(1_000_000):
        cache.put((i, 0), b"")
    assert len(cache._items) <= (1 << 20) // BlockCache.ENTRY_COST


def test_concurrent_reads(tmp_path):
    data = text_blob(random.Random(6), 200_000) + random.Random(7).randbytes(100_000)
    path = tmp_path / "mt.lz4shard"
    write(path, [(Kind.FILE, "f", data, 0o644, 0.0)], block_size=4096)
    layout = FORMAT.open_layout(open_shard(str(path)), os.path.getsize(path))
    fetch, errors = file_fetch(path), []

    def worker(seed):
        rng = random.Random(seed)
        for _ in range(200):
            off = rng.randrange(len(data))
            n = rng.randrange(min(20_000, len(data) - off) + 1)
            if layout.read(off, n, fetch) != data[off : off + n]:
                errors.append((off, n))

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# --------------------------------------------------------------------------- hostile input, hand-made


def _mutated(data, fn):
    f, blocks, members, strings, body = disassemble(data)
    out = fn(f, blocks, members, strings, body)
    return out if isinstance(out, bytes) else assemble(f, blocks, members, strings, body)


def _set(seq, i, j, value):
    seq[i][j] = value


def _move_name_len(members, src, dst, n, field=5):
    """Shift n bytes from src's name to dst's name (field=5) or link (field=6); the sum stays valid."""
    members[src][5] -= n
    members[dst][field] += n


def _long_name(f, blocks, members, strings, body):
    extra = 5000 - members[0][5]
    members[0][5] = 5000
    return assemble(f, blocks, members, b"x" * extra + strings, body)


FILE_IDX = 1  # imgs/0.txt in REF_ENTRIES
HOSTILE_TABLES = {
    "header magic": lambda f, b, m, s, body: assemble(f, b, m, s, body, header=HDR.pack(b"LZ4SHARX", 1, 0)),
    "header version": lambda f, b, m, s, body: assemble(f, b, m, s, body, header=HDR.pack(b"LZ4SHARD", 2, 0)),
    "header reserved": lambda f, b, m, s, body: assemble(f, b, m, s, body, header=HDR.pack(b"LZ4SHARD", 1, 1)),
    "footer magic": lambda f, b, m, s, body: assemble(f, b, m, s, body, magic=b"LZ4SHENX"),
    "footer version": lambda f, b, m, s, body: assemble(f, b, m, s, body, version=2),
    "footer reserved": lambda f, b, m, s, body: assemble(f, b, m, s, body, reserved=1),
    "footer crc": lambda f, b, m, s, body: assemble(f, b, m, s, body, footer_crc=0),
    "block table crc": lambda f, b, m, s, body: assemble(f, b, m, s, body, bt_crc=1),
    "member table crc": lambda f, b, m, s, body: assemble(f, b, m, s, body, mt_crc=1),
    "huge block size": lambda f, b, m, s, body: assemble(f, b, m, s, body, block_size=1 << 30),
    "tiny block size": lambda f, b, m, s, body: assemble(f, b, m, s, body, block_size=1),
    "logical size": lambda f, b, m, s, body: assemble(f, b, m, s, body, logical_size=f["logical_size"] + 1),
    "block count": lambda f, b, m, s, body: assemble(f, b, m, s, body, block_count=len(b) + 1),
    "member count": lambda f, b, m, s, body: assemble(f, b, m, s, body, member_count=len(m) + 1),
    "member count huge": lambda f, b, m, s, body: assemble(f, b, m, s, body, member_count=1 << 60),
    "block count huge": lambda f, b, m, s, body: assemble(f, b, m, s, body, block_count=1 << 50, logical_size=1 << 59),
    "string size": lambda f, b, m, s, body: assemble(f, b, m, s, body, str_size=len(s) + 1),
    "table offset": lambda f, b, m, s, body: assemble(f, b, m, s, body, bt_off=1 << 63),
    "block flags": lambda f, b, m, s, body: _set(b, 0, 3, 2),
    "raw block size": lambda f, b, m, s, body: _set(b, 0, 3, 0),  # a compressed block claimed raw
    "compressed raw block": lambda f, b, m, s, body: _set(b, next(i for i, e in enumerate(b) if e[3] == 0), 3, 1),
    "compressed not smaller": lambda f, b, m, s, body: _set(b, 0, 1, 600),
    "block offset": lambda f, b, m, s, body: _set(b, 1, 0, b[1][0] + 1),
    "short middle block": lambda f, b, m, s, body: _set(b, 0, 2, 500),
    "member kind": lambda f, b, m, s, body: _set(m, FILE_IDX, 0, 7),
    "hardlink kind": lambda f, b, m, s, body: _set(m, FILE_IDX, 0, int(Kind.HARDLINK)),
    "mode bits": lambda f, b, m, s, body: _set(m, FILE_IDX, 1, 0o100644),
    "nan mtime": lambda f, b, m, s, body: _set(m, FILE_IDX, 4, float("nan")),
    "inf mtime": lambda f, b, m, s, body: _set(m, FILE_IDX, 4, float("-inf")),
    "beyond stream": lambda f, b, m, s, body: _set(m, FILE_IDX, 2, f["logical_size"]),
    "size wraps": lambda f, b, m, s, body: _set(m, FILE_IDX, 3, (1 << 64) - 1),
    "dir with data": lambda f, b, m, s, body: _set(m, 0, 3, 1),
    "file with link": lambda f, b, m, s, body: _move_name_len(m, FILE_IDX + 1, FILE_IDX, 1, field=6),
    "symlink without target": lambda f, b, m, s, body: (_set(m, -1, 5, m[-1][5] + m[-1][6]), _set(m, -1, 6, 0)),
    "empty name": lambda f, b, m, s, body: _move_name_len(m, 1, 0, m[1][5]),
    "long name": lambda f, b, m, s, body: _long_name(f, b, m, s, body),
    "name lengths": lambda f, b, m, s, body: _set(m, 0, 5, m[0][5] + 1),
    "nul in name": lambda f, b, m, s, body: assemble(f, b, m, s.replace(b"imgs/0", b"imgs\x000", 1), body),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_TABLES))
def test_hostile_tables_rejected(ref, scratch, case):
    path, data, _ = ref
    bad = _mutated(data, HOSTILE_TABLES[case])
    assert bad != data
    out = scratch / f"hostile-{case.replace(' ', '_')}.lz4shard"
    out.write_bytes(bad)
    assert_refused(out)


def test_block_table_damage_also_refused_by_open_layout(ref, scratch):
    path, data, _ = ref
    out = scratch / "bt.lz4shard"
    out.write_bytes(_mutated(data, HOSTILE_TABLES["block offset"]))
    with pytest.raises(ShardFormatError):
        FORMAT.open_layout(open_shard(str(out)), len(data))
    with pytest.raises(ShardFormatError, match="expected"):  # size differs from the scanned one
        FORMAT.open_layout(open_shard(str(path)), len(data) + 1)


def _one_block_shard(stored: bytes, usize: int, flags: int, bs: int = 1024) -> bytes:
    """A shard holding one file in one block whose stored bytes are ``stored``."""
    f = dict(magic=b"LZ4SHEND", version=1, block_size=bs, logical_size=usize, reserved=0, footer_crc=0)
    blocks = [[HDR.size, len(stored), usize, flags, zlib.crc32(stored)]]
    members = [[int(Kind.FILE), 0o644, 0, usize, 0.0, 1, 0]]
    return assemble(f, blocks, members, b"f", stored)


@pytest.mark.parametrize(
    "stored",
    [
        lz4.block.compress(b"a" * 900, store_size=False),  # decompresses short
        lz4.block.compress(b"a" * 1100, store_size=False),  # decompresses long
        random.Random(8).randbytes(50),  # not lz4 at all (but its checksum matches)
        b"\x00",
    ],
)
def test_block_with_wrong_uncompressed_size(scratch, stored):
    path = scratch / "oneblock.lz4shard"
    path.write_bytes(_one_block_shard(stored, 1000, 1))
    m = FORMAT.read_members(open_shard(str(path)))[0]
    layout = FORMAT.open_layout(open_shard(str(path)), os.path.getsize(path))
    with pytest.raises(ShardFormatError):
        layout.read(m.offset, m.size, file_fetch(path))


def test_spec_built_shard_reads(scratch):
    """A shard assembled from the spec alone (not by the writer) is read correctly."""
    path = scratch / "spec.lz4shard"
    path.write_bytes(_one_block_shard(lz4.block.compress(b"a" * 1000, store_size=False), 1000, 1))
    m = FORMAT.read_members(open_shard(str(path)))[0]
    assert FORMAT.open_layout(open_shard(str(path)), os.path.getsize(path)).read(0, 1000, file_fetch(path)) == b"a" * 1000
    assert m == MemberRecord(b"f", Kind.FILE, 0, 1000, 0o644, 0.0, b"")


def test_read_errors_on_short_fetch_and_bad_ranges(ref):
    path, data, members = ref
    layout = FORMAT.open_layout(open_shard(str(path)), len(data))
    with pytest.raises(ShardFormatError, match="short read"):
        layout.read(0, 10, lambda off, n: data[off : off + n - 1])
    for off, n in [(-1, 5), (layout.logical_size, 1), (layout.logical_size - 2, 3)]:
        with pytest.raises(ShardFormatError):
            layout.read(off, n, bytes_fetch(data))


# --------------------------------------------------------------------------- property-based

entry_st = st.one_of(
    st.tuples(
        st.just(Kind.FILE),
        st.one_of(
            st.binary(max_size=2000),  # mostly incompressible
            st.tuples(st.binary(min_size=1, max_size=8), st.integers(1, 300)).map(lambda t: t[0] * t[1]),  # repetitive
        ),
    ),
    st.tuples(st.just(Kind.DIR), st.just(b"")),
    st.tuples(st.just(Kind.SYMLINK), st.binary(min_size=1, max_size=50).filter(lambda b: b"\0" not in b)),
)
name_st = st.binary(min_size=1, max_size=40).filter(lambda b: b"\0" not in b)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    specs=st.lists(
        st.tuples(name_st, entry_st, st.integers(0, 0o7777), st.floats(allow_nan=False, allow_infinity=False)),
        unique_by=lambda spec: spec[0],
        max_size=20,
    ),
    block_size=st.sampled_from([512, 1000, 4096]),
    data=st.data(),
)
def test_random_member_sets_round_trip(scratch, specs, block_size, data):
    entries = [(kind, name, payload, mode, mtime) for name, (kind, payload), mode, mtime in specs]
    path = scratch / "prop.lz4shard"
    write(path, entries, block_size=block_size)
    _, layout = check_round_trip(path, entries)
    stream = b"".join(e[2] for e in entries if e[0] == Kind.FILE)
    assert layout.logical_size == len(stream)
    if stream:  # arbitrary sub-ranges of the logical stream
        off = data.draw(st.integers(0, len(stream) - 1))
        n = data.draw(st.integers(0, len(stream) - off))
        assert layout.read(off, n, file_fetch(path)) == stream[off : off + n]


def _read_all_or_refuse(path, size, original_members, fetch=None) -> int:
    """Scan + read every member of a possibly damaged shard; how many reads returned bytes.

    Anything but ShardFormatError propagates (and fails the test). Whatever is
    returned must be exactly the original: damage is either caught or harmless.
    A shard the scan refuses counts -1.
    """
    try:
        members = FORMAT.read_members(open_shard(str(path)))
    except ShardFormatError:
        return -1
    assert members == original_members  # header, footer and tables are fully checked
    try:
        layout = FORMAT.open_layout(open_shard(str(path)), size)
    except ShardFormatError:
        pytest.fail("scan accepted a shard that open_layout refused")
    fetch = fetch or file_fetch(path)
    compared = 0
    for m in members:
        if m.kind != Kind.FILE:
            continue
        want = REF_FILES[m.path]
        for off, n in [(0, m.size), (m.size // 3, m.size // 2)]:
            try:
                got = layout.read(m.offset + off, n, fetch)
            except ShardFormatError:
                continue
            assert got == want[off : off + n]
            compared += 1
    return compared


def _tally(seen: collections.Counter, compared: int) -> None:
    seen["refused by the scan" if compared < 0 else "scanned"] += 1
    seen["reads compared"] += max(compared, 0)


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def test_random_byte_flips(ref, scratch):
    path, data, members = ref
    seen = collections.Counter()

    @FUZZ
    @given(flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)), min_size=1, max_size=4))
    def flip(flips):
        bad = bytearray(data)
        for where, xor in flips:
            bad[int(where * len(data))] ^= xor
        assume(bytes(bad) != data)
        out = scratch / "flip.lz4shard"
        out.write_bytes(bad)
        _tally(seen, _read_all_or_refuse(out, len(bad), members))

    flip()
    # most flips land in data blocks: the scan passes and the reads of other blocks are compared
    assert seen["scanned"] >= 20 and seen["refused by the scan"] >= 1 and seen["reads compared"] >= 100, seen


def test_data_rot_after_scan(ref):
    """The shard changes under an open layout: reads fail or are still right."""
    path, data, members = ref
    f, *_ = disassemble(data)
    seen = collections.Counter()

    @FUZZ
    @given(flips=st.lists(st.tuples(st.integers(0, 10**9), st.integers(1, 255)), min_size=1, max_size=3))
    def rot(flips):
        bad = bytearray(data)
        for where, xor in flips:
            bad[HDR.size + where % (f["bt_off"] - HDR.size)] ^= xor
        _tally(seen, _read_all_or_refuse(path, len(data), members, fetch=bytes_fetch(bytes(bad))))

    rot()
    assert seen["reads compared"] >= 100, seen


def test_truncation(ref, scratch):
    path, data, members = ref
    seen = collections.Counter()

    @FUZZ
    @given(cut=st.integers(0, 10**9))
    def truncate(cut):
        keep = cut % len(data)
        out = scratch / "trunc.lz4shard"
        out.write_bytes(data[:keep])
        assert_refused(out)
        _tally(seen, _read_all_or_refuse(path, len(data), members, fetch=bytes_fetch(data[:keep])))

    truncate()
    assert seen["reads compared"] >= 100, seen  # the blocks before the cut


@FUZZ
@given(
    garbage=st.binary(max_size=600),
    magics=st.booleans(),
    size_fields=st.lists(st.integers(0, (1 << 64) - 1), min_size=7, max_size=7),
    small=st.lists(st.integers(0, (1 << 32) - 1), min_size=3, max_size=3),
)
def test_random_garbage(scratch, garbage, magics, size_fields, small):
    """Random files, optionally with valid magics and a footer with a valid checksum."""
    if magics:
        footer = FTR.pack(b"LZ4SHEND", 1, small[0] % (1 << 27), *size_fields, small[1], small[2], 0, 0)
        footer = footer[:-4] + struct.pack("<I", zlib.crc32(footer[:-4]))
        garbage = HDR.pack(b"LZ4SHARD", 1, 0) + garbage + footer
    out = scratch / "garbage.lz4shard"
    out.write_bytes(garbage)
    assert_refused(out)
    with pytest.raises(ShardFormatError):
        FORMAT.open_layout(open_shard(str(out)), len(garbage))


def logical_stream(members) -> bytes:
    """The reference shard's logical data stream, from what was written at each member's offset."""
    stream = bytearray(sum(m.size for m in members if m.kind == Kind.FILE))
    for m in members:
        if m.kind == Kind.FILE:
            stream[m.offset : m.offset + m.size] = REF_FILES[m.path]
    return bytes(stream)


def _check_forged(scratch, stream: bytes, seen: collections.Counter, f, blocks, members, strings, body) -> None:
    """Tables as given, with checksums recomputed: the scan refuses, or each file member's read
    refuses or gives the bytes at its place of the real logical ``stream``. Tallied in ``seen``."""
    keep = {k: f[k] for k in ("block_size", "logical_size", "block_count", "member_count", "str_size")}
    forged = assemble(f, blocks, members, strings, body, **keep)
    out = scratch / "forged.lz4shard"
    out.write_bytes(forged)
    try:
        found = FORMAT.read_members(open_shard(str(out)))
        layout = FORMAT.open_layout(open_shard(str(out)), len(forged))
    except ShardFormatError:
        seen["refused by the scan"] += 1
        return
    seen["scanned"] += 1
    for m in found:
        if m.kind == Kind.FILE:
            try:
                got = layout.read(m.offset, m.size, file_fetch(out))
            except ShardFormatError:
                seen["reads refused"] += 1
                continue
            assert got == stream[m.offset : m.offset + m.size], m
            seen["reads compared"] += 1


def test_each_block_entry_nudged(ref, scratch):
    """Every field of every block entry one off, either way (the forgeries the random test draws
    least often): refused, never another block's or a shifted block's bytes."""
    path, raw, original = ref
    stream, seen = logical_stream(original), collections.Counter()
    f, blocks, members, strings, body = disassemble(raw)
    for i, j, delta in itertools.product(range(len(blocks)), range(len(blocks[0])), (-1, 1)):
        nudged = [list(b) for b in blocks]
        nudged[i][j] = max(nudged[i][j] + delta, 0)
        _check_forged(scratch, stream, seen, f, nudged, members, strings, body)
    assert seen["refused by the scan"] + seen["reads refused"] >= len(blocks) * 5, seen


def test_forged_tables(ref, scratch):
    """Table damage with recomputed checksums exercises the semantic checks: only
    ShardFormatError, and a read the checks let through returns the bytes the shard really holds
    at that place of its logical stream (a forged member may name other bytes, never wrong ones)."""
    path, raw, original = ref
    stream = logical_stream(original)
    seen = collections.Counter()

    @FUZZ
    @given(data=st.data())
    def forge(data):
        f, blocks, members, strings, body = disassemble(raw)
        for _ in range(data.draw(st.integers(1, 3))):
            table = data.draw(st.sampled_from(["block", "member", "footer"]))
            if table == "footer":
                key = data.draw(st.sampled_from(["block_size", "logical_size", "block_count", "member_count",
                                                 "str_size"]))
                top = (1 << (32 if key == "block_size" else 64)) - 1
                f[key] = data.draw(st.one_of(st.integers(0, top),
                                             st.integers(max(f[key] - 3, 0), min(f[key] + 3, top))))
                continue
            rows = blocks if table == "block" else members
            i = data.draw(st.integers(0, len(rows) - 1))
            j = data.draw(st.integers(0, len(rows[i]) - 1))
            if isinstance(rows[i][j], float):
                rows[i][j] = data.draw(st.floats())
            else:
                limit = 1 << (64 if (table, j) in {("block", 0), ("member", 2), ("member", 3)} else 32 if j else 8)
                near = st.integers(max(rows[i][j] - 2, 0), rows[i][j] + 2)
                rows[i][j] = data.draw(st.one_of(st.integers(0, limit - 1), near))
                rows[i][j] %= limit
        _check_forged(scratch, stream, seen, f, blocks, members, strings, body)

    forge()
    # Forgeries of a field that only some reads use (a block's table entry, a member's mode or
    # time) pass the scan: the comparison above must have run on a good share of them.
    assert seen["scanned"] >= 5 and seen["refused by the scan"] >= 20 and seen["reads compared"] >= 20, seen


def test_registered_by_suffix():
    from shardfs.formats import format_for

    assert format_for("x/train-0001" + lz4shard.SUFFIX) is FORMAT
    assert (FORMAT.name, FORMAT.suffixes) == ("lz4", (".lz4shard",))
