"""Zip files (``.zip``), as Info-ZIP, 7-Zip, Python's zipfile and Windows write them (PKZIP 2.0 and
later, zip64 included), served as ``unzip`` extracts them.

The index comes from the central directory alone, found from the end (the end record, the zip64
locator and record); each member's data starts after its *local* header, whose name and extra field
may differ from the central ones, so every local header is read and checked in the scan too
(signature, name, method, sizes): a stored member is then a byte range of the shard as stored,
served by the compiled loop like a tar member, without Python. Local headers are read in a few
large reads where they lie close together (a zip of a million tiny members: its whole data once)
and one by one where members are large (a zip of JPEGs: its data is never read at mount).

A compressed member (deflate; deflate64, bzip2, lzma, zstd where a library is at hand) is
decompressed whole at its first read into the bounded cache lz4 blocks share, CRC-32 checked (EIO
on a mismatch), and kept while it is read (a JPEG takes one or two requests). Its offset is a
*virtual offset*: a flag and the offset of its central directory entry, so reading it needs no
table kept in memory. A member decompresses to at most its declared size: more, and it is refused.

Left out, each kind with one line per shard: encrypted members, methods without a library, and
names unzip would not extract (index/replay.py, the tar path's rules). Refused whole, with one line:
an archive without a readable central directory (truncated, cut off), or whose members overlap each
other or the central directory (a zip bomb); a member whose local header does not match its entry
or whose data lies past the end is left out alone.
"""

from __future__ import annotations

import bz2
import lzma
import stat
import struct
import threading
import time
import zlib
from dataclasses import dataclass

import numpy as np
from xxhash import xxh64_intdigest

from shardfs.formats.base import VIRTUAL, ByteSource, Fetch, Kind, ScanResult, ShardFormatError
from shardfs.formats.lz4shard import BLOCK_CACHE
from shardfs.formats.tarcolumns import (HASH, KIND, LINK_END, MODE, MTIME, NAME_END, NFIELDS, NORM_END, NORM_START,
                                        NOT_NORMAL, OFFSET, PARENT_END, PARENT_HASH, SIZE, SMALL_END, MemberColumns)

_EOCD, _ZIP64_LOCATOR, _ZIP64_EOCD = b"PK\x05\x06", b"PK\x06\x07", b"PK\x06\x06"
_CENTRAL, _LOCAL = 0x02014B50, 0x04034B50
_EOCD_SIZE, _LOCATOR_SIZE, _ZIP64_EOCD_SIZE, _CENTRAL_SIZE, _LOCAL_SIZE = 22, 20, 56, 46, 30
_MAX_COMMENT = 0xFFFF
_FULL32, _FULL16 = 0xFFFFFFFF, 0xFFFF
_ZIP64_EXTRA, _TIME_EXTRA = 0x0001, 0x5455
_ENCRYPTED, _DESCRIPTOR, _UTF8 = 0x0001, 0x0008, 0x0800
_STRONG = 0x0040
# hosts whose names are in the OEM code page (CP437) when the UTF-8 flag is clear, as unzip reads
# them (unzip's Ext_ASCII_TO_Native); others (Unix, macOS) are taken as the bytes they are
_OEM_HOSTS = {0, 6, 10, 14}  # MS-DOS/FAT, OS/2 HPFS, Windows NTFS, VFAT
_UNIX = 3
_IFMT = 0o170000  # the file type bits of st_mode
_MAX_NAME = 255  # a name longer than this (index/names.MAX_NAME) is left to replay.py
STORED, DEFLATED, DEFLATE64, BZIP2, LZMA, ZSTD = 0, 8, 9, 12, 14, 93
_METHOD_NAMES = {DEFLATE64: "deflate64", BZIP2: "bzip2", LZMA: "lzma", ZSTD: "zstd", 6: "implode", 1: "shrink",
                 98: "ppmd", 95: "xz", 99: "AES (encrypted)"}
WHOLE_MAX = 16 << 20  # compressed members up to this size decompressed whole and cached; larger: streamed
_DENSE = 8  # local headers read in one span where they fill at least 1/_DENSE of it
_SPAN = 4 << 20  # such a span's most bytes
_BATCH = 64 << 20  # local headers checked in batches of at most this many bytes read

_CENTRAL_DTYPE = np.dtype([("sig", "<u4"), ("made_by", "<u2"), ("needed", "<u2"), ("flags", "<u2"),
                           ("method", "<u2"), ("time", "<u2"), ("date", "<u2"), ("crc", "<u4"), ("csize", "<u4"),
                           ("usize", "<u4"), ("nlen", "<u2"), ("elen", "<u2"), ("clen", "<u2"), ("disk", "<u2"),
                           ("internal", "<u2"), ("external", "<u4"), ("local", "<u4")])
