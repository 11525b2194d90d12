"""shardfs's own lz4-compressed shard format (".lz4shard"), version 1.

The byte layout is specified in docs/lz4shard-format.md; this module is the
reference writer and reader. In short:

    header | data blocks | block table | member table | strings | footer

File contents are concatenated into one *logical data stream* which is cut into
fixed-size blocks (only the last block may be shorter); each block is stored
lz4-compressed or raw, with a crc32 of its stored bytes. Member offsets point
into the logical stream, so block ``i`` covers logical bytes
``[i * block_size, i * block_size + uncompressed_size)``.

The reader treats every byte of the file as hostile: anything malformed becomes
a ShardFormatError, and every allocation is bounded by the file size or by the
block size limit.
"""

from __future__ import annotations

import itertools
import math
import os
import struct
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import BinaryIO

import lz4.block
import numpy as np

from shardfs.formats.base import ByteSource, Fetch, Kind, MemberRecord, ScanResult, ShardFormatError
from shardfs.storage.base import ShardIOError

SUFFIX = ".lz4shard"
MAGIC = b"LZ4SHARD"  # header, offset 0
FOOTER_MAGIC = b"LZ4SHEND"  # footer, last 88 bytes
VERSION = 1

HEADER = struct.Struct("<8sII")  # magic, version, reserved (0)
FOOTER = struct.Struct("<8sIIQQQQQQQIIII")
BLOCK_ENTRY = struct.Struct("<QIIII")  # raw_offset, stored_size, uncompressed_size, flags, crc32
MEMBER_ENTRY = struct.Struct("<B3xIQQdII")  # kind, mode, offset, size, mtime, name_len, link_len
HEADER_SIZE = HEADER.size  # 16
FOOTER_SIZE = FOOTER.size  # 88

# numpy views of the same entries, for vectorised validation of big tables.
_BLOCK_DTYPE = np.dtype(
    [("raw", "<u8"), ("stored", "<u4"), ("usize", "<u4"), ("flags", "<u4"), ("crc", "<u4")]
)
_MEMBER_DTYPE = np.dtype(
    [
        ("kind", "u1"),
        ("pad", "u1", (3,)),
        ("mode", "<u4"),
        ("offset", "<u8"),
        ("size", "<u8"),
        ("mtime", "<f8"),
        ("name_len", "<u4"),
        ("link_len", "<u4"),
    ]
)
assert _BLOCK_DTYPE.itemsize == BLOCK_ENTRY.size == 24
assert _MEMBER_DTYPE.itemsize == MEMBER_ENTRY.size == 40

BLOCK_LZ4 = 1  # block flag: stored bytes are an lz4 block (no size prefix)

MIN_BLOCK_SIZE = 512
MAX_BLOCK_SIZE = 64 << 20
MAX_NAME = 4096  # bytes, for both member names and symlink targets
MAX_MEMBER_TABLES = 1 << 30  # member table + strings, bytes
_FORMAT_KINDS = (Kind.FILE, Kind.DIR, Kind.SYMLINK)  # HARDLINK is never stored


# --------------------------------------------------------------------------- writer


