"""Zip archives' directory: the end records (zip64 too), the central directory's entries and their
extra fields read as columns, names and modes as unzip takes them, and every member's local header
read and checked against its entry (formats/zip.py's scan, and zipread.py's first read of a member).

Entries and headers are read for all members at once, with numpy and _zipdir.c (the loops numpy
needs many passes for): a Python step per member cost more than everything else at a million
members."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from shardfs.formats import _zipdir
from shardfs.formats.base import ByteSource, Fetch, ShardFormatError

_EOCD, _ZIP64_LOCATOR, _ZIP64_EOCD = b"PK\x05\x06", b"PK\x06\x07", b"PK\x06\x06"
_CENTRAL, _LOCAL = 0x02014B50, 0x04034B50
_EOCD_SIZE, _LOCATOR_SIZE, _ZIP64_EOCD_SIZE, CENTRAL_SIZE, _LOCAL_SIZE = 22, 20, 56, 46, 30
_MAX_COMMENT = 0xFFFF
_FULL32 = 0xFFFFFFFF
_ZIP64_EXTRA, _TIME_EXTRA = 0x0001, 0x5455
ENCRYPTED, _DESCRIPTOR, _UTF8 = 0x0001, 0x0008, 0x0800
STRONG = 0x0040
# hosts whose names are in the OEM code page (CP437) when the UTF-8 flag is clear, as unzip reads
# them (unzip's Ext_ASCII_TO_Native); others (Unix, macOS) are taken as the bytes they are
_OEM_HOSTS = {0, 6, 10, 14}  # MS-DOS/FAT, OS/2 HPFS, Windows NTFS, VFAT
_UNIX = 3
IFMT = 0o170000  # the file type bits of st_mode
_GAP = 1 << 20  # local headers at most this far apart are read with the bytes between them
_SPAN = 4 << 20  # a read of such headers: about this many bytes
_BATCH = 64 << 20  # local headers checked in batches of at most this many bytes read

_CENTRAL_DTYPE = np.dtype([("sig", "<u4"), ("made_by", "<u2"), ("needed", "<u2"), ("flags", "<u2"),
                           ("method", "<u2"), ("time", "<u2"), ("date", "<u2"), ("crc", "<u4"), ("csize", "<u4"),
                           ("usize", "<u4"), ("nlen", "<u2"), ("elen", "<u2"), ("clen", "<u2"), ("disk", "<u2"),
                           ("internal", "<u2"), ("external", "<u4"), ("local", "<u4")])
_LOCAL_DTYPE = np.dtype([("sig", "<u4"), ("needed", "<u2"), ("flags", "<u2"), ("method", "<u2"), ("time", "<u2"),
                         ("date", "<u2"), ("crc", "<u4"), ("csize", "<u4"), ("usize", "<u4"), ("nlen", "<u2"),
                         ("elen", "<u2")])
assert _CENTRAL_DTYPE.itemsize == CENTRAL_SIZE and _LOCAL_DTYPE.itemsize == _LOCAL_SIZE

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
    if count and cd_size < count * CENTRAL_SIZE:
        raise ShardFormatError(f"a central directory of {cd_size} bytes cannot hold {count} entries")
    return Directory(cd_at + shift, cd_size, count, shift)


class Names:
    """Names back to back, as the central directory holds them, kept as one bytes object and its
    ends (a list of a million small bytes objects cost a tenth of a million-member scan)."""

    def __init__(self, blob: bytes, ends: np.ndarray):
        self.blob, self.ends = blob, ends

    def __len__(self) -> int:
        return len(self.ends)

    def __getitem__(self, i: int) -> bytes:
        return self.blob[int(self.ends[i - 1]) if i else 0 : int(self.ends[i])]

    def take(self, which: np.ndarray) -> "Names":
        if len(which) == len(self):
            return self
        parts = [self[i] for i in which.tolist()]
        return Names(b"".join(parts), np.cumsum([len(p) for p in parts], dtype=np.int64))


@dataclass
class Entries:
    """The central directory's entries as columns, and their raw names."""

    at: np.ndarray  # int64: each entry's offset in the shard
    fixed: np.ndarray  # _CENTRAL_DTYPE
    csize: np.ndarray  # int64, zip64 applied
    usize: np.ndarray
    local: np.ndarray  # int64: the local header's offset in the shard (shift applied)
    mtime: np.ndarray  # float64: the extended timestamp, NaN where none
    names: Names  # as stored
    raw: np.ndarray  # uint8: the central directory they were read from
    name_at: np.ndarray  # int64: where each name is in ``raw``