_LOCAL_DTYPE = np.dtype([("sig", "<u4"), ("needed", "<u2"), ("flags", "<u2"), ("method", "<u2"), ("time", "<u2"),
                         ("date", "<u2"), ("crc", "<u4"), ("csize", "<u4"), ("usize", "<u4"), ("nlen", "<u2"),
                         ("elen", "<u2")])
assert _CENTRAL_DTYPE.itemsize == _CENTRAL_SIZE and _LOCAL_DTYPE.itemsize == _LOCAL_SIZE


def _decompressors() -> dict[int, str]:
    """Methods this node can decompress, and for the others, why not (one log line per shard)."""
    found = {DEFLATED: "", BZIP2: "", LZMA: ""}
    try:
        import zstandard  # noqa: F401
        found[ZSTD] = ""
    except ImportError:
        pass
    try:
        import inflate64  # noqa: F401
        found[DEFLATE64] = ""
    except ImportError:
        pass
    return found


_METHODS = _decompressors()


# --------------------------------------------------------------------------- the central directory


@dataclass(frozen=True)
class Directory:
    at: int  # where the central directory starts in the shard
    size: int
    count: int
    shift: int  # bytes before the archive (a self-extractor's stub): added to every offset in it


def find_directory(src: ByteSource) -> Directory:
    """The central directory's place, from the end record (and the zip64 locator and record)."""
    size = src.size
    tail_at = max(0, size - _EOCD_SIZE - _MAX_COMMENT)
    tail = bytes(src.pread(tail_at, size - tail_at))
    end = tail.rfind(_EOCD)
    while end >= 0 and (end + _EOCD_SIZE > len(tail)
                        or end + _EOCD_SIZE + struct.unpack_from("<H", tail, end + 20)[0] > len(tail)):
        end = tail.rfind(_EOCD, 0, end)  # "PK\5\6" inside the comment: look further back
    if end < 0 or end + _EOCD_SIZE > len(tail):
        raise ShardFormatError("no end of central directory record (not a zip, or truncated)")
    disk, cd_disk, on_disk, count, cd_size, cd_at, _ = struct.unpack_from("<HHHHIIH", tail, end + 4)
    eocd = tail_at + end
    locator = b""
    if eocd >= _LOCATOR_SIZE:
        locator = tail[end - _LOCATOR_SIZE : end] if end >= _LOCATOR_SIZE else bytes(src.pread(eocd - _LOCATOR_SIZE, _LOCATOR_SIZE))
    record_end = eocd
    if locator[:4] == _ZIP64_LOCATOR:
        _, _, disks = struct.unpack_from("<IQI", locator, 4)
        # the record right before its locator, as zipfile and unzip look for it (the offset the
        # locator gives does not count data before the archive)
        record_at = eocd - _LOCATOR_SIZE - _ZIP64_EOCD_SIZE
        record = bytes(src.pread(record_at, _ZIP64_EOCD_SIZE)) if record_at >= 0 else b""
        if len(record) != _ZIP64_EOCD_SIZE or record[:4] != _ZIP64_EOCD:
            raise ShardFormatError("zip64 locator without its end of central directory record")
        disk, cd_disk, on_disk, count, cd_size, cd_at = struct.unpack_from("<IIQQQQ", record, 16)
        record_end = record_at
        if disks > 1:
            disk = 1
    if disk or cd_disk or on_disk != count:
        raise ShardFormatError("a multi-volume (split) archive")
    shift = record_end - cd_size - cd_at  # > 0: data before the archive, as unzip allows
    if shift < 0:
        raise ShardFormatError(f"its central directory ({cd_size} bytes at {cd_at}) reaches past where it "
                               f"ends ({record_end}): cut off or damaged")
    if count and cd_size < count * _CENTRAL_SIZE:
        raise ShardFormatError(f"a central directory of {cd_size} bytes cannot hold {count} entries")
    return Directory(cd_at + shift, cd_size, count, shift)


@dataclass
class Entries:
    """The central directory's entries as columns, and their raw names."""

    at: np.ndarray  # int64: each entry's offset in the shard
    fixed: np.ndarray  # _CENTRAL_DTYPE
    csize: np.ndarray  # int64, zip64 applied
    usize: np.ndarray
    local: np.ndarray  # int64: the local header's offset in the shard (shift applied)
    mtime: np.ndarray  # float64: the extended timestamp, NaN where none
    names: list[bytes]  # as stored
    raw: np.ndarray  # uint8: the central directory they were read from
    name_at: np.ndarray  # int64: where each name is in ``raw``