class Lz4ShardWriter:
    """Writes a shard to ``path + ".tmp"`` and renames it to ``path`` on close().

    Output depends only on the calls made (and on the lz4 library's compressor),
    so the same calls give byte-identical shards. Used as a context manager, an
    exception inside the ``with`` block discards the partial shard.
    """

    def __init__(self, path: str | os.PathLike, block_size: int = 1 << 20):
        if not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE:
            raise ValueError(f"block_size must be in [{MIN_BLOCK_SIZE}, {MAX_BLOCK_SIZE}]")
        self.path = os.fsdecode(path)
        self._tmp = self.path + ".tmp"
        self._bs = block_size
        self._f: BinaryIO | None = open(self._tmp, "wb")
        self._f.write(HEADER.pack(MAGIC, VERSION, 0))
        self._raw_pos = HEADER_SIZE
        self._logical = 0
        self._pending = bytearray()  # tail of the logical stream not yet cut into a block
        self._blocks: list[bytes] = []  # packed block table entries
        self._members: list[bytes] = []  # packed member table entries
        self._strings: list[bytes] = []
        self._names: set[bytes] = set()

    def __enter__(self) -> Lz4ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # -- members

    def add_file(self, name: str | bytes, data: bytes, mode: int = 0o644, mtime: float = 0.0) -> None:
        bname, mtime = self._check(name, mtime)
        view = memoryview(data).cast("B")
        offset = self._logical
        self._append(view)
        self._add(bname, Kind.FILE, offset, len(view), mode, mtime, b"")

    def add_dir(self, name: str | bytes, mode: int = 0o755, mtime: float = 0.0) -> None:
        bname, mtime = self._check(name, mtime)
        self._add(bname, Kind.DIR, 0, 0, mode, mtime, b"")

    def add_symlink(self, name: str | bytes, target: str | bytes, mode: int = 0o777, mtime: float = 0.0) -> None:
        bname, mtime = self._check(name, mtime)
        btarget = _encode(target)
        if not 1 <= len(btarget) <= MAX_NAME or b"\0" in btarget:
            raise ValueError(f"bad symlink target {btarget!r}")
        self._add(bname, Kind.SYMLINK, 0, 0, mode, mtime, btarget)

    def _check(self, name: str | bytes, mtime: float) -> tuple[bytes, float]:
        """Refuse what the reader would refuse, before anything is written."""
        if self._f is None:
            raise ValueError("writer is closed")
        bname = _encode(name)
        if not 1 <= len(bname) <= MAX_NAME or b"\0" in bname:
            raise ValueError(f"bad member name {bname!r}")
        if bname in self._names:
            raise ValueError(f"duplicate member name {bname!r}")
        if not math.isfinite(mtime := float(mtime)):
            raise ValueError(f"mtime of {bname!r} is not finite")
        return bname, mtime

    def _add(self, name: bytes, kind: Kind, offset: int, size: int, mode: int, mtime: float, link: bytes) -> None:
        # Callers often pass st_mode; only the permission bits belong in the shard.
        entry = MEMBER_ENTRY.pack(kind, mode & 0o7777, offset, size, mtime, len(name), len(link))
        self._names.add(name)
        self._members.append(entry)
        self._strings += (name, link)

    # -- data

    def _append(self, view: memoryview) -> None:
        """Add bytes to the logical stream, emitting every block that fills up."""
        bs = self._bs
        self._logical += len(view)
        if self._pending:
            take = bs - len(self._pending)
            self._pending += view[:take]
            view = view[take:]
            if len(self._pending) < bs:
                return
            self._emit(self._pending)
            self._pending = bytearray()
        while len(view) >= bs:  # whole blocks straight from the caller's buffer
            self._emit(view[:bs])
            view = view[bs:]
        self._pending += view

    def _emit(self, raw: bytes | bytearray | memoryview) -> None:
        packed = lz4.block.compress(raw, store_size=False)
        # Keep the compressed form only if it saves at least ~3%; otherwise
        # (JPEG, PNG, already-compressed data) storing raw makes reads cheaper.
        if len(packed) < len(raw) - len(raw) // 32:
            stored, flags = packed, BLOCK_LZ4
        else:
            stored, flags = bytes(raw), 0
        self._f.write(stored)
        self._blocks.append(BLOCK_ENTRY.pack(self._raw_pos, len(stored), len(raw), flags, zlib.crc32(stored)))
        self._raw_pos += len(stored)

    # -- finishing

    def close(self) -> None:
        if self._f is None:
            return
        try:
            if self._pending:
                self._emit(self._pending)
                self._pending = bytearray()
            block_table = b"".join(self._blocks)
            strings = b"".join(self._strings)
            member_tables = b"".join(self._members) + strings
            bt_off = self._raw_pos
            mt_off = bt_off + len(block_table)
            str_off = mt_off + MEMBER_ENTRY.size * len(self._members)
            if len(member_tables) > MAX_MEMBER_TABLES:
                raise ValueError("too many members for one shard")
            footer = FOOTER.pack(
                FOOTER_MAGIC, VERSION, self._bs, self._logical,
                bt_off, len(self._blocks), mt_off, len(self._members), str_off, len(strings),
                zlib.crc32(block_table), zlib.crc32(member_tables), 0, 0,
            )
            footer = footer[:-4] + struct.pack("<I", zlib.crc32(footer[:-4]))
            self._f.write(block_table)
            self._f.write(member_tables)
            self._f.write(footer)
            self._f.flush()
            os.fsync(self._f.fileno())  # the rename must not expose unwritten data after a crash
            self._f.close()
            self._f = None
            os.replace(self._tmp, self.path)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Discard the partial shard (the final name is never touched)."""
        if self._f is not None:
            self._f.close()
            self._f = None
        try:
            os.unlink(self._tmp)
        except FileNotFoundError:
            pass


def _encode(name: str | bytes) -> bytes:
    # surrogateescape: names that came from os.fsdecode() get their original bytes back.
    return name.encode("utf-8", "surrogateescape") if isinstance(name, str) else bytes(name)


# --------------------------------------------------------------------------- reader


@dataclass(slots=True)
class _Index:
    """What the footer and the block table say, after validation."""

    block_size: int
    logical_size: int
    blocks: np.ndarray  # _BLOCK_DTYPE entries
    mt_off: int
    str_off: int
    str_size: int
    member_count: int
    mt_crc: int


def _read_at(f: ByteSource, offset: int, length: int) -> bytes:
    try:
        data = f.pread(offset, length)
    except ShardIOError as exc:
        if exc.unavailable:
            raise  # not damage: the scan stops and records nothing
        raise ShardFormatError(f"read error at offset {offset}: {exc.strerror}") from None
    if len(data) != length:
        raise ShardFormatError(f"truncated (wanted {length} bytes at {offset}, got {len(data)})")
    return data


def _first_bad(what: str, bad: np.ndarray, why: str) -> None:
    if bad.any():
        raise ShardFormatError(f"{what} {int(np.flatnonzero(bad)[0])}: {why}")


def _load_index(f: ByteSource, file_size: int) -> _Index:
    """Validate header, footer and block table; never touches the data blocks."""
    if file_size < HEADER_SIZE + FOOTER_SIZE:
        raise ShardFormatError(f"too small ({file_size} bytes) to be an lz4shard")
    magic, version, reserved = HEADER.unpack(_read_at(f, 0, HEADER_SIZE))
    if magic != MAGIC:
        raise ShardFormatError(f"not an lz4shard (bad header magic {magic!r})")
    if version != VERSION:
        raise ShardFormatError(f"unsupported lz4shard version {version}")
    if reserved:
        raise ShardFormatError("reserved header field is not zero")

    raw_footer = _read_at(f, file_size - FOOTER_SIZE, FOOTER_SIZE)
    (fmagic, fversion, bs, logical, bt_off, n_blocks, mt_off, n_members, str_off, str_size,
     bt_crc, mt_crc, freserved, fcrc) = FOOTER.unpack(raw_footer)  # fmt: skip
    if fmagic != FOOTER_MAGIC:
        raise ShardFormatError(f"bad footer magic {fmagic!r} (truncated or not an lz4shard)")
    if zlib.crc32(raw_footer[:-4]) != fcrc:
        raise ShardFormatError("footer checksum mismatch")
    if fversion != VERSION:
        raise ShardFormatError(f"unsupported lz4shard version {fversion} (footer)")
    if freserved:
        raise ShardFormatError("reserved footer field is not zero")
    if not MIN_BLOCK_SIZE <= bs <= MAX_BLOCK_SIZE:
        raise ShardFormatError(f"block size {bs} out of range")
    if n_blocks != -(-logical // bs):
        raise ShardFormatError(f"{n_blocks} blocks cannot hold {logical} bytes of {bs}-byte blocks")
    # The regions must tile [bt_off, file_size - FOOTER_SIZE) exactly, in order.
    # Python ints: no overflow however large the declared counts are.
    tables_end = file_size - FOOTER_SIZE
    if not (
        HEADER_SIZE + n_blocks <= bt_off  # every block stores at least one byte
        and bt_off + BLOCK_ENTRY.size * n_blocks == mt_off
        and mt_off + MEMBER_ENTRY.size * n_members == str_off
        and str_off + str_size == tables_end
    ):
        raise ShardFormatError(f"table offsets/counts do not fit the file ({file_size} bytes)")
    if tables_end - mt_off > MAX_MEMBER_TABLES:
        raise ShardFormatError(f"member tables larger than {MAX_MEMBER_TABLES} bytes")

    block_table = _read_at(f, bt_off, mt_off - bt_off)
    if zlib.crc32(block_table) != bt_crc:
        raise ShardFormatError("block table checksum mismatch")
    blocks = np.frombuffer(block_table, dtype=_BLOCK_DTYPE)
    _check_blocks(blocks, bs, logical, bt_off)

    return _Index(bs, logical, blocks, mt_off, str_off, str_size, n_members, mt_crc)


def _check_blocks(blocks: np.ndarray, bs: int, logical: int, bt_off: int) -> None:
    if len(blocks) == 0:
        if bt_off != HEADER_SIZE:
            raise ShardFormatError("data region without blocks")
        return
    usize, stored, flags = blocks["usize"], blocks["stored"], blocks["flags"]
    # Block i covers logical [i*bs, ...): all blocks but the last are full.
    _first_bad("block", usize[:-1] != bs, "not a full block")
    if int(usize[-1]) != logical - (len(blocks) - 1) * bs:  # in [1, bs] thanks to the ceil check
        raise ShardFormatError(f"last block size {int(usize[-1])} does not match the stream size")
    _first_bad("block", (flags & ~np.uint32(BLOCK_LZ4)) != 0, "unknown flags")
    lz = (flags & BLOCK_LZ4) != 0
    _first_bad("block", ~lz & (stored != usize), "raw block with stored size != size")
    _first_bad("block", lz & ((stored == 0) | (stored >= usize)), "compressed size out of range")
    # stored <= bs <= 64 MiB here, so the uint64 cumsum cannot overflow.
    ends = np.cumsum(stored, dtype=np.uint64) + np.uint64(HEADER_SIZE)
    starts = ends - stored
    _first_bad("block", blocks["raw"] != starts, "raw offset is not right after the previous block")
    if int(ends[-1]) != bt_off:
        raise ShardFormatError(f"data blocks end at {int(ends[-1])}, block table starts at {bt_off}")


def _load_members(f: ByteSource, idx: _Index) -> list[MemberRecord]:
    tables = _read_at(f, idx.mt_off, idx.str_off + idx.str_size - idx.mt_off)
    if zlib.crc32(tables) != idx.mt_crc:
        raise ShardFormatError("member table checksum mismatch")
    split = idx.str_off - idx.mt_off
    m = np.frombuffer(tables, dtype=_MEMBER_DTYPE, count=idx.member_count)
    strings = tables[split:]

    kind, off, size, nlen, llen = m["kind"], m["offset"], m["size"], m["name_len"], m["link_len"]
    bad = lambda mask, why: _first_bad("member", mask, why)  # noqa: E731
    bad(kind > max(_FORMAT_KINDS), "unknown kind")
    bad(m["pad"].any(axis=1), "reserved bytes not zero")
    bad((m["mode"] & ~np.uint32(0o7777)) != 0, "mode has bits outside 0o7777")
    bad(~np.isfinite(m["mtime"]), "mtime not finite")
    bad((nlen == 0) | (nlen > MAX_NAME) | (llen > MAX_NAME), "name or link length out of range")
    is_file, is_link = kind == Kind.FILE, kind == Kind.SYMLINK
    logical = np.uint64(idx.logical_size)
    beyond = (off > logical) | (size > logical - np.minimum(off, logical))  # no uint64 wrap-around
    bad(is_file & beyond, "data range beyond the logical stream")
    bad(is_file & (llen != 0), "file with a link target")
    bad(~is_file & ((off != 0) | (size != 0)), "directory or symlink with data")
    bad(is_link != (llen != 0), "symlink without target, or target on a non-symlink")
    # Lengths are <= 4096 each, so this sum cannot overflow.
    if int(nlen.sum(dtype=np.uint64)) + int(llen.sum(dtype=np.uint64)) != idx.str_size:
        raise ShardFormatError("name lengths do not add up to the string table size")
    if b"\0" in strings:
        raise ShardFormatError("NUL byte in a name or link target")

    members = []
    pos = 0
    columns = (kind, m["mode"], off, size, m["mtime"], nlen, llen)
    for k, mode, o, s, mt, nl, ll in zip(*(c.tolist() for c in columns)):
        name = strings[pos : pos + nl]
        link = strings[pos + nl : pos + nl + ll]
        pos += nl + ll
        members.append(MemberRecord(name, Kind(k), o, s, mode, mt, link))
    return members


class BlockCache:
    """Thread-safe LRU of decompressed blocks, bounded in bytes: each entry's own cost counted
    too, so that many tiny or empty blocks (a damaged shard's) cannot grow it past its bound."""

    ENTRY_COST = 200  # the key tuple, the bytes object's header and the ordered dict's node

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self._bytes = 0
        self._owners = itertools.count()

    def owner(self) -> int:
        """A key prefix of its own for each layout that caches here (lz4 blocks, Parquet pages):
        unlike id(layout), never reused."""
        return next(self._owners)

    def get(self, key: tuple[int, int]) -> bytes | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: tuple[int, int], value: bytes) -> None:
        if len(value) + self.ENTRY_COST > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= len(old) + self.ENTRY_COST
            self._items[key] = value
            self._bytes += len(value) + self.ENTRY_COST
            while self._bytes > self.max_bytes:
                _, evicted = self._items.popitem(last=False)
                self._bytes -= len(evicted) + self.ENTRY_COST


