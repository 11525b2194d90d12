"""Zip members' bytes: a stored member is a range of the zip as stored; a compressed one (deflate,
bzip2, lzma; zstd and deflate64 where their packages are installed) is decompressed whole at its
first read into the bounded cache lz4 blocks and Parquet pages share, CRC-32 checked, at most its
declared size (one over WHOLE_MAX is decompressed forward as it is read). A compressed member's
offset in the index is virtual: VIRTUAL, its entry's number and the place in its data."""

from __future__ import annotations

import bz2
import lzma
import struct
import threading
import zlib
from dataclasses import dataclass
from importlib.util import find_spec

import numpy as np

from shardfs.formats.base import VIRTUAL, ByteSource, Fetch, ShardFormatError
from shardfs.formats.lz4shard import BLOCK_CACHE
from shardfs.formats.zipdir import (CENTRAL_SIZE, ENCRYPTED, STRONG, WHY, Directory, Entries, data_starts,
                                    find_directory, read_entries, shown)

STORED, DEFLATED, DEFLATE64, BZIP2, LZMA, ZSTD = 0, 8, 9, 12, 14, 93
WHOLE_MAX = 16 << 20  # compressed members up to this size decompressed whole and cached; larger: streamed
# A compressed member's offset: VIRTUAL, its entry's number in the central directory, and the place
# in its decompressed data (the reader adds that to the member's offset).
WITHIN_BITS = 38  # members up to 256 GiB
MAX_ENTRY = 1 << (62 - WITHIN_BITS)  # compressed members among the first 16,777,216 entries
# deflate, bzip2 and lzma from the standard library; the others where their package is installed
METHODS = {DEFLATED, BZIP2, LZMA} | {m for m, package in ((ZSTD, "zstandard"), (DEFLATE64, "inflate64"))
                                     if find_spec(package)}

@dataclass(frozen=True)
class _Member:
    """What reading a compressed member needs, from its entry and local header."""

    entry: int  # its number in the central directory
    method: int
    data: int  # where its data starts in the shard
    csize: int
    usize: int
    crc: int
    flags: int = 0