def _gather(data: bytes, starts: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Records of ``dtype`` at byte offsets ``starts`` of ``data`` (in chunks: index arrays of a few
    MiB however many there are)."""
    buf = np.frombuffer(data, np.uint8)
    out = np.empty(len(starts), dtype)
    step = np.arange(dtype.itemsize)
    raw = out.view(np.uint8).reshape(len(starts), dtype.itemsize)
    for i in range(0, len(starts), 1 << 16):
        np.take(buf, starts[i : i + (1 << 16), None] + step, out=raw[i : i + (1 << 16)])
    return out


def _int(data: bytes, at: np.ndarray, width: int) -> np.ndarray:
    """Little-endian unsigned integers of ``width`` bytes at ``at``."""
    return _gather(data, at, np.dtype(f"<u{width}")).astype(np.int64)


def _ragged_equal(a: np.ndarray, a_at: np.ndarray, b: np.ndarray, b_at: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """For each i, whether a[a_at[i]:][:lengths[i]] == b[b_at[i]:][:lengths[i]] (in chunks: index
    arrays of a few MiB however many there are)."""
    same = np.ones(len(lengths), bool)
    for i in range(0, len(lengths), 1 << 16):
        n = lengths[i : i + (1 << 16)]
        total = int(n.sum())
        if not total:
            continue
        ends = np.cumsum(n)
        within = np.arange(total, dtype=np.int64) - np.repeat(ends - n, n)
        differ = a[np.repeat(a_at[i : i + (1 << 16)], n) + within] != b[np.repeat(b_at[i : i + (1 << 16)], n) + within]
        if differ.any():
            same[i + np.searchsorted(ends, np.flatnonzero(differ), side="right")] = False
    return same


def _chain(cd: bytes, count: int) -> np.ndarray | None:
    """The entries' starts found at once: every place the entry signature appears, kept if each one's
    lengths lead to the next (else a signature inside a name or extra field: None, walk them)."""
    if not count or len(cd) < _CENTRAL_SIZE:
        return None
    found = [np.flatnonzero(np.frombuffer(cd, "<u4", (len(cd) - k) // 4, k) == _CENTRAL) * 4 + k for k in range(4)]
    starts = np.sort(np.concatenate(found))
    starts = starts[starts + _CENTRAL_SIZE <= len(cd)]
    if len(starts) != count or not count or starts[0] != 0:
        return None
    lengths = _gather(cd, starts + 28, np.dtype([("n", "<u2"), ("e", "<u2"), ("c", "<u2")]))
    after = starts + _CENTRAL_SIZE + lengths["n"] + lengths["e"] + lengths["c"]
    if np.any(after[:-1] != starts[1:]) or after[-1] > len(cd):
        return None
    return starts


def walk(cd: bytes, count: int) -> np.ndarray:
    """Where each of ``count`` entries starts in ``cd``: each one's lengths give the next."""
    found = _chain(cd, count)
    if found is not None:
        return found
    starts = np.empty(count, np.int64)
    lengths = struct.Struct("<HHH").unpack_from
    pos, end = 0, len(cd)
    for i in range(count):
        if pos + _CENTRAL_SIZE > end:
            raise ShardFormatError(f"central directory cut off at entry {i} of {count}")
        starts[i] = pos
        n, e, c = lengths(cd, pos + 28)
        pos += _CENTRAL_SIZE + n + e + c
    if pos > end:
        raise ShardFormatError(f"central directory cut off in entry {count - 1}")
    return starts


def read_entries(cd: bytes, base: int, starts: np.ndarray, shift: int) -> Entries:
    """Entries at ``starts`` of ``cd`` (which lies at ``base`` in the shard), zip64 and extended
    timestamp extra fields applied."""
    fixed = _gather(cd, starts, _CENTRAL_DTYPE)
    bad = np.flatnonzero(fixed["sig"] != _CENTRAL)
    if len(bad):
        raise ShardFormatError(f"central directory entry {int(bad[0])} has a bad signature")
    buf = np.frombuffer(cd, np.uint8)
    csize, usize = fixed["csize"].astype(np.int64), fixed["usize"].astype(np.int64)
    local = fixed["local"].astype(np.int64)
    mtime = np.full(len(starts), np.nan)
    # the extra fields, one (tag, size, data) after another, walked for every entry at once
    pos = starts + _CENTRAL_SIZE + fixed["nlen"]
    end = pos + fixed["elen"]
    for _ in range(64):
        live = np.flatnonzero(pos + 4 <= end)
        if not len(live):
            break
        at = pos[live]
        tag, size = _int(cd, at, 2), _int(cd, at + 2, 2)
        inside = at + 4 + size <= end[live]
        pos[live[~inside]] = end[live[~inside]]  # a field running past the extra area: the rest ignored
        live, at, tag, size = live[inside], at[inside], tag[inside], size[inside]
        z64 = tag == _ZIP64_EXTRA
        if z64.any():
            _zip64(cd, live[z64], at[z64] + 4, size[z64], usize, csize, local)
        ut = (tag == _TIME_EXTRA) & (size >= 5)
        if ut.any():
            which, data = live[ut], at[ut] + 4
            has = (buf[data] & 1) == 1
            mtime[which[has]] = _int(cd, data[has] + 1, 4).astype(np.uint32).view(np.int32)
        pos[live] = at + 4 + size
    name_at = starts + _CENTRAL_SIZE
    names = [cd[a : a + n] for a, n in zip(name_at.tolist(), fixed["nlen"].tolist())]
    return Entries(base + starts, fixed, csize, usize, local + shift, mtime, names, buf, name_at)


def _zip64(buf, which, data, size, usize, csize, local) -> None:
    """The zip64 extra field holds, in this order, the 64-bit values of those fields that are full."""
    used = np.zeros(len(which), np.int64)
    for column in (usize, csize, local):
        need = column[which] == _FULL32
        fits = need & (used + 8 <= size)
        idx = which[fits]
        column[idx] = _int(buf, data[fits] + used[fits], 8)  # (buf: the central directory's bytes)
        used += np.where(need, 8, 0)


# --------------------------------------------------------------------------- names, modes, times


def names_of(entries: Entries) -> list[bytes]:
    """Each name as unzip writes it: UTF-8 when flagged (or plain ASCII), CP437 from DOS and Windows
    hosts (unzip's OEM code page), the bytes as they are from others."""
    names = entries.names
    oem = ((entries.fixed["flags"] & _UTF8) == 0) & np.isin(entries.fixed["made_by"] >> 8, list(_OEM_HOSTS))
    if not oem.any():
        return names
    names = list(names)
    for i in np.flatnonzero(oem).tolist():
        if not names[i].isascii():
            names[i] = names[i].decode("cp437").encode("utf-8")
    return names


def unix_modes(entries: Entries) -> np.ndarray:
    """The st_mode unzip gives each member (uint32, type bits included; 0: from its DOS attributes)."""
    host = entries.fixed["made_by"] >> 8
    high = (entries.fixed["external"] >> 16).astype(np.uint32)
    # unzip takes the high 16 bits as a unix mode from Unix and other hosts that set them (7-Zip,
    # Windows tools with the unix extension), when they hold a file type
    typed = (high & _IFMT) != 0
    return np.where((host == _UNIX) & (high != 0) | typed, high, 0).astype(np.uint32)


# --------------------------------------------------------------------------- local headers


def data_starts(pread: Fetch, size: int, entries: Entries, which: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(data start, or -1 where the local header does not match, why) for entries ``which``: each
    local header read and checked against its central entry. Close ones are read in one span."""
    local = entries.local[which]
    nlen = entries.fixed["nlen"][which].astype(np.int64)
    want = _LOCAL_SIZE + nlen
    order = np.argsort(local, kind="stable")
    out = np.full(len(which), -1, np.int64)
    why = np.zeros(len(which), np.int8)
    past = local + want > size
    why[past] = 1
    order = order[~past[order]]
    for batch in _spans(local[order], want[order]):
        chosen = order[batch.members]
        data = b"".join(pread(s, e - s) for s, e in batch.spans)
        if len(data) != batch.total:
            raise ShardFormatError("local headers cut short (truncated archive?)")
        at = batch.where(local[chosen])
        head = _gather(data, at, _LOCAL_DTYPE)
        out[chosen], why[chosen] = _check(entries, which[chosen], head, data, at, local[chosen])
    return out, why


class _Batch:
    def __init__(self, spans: list[tuple[int, int]], members: np.ndarray):
        self.spans, self.members = spans, members
        self.total = sum(e - s for s, e in spans)
        self._starts = np.array([s for s, _ in spans], np.int64)
        self._base = np.concatenate([[0], np.cumsum([e - s for s, e in spans])[:-1]]).astype(np.int64)

    def where(self, offsets: np.ndarray) -> np.ndarray:
        """Each shard offset's place in the batch's bytes."""
        i = np.searchsorted(self._starts, offsets, side="right") - 1
        return self._base[i] + offsets - self._starts[i]


def _spans(starts: np.ndarray, lengths: np.ndarray):
    """Batches of reads covering [starts[i], starts[i]+lengths[i]) (sorted by start): headers in one
    span where they lie densely, else a read each."""
    if not len(starts):
        return
    ends = starts + lengths
    bucket = starts // _SPAN
    cuts = np.flatnonzero(np.diff(bucket)) + 1
    first, last = np.concatenate([[0], cuts]), np.concatenate([cuts, [len(starts)]])
    spans: list[tuple[int, int]] = []
    members: list[np.ndarray] = []
    total = 0
    for a, b in zip(first.tolist(), last.tolist()):
        lo, hi = int(starts[a]), int(ends[a:b].max())
        wanted = int(lengths[a:b].sum())
        if wanted * _DENSE >= hi - lo:
            spans.append((lo, hi))
            total += hi - lo
        else:
            spans.extend(zip(starts[a:b].tolist(), ends[a:b].tolist()))
            total += wanted
        members.append(np.arange(a, b))
        if total >= _BATCH:
            yield _Batch(_merged(spans), np.concatenate(members))
            spans, members, total = [], [], 0
    if members:
        yield _Batch(_merged(spans), np.concatenate(members))


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping spans (two entries pointing at one local header) merged: their starts increase."""
    out: list[tuple[int, int]] = []
    for s, e in spans:
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


_WHY = {1: "its local header lies past the end", 2: "its local header has a bad signature",
        3: "its local header names another member", 4: "its local header does not match its entry (method, sizes)"}


def _check(entries: Entries, which, head, data: bytes, at, local) -> tuple[np.ndarray, np.ndarray]:
    fixed = entries.fixed[which]
    why = np.zeros(len(which), np.int8)
    why[head["sig"] != _LOCAL] = 2
    why[(why == 0) & (head["nlen"] != fixed["nlen"])] = 3
    # names compared byte for byte
    lengths = np.where(why == 0, fixed["nlen"], 0).astype(np.int64)
    same = _ragged_equal(np.frombuffer(data, np.uint8), _LOCAL_SIZE + at, entries.raw, entries.name_at[which], lengths)
    why[(why == 0) & ~same] = 3
    sizes_known = (head["flags"] & _DESCRIPTOR) == 0
    mismatch = head["method"] != fixed["method"]
    mismatch |= sizes_known & (head["crc"] != fixed["crc"])
    for field, full in (("csize", entries.csize[which]), ("usize", entries.usize[which])):
        value = head[field].astype(np.int64)
        mismatch |= sizes_known & (value != _FULL32) & (value != full) & (value != fixed[field])
    why[(why == 0) & mismatch] = 4
    start = local + _LOCAL_SIZE + head["nlen"].astype(np.int64) + head["elen"].astype(np.int64)
    return np.where(why == 0, start, -1), why


# --------------------------------------------------------------------------- the format

# A compressed member's offset: VIRTUAL, its entry's number in the central directory, and the place
# in its decompressed data (the reader adds that to the member's offset).
_WITHIN_BITS = 38  # members up to 256 GiB
MAX_ENTRY = 1 << (62 - _WITHIN_BITS)  # compressed members among the first 16,777,216 entries


class ZipFormat:
    name = "zip"
    suffixes = (".zip",)
    members_as_stored = True  # stored members are; compressed ones carry VIRTUAL (see as_stored)

    def as_stored(self, offsets) -> bool:
        """Stored members are byte ranges of the shard: the compiled loop serves them. A compressed
        member's offset is virtual: the loop sends its reads to Python (fuse/table.py)."""
        return True

    def open_layout(self, src: ByteSource, size: int) -> ZipLayout:
        if src.size != size:
            raise ShardFormatError(f"file is {src.size} bytes, expected {size} (shard changed?)")
        return ZipLayout(src)

    gives_columns = True  # scan(columns=True): members as tarcolumns' columns, for index/plain.py
    # but the scan is numpy in Python: built in worker processes (view/dataset.builds_in_threads), whose
    # malloc keeps its large temporaries (the daemon's fixed mmap threshold cost 1.5x the CPU, 3x the faults)
    scans_in_python = True

    def scan(self, src: ByteSource, columns: bool = False) -> ScanResult:
        """The members, from the central directory and the local headers; with ``columns``, as the
        tar scanner's columns (a zip of a million plain members indexed without a record each),
        unless its ``.cls`` labels are to be read (index/shard_index.py reads them from records)."""
        try:
            found, warnings = self._scan(src)
        except ShardFormatError as exc:
            return ScanResult(members=[], warnings=[], error=str(exc))
        if columns and b".cls" not in found.names.lower():
            return ScanResult(members=[], warnings=warnings, columns=found)
        return ScanResult(members=list(found.records()), warnings=warnings)

    def _scan(self, src: ByteSource) -> tuple[MemberColumns, list[str]]:
        where = find_directory(src)
        cd = bytes(src.pread(where.at, where.size))
        if len(cd) != where.size:
            raise ShardFormatError(f"central directory cut off ({len(cd)} of {where.size} bytes)")
        entries = read_entries(cd, where.at, walk(cd, where.count), where.shift)
        del cd
        warnings: list[str] = []
        fixed = entries.fixed
        names = names_of(entries)
        modes = unix_modes(entries)
        nlen = fixed["nlen"].astype(np.int64)
        directory = (nlen > 0) & (entries.raw[np.maximum(entries.name_at + nlen - 1, 0)] == ord("/"))
        directory |= (modes & _IFMT) == stat.S_IFDIR
        method = fixed["method"]
        encrypted = (fixed["flags"] & (_ENCRYPTED | _STRONG)) != 0
        readable = np.isin(method, [STORED, *_METHODS]) | directory
        _left_out(warnings, encrypted, "encrypted", names)
        for m in np.unique(method[~encrypted & ~readable]).tolist():
            why = "no library for it on this node" if m in (DEFLATE64, ZSTD) else "not read here"
            _left_out(warnings, ~encrypted & ~readable & (method == m),
                      f"compressed with {_METHOD_NAMES.get(m, f'method {m}')} ({why})", names)
        far = (method != STORED) & ~directory & ((np.arange(len(method)) >= MAX_ENTRY) | (entries.usize >= 1 << _WITHIN_BITS))
        _left_out(warnings, far, "compressed, past the 16,777,216th entry or over 256 GiB", names)
        stored_twice = (method == STORED) & ~directory & (entries.csize != entries.usize)
        _left_out(warnings, stored_twice, "stored, with two different sizes", names)
        which = np.flatnonzero(~encrypted & readable & ~far & ~stored_twice)
        start, why = data_starts(src.pread, src.size, entries, which)
        for code, text in _WHY.items():
            _left_out(warnings, why == code, text, names, which)
        which, start = which[start >= 0], start[start >= 0]
        _refuse_overlaps(entries, which, start, where)
        return _columns(src, entries, names, modes, directory, which, start, warnings), warnings


def _columns(src, entries: Entries, all_names, modes, directory, which, start, warnings) -> MemberColumns:
    """The members ``which`` as the tar scanner's columns (formats/tarcolumns.py)."""
    fixed = entries.fixed
    mtime = entries.mtime[which]
    unset = np.flatnonzero(np.isnan(mtime))
    if len(unset):
        mtime[unset] = dos_times(entries, which[unset])
    mode, dirs = modes[which], directory[which]
    kind = np.where(dirs, int(Kind.DIR), int(Kind.FILE))
    kind[((mode & _IFMT) == stat.S_IFLNK) & ~dirs] = int(Kind.SYMLINK)
    # unzip's modes where the entry gives no unix mode: 0644, folders 0755, read-only 0444 (umask 022)
    read_only = (fixed["external"][which] & 1) == 1
    default = np.where(dirs, 0o755, np.where(read_only, 0o444, 0o644))
    perm = np.where(mode != 0, mode & 0o7777, default)
    compressed = (fixed["method"][which] != STORED) & ~dirs
    offset = np.where(compressed, VIRTUAL | which.astype(np.int64) << _WITHIN_BITS, np.where(dirs, 0, start))
    size = np.where(dirs, 0, entries.usize[which])
    names = all_names if len(which) == len(all_names) else [all_names[w] for w in which.tolist()]
    links = _link_targets(src, names, kind, offset, size, warnings)
    if links:
        gone = np.array([i for i, t in links.items() if t is None], np.int64)
        keep = np.setdiff1d(np.arange(len(names)), gone)
        names = [names[i] for i in keep.tolist()]
        kind, offset, size, perm, mtime, dirs = (a[keep] for a in (kind, offset, size, perm, mtime, dirs))
        targets = [links.get(i, b"") for i in keep.tolist()]
        offset[kind == Kind.SYMLINK] = 0
        size[kind == Kind.SYMLINK] = [len(t) for t in targets if t]
    else:
        targets = []
    rows = np.zeros((len(names), NFIELDS), np.int64)
    lengths = np.fromiter(map(len, names), np.int64, len(names))
    rows[:, NAME_END] = np.cumsum(lengths)
    rows[:, KIND], rows[:, OFFSET], rows[:, SIZE], rows[:, MODE] = kind, offset, size, perm
    rows[:, MTIME] = np.nan_to_num(mtime).astype(np.int64)
    rows[:, LINK_END] = np.cumsum([len(t) for t in targets]) if targets else 0
    rows[:, SMALL_END] = -1
    blob = b"".join(names)
    above = _normal_forms(names, dirs, blob, rows)
    return MemberColumns(blob, rows, b"".join(targets), b"", above)


def _link_targets(src, names, kind, offset, size, warnings) -> dict[int, bytes | None]:
    """Each symlink's target (its data), None for one that cannot be read."""
    links: dict[int, bytes | None] = {}
    layout = None
    for i in np.flatnonzero(kind == Kind.SYMLINK).tolist():
        layout = layout or ZipLayout(src)
        try:
            links[i] = bytes(layout.read(int(offset[i]), min(int(size[i]), 4095), src.pread)) or None
        except ShardFormatError as exc:
            links[i] = None
            warnings.append(f"symlink {_shown(names[i])} left out: {exc}")
        else:
            if links[i] is None or b"\0" in links[i]:
                links[i] = None
                warnings.append(f"symlink {_shown(names[i])} left out: an empty target or a NUL byte in it")
    return links


def _normal_forms(names: list[bytes], dirs: np.ndarray, blob: bytes, rows: np.ndarray) -> bytes:
    """Fills each row's normal form (its span in the name, its path hash, its parent's end and
    hash, as _tarscan.c does) and returns the hashes of the folders above the parents. A name that
    index/names.normalise would change beyond a folder's trailing slash, or refuse, is NOT_NORMAL:
    its shard then goes through index/replay.py, which normalises names for every format."""
    ends = rows[:, NAME_END]
    lengths = np.diff(ends, prepend=0)
    begins = ends - lengths
    norm_end = lengths - dirs
    suspect = (norm_end <= 0) | (norm_end > _MAX_NAME)
    if len(blob):
        b = np.frombuffer(blob, np.uint8)
        first = b[np.minimum(begins, len(b) - 1)]
        suspect |= (first == ord(".")) | (first == ord("/"))
        suspect |= b[np.maximum(begins + norm_end - 1, 0)] == ord("/")
    for needle in (b"//", b"/.", b"\0"):
        at = blob.find(needle)
        while at >= 0:
            suspect[np.searchsorted(ends, at, side="right")] = True
            at = blob.find(needle, at + 1)
    rows[:, NORM_START] = np.where(suspect, NOT_NORMAL, 0)
    rows[:, NORM_END] = np.where(suspect, NOT_NORMAL, norm_end)
    odd = np.flatnonzero(suspect | dirs)
    norms = list(names) if len(odd) else names
    for i in odd.tolist():
        norms[i] = b"" if suspect[i] else names[i][:-1]
    rows[:, HASH] = np.fromiter(map(xxh64_intdigest, norms), np.uint64, len(norms)).view(np.int64)
    # each parent: up to the last "/" of the normal form, found for all names at once
    slashes = np.concatenate([[-1], np.flatnonzero(np.frombuffer(blob, np.uint8) == ord("/"))])  # -1: none
    cut = slashes[np.searchsorted(slashes, begins + np.maximum(norm_end, 0), side="left") - 1] - begins
    cut = np.where(suspect | (cut <= 0), -1, cut)
    rows[:, PARENT_END] = np.where(cut > 0, cut, NOT_NORMAL)
    # parents come in runs (a folder's members together): hashed once a run
    plen = np.maximum(cut, 0)
    b8 = np.frombuffer(blob, np.uint8) if len(blob) else np.zeros(1, np.uint8)
    new_run = np.ones(len(names), bool)
    if len(names) > 1:
        alike = plen[1:] == plen[:-1]
        alike[alike] = _ragged_equal(b8, begins[1:][alike], b8, begins[:-1][alike], plen[1:][alike])
        new_run[1:] = ~alike
    firsts = np.flatnonzero(new_run)
    parents = [norms[i][:n] for i, n in zip(firsts.tolist(), plen[firsts].tolist())]
    hashes = {p: xxh64_intdigest(p) for p in dict.fromkeys(parents)}
    run_hash = np.fromiter(map(hashes.__getitem__, parents), np.uint64, len(parents))
    rows[:, PARENT_HASH] = run_hash[np.cumsum(new_run) - 1].view(np.int64)
    above = {xxh64_intdigest(p[:i]) for p in hashes for i in range(1, len(p)) if p[i] == 0x2F}
    return np.array(sorted(above), np.uint64).tobytes()


def dos_times(entries: Entries, which: np.ndarray) -> np.ndarray:
    """DOS date and time as local time (unzip: mktime with the node's TZ), each distinct one once."""
    packed = entries.fixed["date"][which].astype(np.int64) << 16 | entries.fixed["time"][which]
    values, inverse = np.unique(packed, return_inverse=True)
    seconds = np.array([_dos_time(int(v)) for v in values.tolist()], np.float64)
    return seconds[inverse.reshape(-1)]


def _dos_time(packed: int) -> float:
    date, clock = packed >> 16, packed & 0xFFFF
    parts = (1980 + (date >> 9), max(1, (date >> 5) & 15), max(1, date & 31), clock >> 11, (clock >> 5) & 63,
             (clock & 31) * 2, 0, 0, -1)
    try:
        return time.mktime(parts)
    except (OverflowError, ValueError):
        return 0.0


def _shown(name: bytes) -> str:
    return name.decode("utf-8", "backslashreplace")


def _left_out(warnings: list[str], mask, why: str, names: list[bytes], which=None) -> None:
    """One line for all the members ``mask`` leaves out, naming the first."""
    count = int(np.count_nonzero(mask))
    if count:
        first = int(np.flatnonzero(mask)[0])
        name = names[first if which is None else int(which[first])]
        warnings.append(f"{count} {'member' if count == 1 else 'members'} left out: {why} (the first: {_shown(name)})")


def _refuse_overlaps(entries: Entries, which: np.ndarray, start: np.ndarray, where: Directory) -> None:
    """Members whose local header or data overlaps another's, or the central directory: a zip bomb
    (or damage). unzip refuses such an archive whole, and so do we."""
    if not len(which):
        return
    lo, hi = entries.local[which], start + entries.csize[which]
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], hi[order]
    if len(lo) > 1 and np.any(lo[1:] < np.maximum.accumulate(hi)[:-1]):
        raise ShardFormatError("members overlap each other (a zip bomb?): refused")
    if int(hi.max()) > where.at:
        raise ShardFormatError("a member's data overlaps the central directory (a zip bomb, or cut off): refused")


# --------------------------------------------------------------------------- reads


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
        entry, within = (offset & ~VIRTUAL) >> _WITHIN_BITS, offset & ((1 << _WITHIN_BITS) - 1)
        key = (self._id, entry)
        data = self._cache.get(key)
        if data is None:
            member = self._member(entry, fetch)
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
        for entry in range(len(self._entries(fetch).start)):
            try:
                member = self._member(entry, fetch)
            except ShardFormatError:
                continue
            if member.flags & (_ENCRYPTED | _STRONG) or member.method not in (STORED, *_METHODS):
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
        """The central directory's entries and their local headers checked, all at once (as the
        scan did): ~40 bytes per entry, kept while the zip is mounted; a read then costs no parse."""
        with self._lock:
            if self._table is None:
                where = find_directory(self._src)
                cd = bytes(fetch(where.at, where.size))
                if len(cd) != where.size:
                    raise ShardFormatError("central directory cut off")
                entries = read_entries(cd, where.at, walk(cd, where.count), where.shift)
                start, why = data_starts(fetch, self._src.size, entries, np.arange(where.count))
                f = entries.fixed
                self._table = _Table(start, why, f["method"].copy(), f["flags"].copy(), entries.csize, entries.usize,
                                     f["crc"].copy(), entries.at, f["nlen"].copy())
            return self._table

    def _member(self, entry: int, fetch: Fetch) -> _Member:
        t = self._entries(fetch)
        if entry >= len(t.start):
            raise ShardFormatError(f"no entry {entry} in the central directory")
        if t.start[entry] < 0:
            raise ShardFormatError(f"member {self._name(entry, fetch)}: {_WHY[int(t.why[entry])]}")
        return _Member(entry, int(t.method[entry]), int(t.start[entry]), int(t.csize[entry]), int(t.usize[entry]),
                       int(t.crc[entry]), int(t.flags[entry]))

    def _name(self, entry: int, fetch: Fetch) -> str:
        """A member's name, for a message (read again from its entry: names are not kept)."""
        t = self._entries(fetch)
        return _shown(bytes(fetch(int(t.at[entry]) + _CENTRAL_SIZE, int(t.nlen[entry]))))


@dataclass
class _Table:
    """What reading each entry's data needs, as columns."""

    start: np.ndarray  # int64: where its data starts, -1 where its local header did not check out
    why: np.ndarray  # int8: why not (_WHY)
    method: np.ndarray
    flags: np.ndarray
    csize: np.ndarray
    usize: np.ndarray
    crc: np.ndarray
    at: np.ndarray  # int64: its central entry's offset in the shard (for its name)
    nlen: np.ndarray


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


FORMAT = ZipFormat()