def _gather(data: bytes, starts: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Records of ``dtype`` at byte offsets ``starts`` of ``data`` (every one within it)."""
    return np.frombuffer(_zipdir.records(data, np.ascontiguousarray(starts, np.int64), dtype.itemsize), dtype)


def _int(data: bytes, at: np.ndarray, width: int) -> np.ndarray:
    """Little-endian unsigned integers of ``width`` bytes at ``at``."""
    return _gather(data, at, np.dtype(f"<u{width}")).astype(np.int64)


def same_bytes(a, a_at: np.ndarray, b, b_at: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """For each i, whether a[a_at[i]:][:lengths[i]] == b[b_at[i]:][:lengths[i]] (False where a range
    runs past either end)."""
    cols = [np.ascontiguousarray(x, np.int64) for x in (a_at, b_at, lengths)]
    return np.frombuffer(_zipdir.same_bytes(a, cols[0], b, cols[1], cols[2]), np.uint8).astype(bool)


def read_entries(cd: bytes, where: Directory) -> Entries:
    """The entries of the central directory ``cd`` (read from ``where``), each one's lengths giving
    the next, zip64 and extended timestamp extra fields applied."""
    try:
        starts, blob, name_end = _zipdir.walk(cd, where.count)
    except ValueError as exc:
        raise ShardFormatError(str(exc)) from None
    starts, name_end = np.frombuffer(starts, np.int64), np.frombuffer(name_end, np.int64)
    fixed = _gather(cd, starts, _CENTRAL_DTYPE)
    bad = np.flatnonzero(fixed["sig"] != _CENTRAL)
    if len(bad):
        raise ShardFormatError(f"central directory entry {int(bad[0])} has a bad signature")
    buf = np.frombuffer(cd, np.uint8)
    csize, usize = fixed["csize"].astype(np.int64), fixed["usize"].astype(np.int64)
    local = fixed["local"].astype(np.int64)
    mtime = np.full(len(starts), np.nan)
    # the extra fields, one (tag, size, data) after another, walked for every entry at once
    pos = starts + CENTRAL_SIZE + fixed["nlen"]
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
    return Entries(where.at + starts, fixed, csize, usize, local + where.shift, mtime, Names(blob, name_end), buf,
                   starts + CENTRAL_SIZE)


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


def names_of(entries: Entries) -> Names:
    """Each name as unzip writes it: UTF-8 when flagged (or plain ASCII), CP437 from DOS and Windows
    hosts (unzip's OEM code page), the bytes as they are from others."""
    names = entries.names
    oem = ((entries.fixed["flags"] & _UTF8) == 0) & np.isin(entries.fixed["made_by"] >> 8, list(_OEM_HOSTS))
    if not oem.any():
        return names
    parts = [names[i] for i in range(len(names))]
    for i in np.flatnonzero(oem).tolist():
        if not parts[i].isascii():
            parts[i] = parts[i].decode("cp437").encode("utf-8")
    return Names(b"".join(parts), np.cumsum([len(p) for p in parts], dtype=np.int64))


def shown(name: bytes) -> str:
    return name.decode("utf-8", "backslashreplace")


def unix_modes(entries: Entries) -> np.ndarray:
    """The st_mode unzip gives each member (uint32, type bits included; 0: from its DOS attributes)."""
    host = entries.fixed["made_by"] >> 8
    high = (entries.fixed["external"] >> 16).astype(np.uint32)
    # unzip takes the high 16 bits as a unix mode from Unix and other hosts that set them (7-Zip,
    # Windows tools with the unix extension), when they hold a file type
    typed = (high & IFMT) != 0
    return np.where((host == _UNIX) & (high != 0) | typed, high, 0).astype(np.uint32)


# --------------------------------------------------------------------------- local headers


def data_starts(pread: Fetch, size: int, entries: Entries, which: np.ndarray,
                window: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(data start, or -1 where the local header does not match, why) for entries ``which``: each
    local header read and checked against its central entry. Close ones are read together, in
    reads of the larger of _SPAN and the source's ``window`` (a remote object's request)."""
    local = entries.local[which]
    nlen = entries.fixed["nlen"][which].astype(np.int64)
    want = _LOCAL_SIZE + nlen
    order = np.argsort(local, kind="stable")
    out = np.full(len(which), -1, np.int64)
    why = np.zeros(len(which), np.int8)
    past = local + want > size
    why[past] = 1
    order = order[~past[order]]
    for batch in _spans(local[order], want[order], max(_SPAN, window)):
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


def _spans(starts: np.ndarray, lengths: np.ndarray, span: int):
    """Batches of reads covering [starts[i], starts[i]+lengths[i]) (sorted by start). Headers less
    than _GAP apart are read with the bytes between them, front to back in pieces of about ``span``
    (each piece starting where the one before ended): a read per header cost more than the bytes
    between, on every storage measured (page cache: ~80 us a read through the storage pool, about
    240 KB of reading; a disk's seek or a remote request: a few MB). So a zip of JPEGs is read as
    a tar is at its first mount, once, sequentially, and the caches keep what the build read
    (storage/buildfill.py); only headers of members over _GAP apart are read alone."""
    if not len(starts):
        return
    reach = np.maximum.accumulate(starts + lengths)  # the furthest byte wanted so far
    new_run = np.ones(len(starts), bool)
    new_run[1:] = starts[1:] - reach[:-1] > _GAP
    run_lo = starts[new_run][np.cumsum(new_run) - 1]
    piece = (starts - run_lo) // span
    new_piece = new_run.copy()
    new_piece[1:] |= piece[1:] != piece[:-1]
    first = np.flatnonzero(new_piece)
    last = np.append(first[1:], len(starts)) - 1  # each piece's last member
    lo = starts[first]
    # a piece ends where the next one of its run starts (so a run is read whole), else at its reach
    hi = np.where(np.append(~new_run[first[1:]], False), np.append(lo[1:], 0), reach[last])
    spans: list[tuple[int, int]] = []
    members: list[np.ndarray] = []
    total = 0
    for a, b, s, e in zip(first.tolist(), (last + 1).tolist(), lo.tolist(), hi.tolist()):
        spans.append((s, e))
        members.append(np.arange(a, b))
        total += e - s
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


WHY = {1: "its local header lies past the end", 2: "its local header has a bad signature",
        3: "its local header names another member", 4: "its local header does not match its entry (method, sizes)"}


def _check(entries: Entries, which, head, data: bytes, at, local) -> tuple[np.ndarray, np.ndarray]:
    # each field taken alone: a million entries' records taken at once cost 0.3 s (46-byte
    # records, copied field by field)
    fixed = {f: entries.fixed[f][which] for f in ("nlen", "method", "crc", "csize", "usize")}
    why = np.zeros(len(which), np.int8)
    why[head["sig"] != _LOCAL] = 2
    why[(why == 0) & (head["nlen"] != fixed["nlen"])] = 3
    # names compared byte for byte
    lengths = np.where(why == 0, fixed["nlen"], 0).astype(np.int64)
    same = same_bytes(data, _LOCAL_SIZE + at, entries.raw, entries.name_at[which], lengths)
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