# One cache for all open shards, so memory stays bounded however many are mounted.
BLOCK_CACHE = BlockCache(32 << 20)


class Lz4Layout:
    """Maps logical-stream ranges to blocks; decompresses and verifies on read."""

    def __init__(self, block_size: int, logical_size: int, blocks: np.ndarray, cache: BlockCache | None = None):
        self.block_size = block_size
        self.logical_size = logical_size
        self._blocks = blocks  # validated _BLOCK_DTYPE entries: 24 bytes per block, however many shards
        self._cache = BLOCK_CACHE if cache is None else cache
        self._id = self._cache.owner()

    def _blocks_for(self, offset: int, length: int) -> range:
        if offset < 0 or length < 0 or offset + length > self.logical_size:
            raise ShardFormatError(
                f"range [{offset}, {offset + length}) beyond the logical stream ({self.logical_size})"
            )
        return range(offset // self.block_size, (offset + length - 1) // self.block_size + 1)

    def read(self, offset: int, length: int, fetch: Fetch) -> bytes:
        if length == 0:
            return b""
        end = offset + length
        parts = []
        for i in self._blocks_for(offset, length):
            base = i * self.block_size
            block = memoryview(self._block(i, fetch))
            parts.append(block[max(offset - base, 0) : min(end - base, len(block))])
        return bytes(parts[0]) if len(parts) == 1 else b"".join(parts)

    def _block(self, i: int, fetch: Fetch) -> bytes:
        key = (self._id, i)
        data = self._cache.get(key)
        if data is not None:
            return data
        raw_off, stored, usize, flags, crc = self._blocks[i].item()  # Python ints
        where = f"block {i} at {raw_off}"
        raw = fetch(raw_off, stored)
        if len(raw) != stored:
            raise ShardFormatError(f"{where}: short read ({len(raw)} of {stored} bytes)")
        if zlib.crc32(raw) != crc:
            raise ShardFormatError(f"{where}: checksum mismatch")
        if flags & BLOCK_LZ4:
            try:
                data = lz4.block.decompress(raw, uncompressed_size=usize)
            except (lz4.block.LZ4BlockError, ValueError) as e:
                raise ShardFormatError(f"{where}: lz4 decompression failed: {e}") from None
            # lz4 returns fewer bytes (no error) when the block is shorter than declared.
            if len(data) != usize:
                raise ShardFormatError(f"{where}: decompressed to {len(data)} bytes, expected {usize}")
        else:
            data = bytes(raw)
        self._cache.put(key, data)
        return data


class Lz4ShardFormat:
    name = "lz4"
    suffixes = (SUFFIX,)
    members_as_stored = False  # members live in compressed blocks

    def scan(self, src: ByteSource) -> ScanResult:
        """Members from the footer and tables; the data blocks are never read.

        Like the tar format, damage is reported in ``ScanResult.error`` rather
        than raised (index building records it and goes on with other shards).
        The tables are checksummed as a unit, so a damaged shard has no members.
        """
        try:
            return ScanResult(members=self.read_members(src), warnings=[])
        except ShardFormatError as exc:
            return ScanResult(members=[], warnings=[], error=str(exc))

    def read_members(self, src: ByteSource) -> list[MemberRecord]:
        """The strict form of scan(): raises ShardFormatError on any damage."""
        return _load_members(src, _load_index(src, src.size))

    def as_stored(self, offsets) -> bool:
        return self.members_as_stored

    def open_layout(self, src: ByteSource, size: int) -> Lz4Layout:
        """``size`` is the shard's file size as recorded at scan time; a changed file is refused."""
        if src.size != size:
            raise ShardFormatError(f"file is {src.size} bytes, expected {size} (shard changed?)")
        idx = _load_index(src, size)
        return Lz4Layout(idx.block_size, idx.logical_size, idx.blocks)


FORMAT = Lz4ShardFormat()