class ZipLayout:
    """Offsets as the shard's own (stored members), or virtual: a compressed member, decompressed
    whole at its first read into the shared bounded cache; one over WHOLE_MAX is decompressed
    forward as it is read (a read before where the last one ended starts again from its start)."""

    def __init__(self, src: ByteSource):
        self._src = src
        self._cache = BLOCK_CACHE  # one bound for lz4 blocks, Parquet pages and zip members
        self._id = self._cache.owner()
        self._lock = threading.Lock()
        self._table: _Table | None = None  # every entry, read at the first compressed member's read
        self._stream: _Stream | None = None

    def read(self, offset: int, length: int, fetch: Fetch) -> bytes:
        if not offset & VIRTUAL:
            return fetch(offset, length)
        entry, within = (offset & ~VIRTUAL) >> WITHIN_BITS, offset & ((1 << WITHIN_BITS) - 1)
        key = (self._id, entry)
        data = self._cache.get(key)
        if data is None:
            # a member streamed (over WHOLE_MAX) is read request after request: its entry and local
            # header were checked at its first read, not again at each
            stream = self._stream
            under_way = stream is not None and stream.member.entry == entry
            member = stream.member if under_way else self._member(entry, fetch)
            try:
                if member.usize > WHOLE_MAX:
                    return self._streamed(member, within, length, fetch)
                data = _whole(member, fetch)
            except ShardFormatError as exc:
                raise ShardFormatError(f"member {self._name(entry, fetch)}: {exc}") from None
            self._cache.put(key, data)
        return data[within : within + length]

    def check_members(self, fetch: Fetch) -> list[str]:
        """Every member's data read and its CRC-32 checked, stored ones too (``shardfs verify``):
        one line per member that fails. (Members the scan left out were named by its warnings.)"""
        problems = []
        for entry in range(len(self._entries(fetch).at)):
            try:
                member = self._member(entry, fetch)
            except ShardFormatError:
                continue
            if member.flags & (ENCRYPTED | STRONG) or member.method not in (STORED, *METHODS):
                continue
            try:
                if member.method == STORED:
                    _stored_crc(member, fetch)
                elif member.usize <= WHOLE_MAX:
                    _whole(member, fetch)
                else:
                    stream = _Stream(member, fetch)
                    for at in range(0, member.usize, 1 << 20):
                        stream.read(at, min(1 << 20, member.usize - at))
            except ShardFormatError as exc:
                problems.append(f"member {self._name(entry, fetch)}: {exc}")
        return problems

    def _streamed(self, member: _Member, within: int, length: int, fetch: Fetch) -> bytes:
        with self._lock:
            stream = self._stream
            if stream is None or stream.member != member or stream.pos > within:
                stream = self._stream = _Stream(member, fetch)
            return stream.read(within, length)

    def _entries(self, fetch: Fetch) -> _Table:
        """Where each central directory entry lies, read at the first read of a compressed member:
        8 bytes per entry kept while the zip is mounted (at 4,000,000 members, the ~50 bytes of
        every entry's fields kept here were over a third of the daemon's memory per member). A
        member's entry and its local header are read again and checked at its first read (a read
        of the whole zip for every header at once would be the first read's wait)."""
        with self._lock:
            if self._table is None:
                where = find_directory(self._src)
                cd = bytes(fetch(where.at, where.size))
                if len(cd) != where.size:
                    raise ShardFormatError("central directory cut off")
                entries = read_entries(cd, where)
                f = entries.fixed
                end = where.at  # where the last entry ends (an empty directory: where it is)
                if len(entries.at):
                    end = int(entries.at[-1]) + CENTRAL_SIZE + sum(int(f[k][-1]) for k in ("nlen", "elen", "clen"))
                self._table = _Table(entries.at.copy(), end, where.shift)
            return self._table

    def _entry(self, entry: int, fetch: Fetch) -> Entries:
        """One central directory entry, read again from the shard."""
        t = self._entries(fetch)
        if entry >= len(t.at):
            raise ShardFormatError(f"no entry {entry} in the central directory")
        at = int(t.at[entry])
        span = (int(t.at[entry + 1]) if entry + 1 < len(t.at) else t.end) - at  # (entries follow one another)
        raw = bytes(fetch(at, span))
        if len(raw) != span:
            raise ShardFormatError("central directory cut off")
        return read_entries(raw, Directory(at, span, 1, t.shift))

    def _member(self, entry: int, fetch: Fetch) -> _Member:
        """Its entry, and its local header checked against it (as the scan checked it)."""
        one = self._entry(entry, fetch)
        start, why = data_starts(fetch, self._src.size, one, np.zeros(1, np.int64))
        if start[0] < 0:
            raise ShardFormatError(f"member {self._name(entry, fetch)}: {WHY[int(why[0])]}")
        f = one.fixed[0]
        return _Member(entry, int(f["method"]), int(start[0]), int(one.csize[0]), int(one.usize[0]), int(f["crc"]),
                       int(f["flags"]))

    def _name(self, entry: int, fetch: Fetch) -> str:
        """A member's name, for a message (read again from its entry: names are not kept)."""
        one = self._entry(entry, fetch)
        return shown(bytes(one.raw[int(one.name_at[0]) : int(one.name_at[0]) + int(one.fixed["nlen"][0])]))


@dataclass
class _Table:
    """Where each entry of the central directory lies."""

    at: np.ndarray  # int64: its offset in the shard
    end: int  # where the last one ends
    shift: int  # bytes before the archive (zipdir.Directory)


def _whole(member: _Member, fetch: Fetch) -> bytes:
    """The member's data, decompressed, at most its declared size, CRC-32 checked."""
    raw = fetch(member.data, member.csize)
    if len(raw) != member.csize:
        raise ShardFormatError(f"short read ({len(raw)} of {member.csize} bytes)")
    data = _Decoder(member, lambda pos, n: raw[pos : pos + n]).read(member.usize + 1)
    if len(data) != member.usize:
        more = "more" if len(data) > member.usize else "fewer"
        raise ShardFormatError(f"decompresses to {more} bytes than its {member.usize}")
    if zlib.crc32(data) != member.crc:
        raise ShardFormatError("CRC-32 mismatch")
    return data


def _stored_crc(member: _Member, fetch: Fetch) -> None:
    crc = 0
    for at in range(0, member.csize, 1 << 22):
        crc = zlib.crc32(fetch(member.data + at, min(1 << 22, member.csize - at)), crc)
    if crc != member.crc:
        raise ShardFormatError("CRC-32 mismatch")


class _Stream:
    """A large compressed member decompressed forward; its CRC-32 checked when its end is read."""

    def __init__(self, member: _Member, fetch: Fetch):
        self.member, self.pos, self._crc = member, 0, 0
        self._decoder = _Decoder(member, lambda pos, n: fetch(member.data + pos, min(n, member.csize - pos)))

    def read(self, within: int, length: int) -> bytes:
        while self.pos < within:
            self._take(min(within - self.pos, 1 << 20))
        out = self._take(min(length, self.member.usize - within))
        if self.pos == self.member.usize and (self._decoder.read(1) or self._crc != self.member.crc):
            raise ShardFormatError("CRC-32 mismatch or data past its size")
        return out

    def _take(self, n: int) -> bytes:
        data = self._decoder.read(n)
        if len(data) != n:
            raise ShardFormatError(f"decompresses to fewer bytes than its {self.member.usize}")
        self.pos += n
        self._crc = zlib.crc32(data, self._crc)
        return data


_RAW_CHUNK = 1 << 18


class _Decoder:
    """Up to n decompressed bytes at a time, whatever the method; never more than asked for
    (deflate64: at most one raw chunk's worth beyond, held back)."""

    def __init__(self, member: _Member, raw):
        self._raw, self._at, self._end = raw, 0, member.csize
        self._pending, self._held = b"", b""
        method = member.method
        if method == DEFLATED:
            self._obj = zlib.decompressobj(-15)
        elif method == BZIP2:
            self._obj = bz2.BZ2Decompressor()
        elif method == LZMA:
            head = self._next(4)
            props = self._next(struct.unpack_from("<H", head, 2)[0]) if len(head) == 4 else b""
            if len(props) == 5:  # a dictionary no larger than the member: the same data, bounded memory
                wanted = struct.unpack_from("<I", props, 1)[0]
                props = bytes(props[:1]) + struct.pack("<I", min(wanted, max(member.usize, 4096)))
            try:
                self._obj = lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=[
                    lzma._decode_filter_properties(lzma.FILTER_LZMA1, props)])  # what zipfile does
            except (lzma.LZMAError, ValueError) as exc:
                raise ShardFormatError(f"bad lzma properties: {exc}") from None
        elif method == ZSTD:
            import zstandard
            self._obj = zstandard.ZstdDecompressor().stream_reader(_RawFile(self), read_across_frames=True)
        elif method == DEFLATE64:
            import inflate64
            self._obj = inflate64.Inflater()
        else:
            raise ShardFormatError(f"method {method} is not read here")
        self._method = method

    def _next(self, n: int) -> bytes:
        data = bytes(self._raw(self._at, min(n, self._end - self._at)))  # (inflate64, zstandard: bytes)
        self._at += len(data)
        return data

    def read(self, n: int) -> bytes:
        try:
            return self._read(n)
        except (zlib.error, OSError, EOFError, lzma.LZMAError, ValueError, RuntimeError) as exc:
            raise ShardFormatError(f"cannot decompress: {exc}") from None

    def _read(self, n: int) -> bytes:
        parts, have = [], 0
        if self._method == ZSTD:
            return self._obj.read(n)
        while have < n:
            if self._method == DEFLATE64:
                if not self._held:
                    chunk = self._next(1 << 14)
                    if not chunk:
                        break
                    self._held = self._obj.inflate(chunk)
                part, self._held = self._held[: n - have], self._held[n - have :]
            else:
                obj = self._obj
                if self._method == DEFLATED:
                    if obj.eof:
                        break
                    data = obj.unconsumed_tail or self._next(_RAW_CHUNK)
                    if not data:
                        break
                    part = obj.decompress(data, n - have)
                else:
                    if obj.eof:
                        break
                    data = self._next(_RAW_CHUNK) if obj.needs_input else b""
                    if obj.needs_input and not data:
                        break
                    part = obj.decompress(data, n - have)
            parts.append(part)
            have += len(part)
        return b"".join(parts)


class _RawFile:
    """A member's raw bytes as a file, for zstandard's stream reader."""

    def __init__(self, decoder: _Decoder):
        self._decoder = decoder

    def read(self, n: int = -1) -> bytes:
        return self._decoder._next(_RAW_CHUNK if n is None or n < 0 else n)

