"""Zip files (``.zip``), as Info-ZIP, 7-Zip, Python's zipfile and Windows write them (PKZIP 2.0 and
later, zip64 included), served as ``unzip`` extracts them.

The index comes from the central directory alone, found from the end (the end record, the zip64
locator and record); each member's data starts after its *local* header, whose name and extra field
may differ from the central ones, so every local header is read and checked in the scan too
(signature, name, method, sizes): a stored member is then a byte range of the shard as stored,
served by the compiled loop like a tar member, without Python. Local headers less than 1 MiB
apart are read with the data between them, front to back in large reads (a zip of JPEGs or of a
million tiny members: the whole zip once, as a tar's first mount reads it, and the caches keep
it); those of members further apart are read alone.

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

zipdir.py reads the end records, the central directory and the local headers; zipread.py a
member's bytes; this module turns them into the index's members.
"""

from __future__ import annotations

import stat
import time

import numpy as np

from shardfs.formats.base import VIRTUAL, ByteSource, Kind, ScanResult, ShardFormatError
from shardfs.formats.tarcolumns import KIND, LINK_END, MODE, MTIME, NAME_END, NFIELDS, OFFSET, SIZE, SMALL_END, MemberColumns
from shardfs.formats import _zipdir
from shardfs.formats.zipdir import (ENCRYPTED, IFMT, STRONG, WHY, Directory, Entries, Names, data_starts,
                                    find_directory, names_of, read_entries, shown, unix_modes)
from shardfs.formats.zipread import (BZIP2, DEFLATE64, LZMA, MAX_ENTRY, METHODS, STORED, WITHIN_BITS, ZSTD,  # noqa: F401
                                     ZipLayout)

_METHOD_NAMES = {DEFLATE64: "deflate64", BZIP2: "bzip2", LZMA: "lzma", ZSTD: "zstd", 6: "implode", 1: "shrink",
                 98: "ppmd", 95: "xz", 99: "AES (encrypted)"}


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
    # (and is built on a thread of the daemon as tar's: measured at a million members, a worker
    # process cost the daemon ~2 s more CPU to take its index back than the scan's numpy pays here)

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
        entries = read_entries(cd, where)
        del cd
        warnings: list[str] = []
        fixed = entries.fixed
        names = names_of(entries)
        modes = unix_modes(entries)
        nlen = fixed["nlen"].astype(np.int64)
        directory = (nlen > 0) & (entries.raw[np.maximum(entries.name_at + nlen - 1, 0)] == ord("/"))
        directory |= (modes & IFMT) == stat.S_IFDIR
        method = fixed["method"]
        encrypted = (fixed["flags"] & (ENCRYPTED | STRONG)) != 0
        readable = np.isin(method, [STORED, *METHODS]) | directory
        _left_out(warnings, encrypted, "encrypted", names)
        for m in np.unique(method[~encrypted & ~readable]).tolist():
            why = "no library for it on this node" if m in (DEFLATE64, ZSTD) else "not read here"
            _left_out(warnings, ~encrypted & ~readable & (method == m),
                      f"compressed with {_METHOD_NAMES.get(m, f'method {m}')} ({why})", names)
        far = (method != STORED) & ~directory & ((np.arange(len(method)) >= MAX_ENTRY) | (entries.usize >= 1 << WITHIN_BITS))
        _left_out(warnings, far, "compressed, past the 16,777,216th entry or over 256 GiB", names)
        stored_twice = (method == STORED) & ~directory & (entries.csize != entries.usize)
        _left_out(warnings, stored_twice, "stored, with two different sizes", names)
        which = np.flatnonzero(~encrypted & readable & ~far & ~stored_twice)
        start, why = data_starts(src.pread, src.size, entries, which, getattr(src, "window", 0))
        for code, text in WHY.items():
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
    kind[((mode & IFMT) == stat.S_IFLNK) & ~dirs] = int(Kind.SYMLINK)
    # unzip's modes where the entry gives no unix mode: 0644, folders 0755, read-only 0444 (umask 022)
    read_only = (fixed["external"][which] & 1) == 1
    default = np.where(dirs, 0o755, np.where(read_only, 0o444, 0o644))
    perm = np.where(mode != 0, mode & 0o7777, default)
    compressed = (fixed["method"][which] != STORED) & ~dirs
    offset = np.where(compressed, VIRTUAL | which.astype(np.int64) << WITHIN_BITS, np.where(dirs, 0, start))
    size = np.where(dirs, 0, entries.usize[which])
    names = all_names.take(which)
    links = _link_targets(src, names, kind, offset, size, warnings)
    if links:
        gone = np.array([i for i, t in links.items() if t is None], np.int64)
        keep = np.setdiff1d(np.arange(len(names)), gone)
        names = names.take(keep)
        kind, offset, size, perm, mtime, dirs = (a[keep] for a in (kind, offset, size, perm, mtime, dirs))
        targets = [links.get(i, b"") for i in keep.tolist()]
        offset[kind == Kind.SYMLINK] = 0
        size[kind == Kind.SYMLINK] = [len(t) for t in targets if t]
    else:
        targets = []
    rows = np.zeros((len(names), NFIELDS), np.int64)
    rows[:, NAME_END] = names.ends
    rows[:, KIND], rows[:, OFFSET], rows[:, SIZE], rows[:, MODE] = kind, offset, size, perm
    rows[:, MTIME] = np.nan_to_num(mtime).astype(np.int64)
    rows[:, LINK_END] = np.cumsum([len(t) for t in targets]) if targets else 0
    rows[:, SMALL_END] = -1
    # each row's normal form, path hash and parent, as the tar scanner fills them (a name that
    # index/names.normalise would change beyond one trailing slash is NOT_NORMAL: its shard then
    # goes through index/replay.py, which normalises names for every format)
    above = _zipdir.normal_forms(names.blob, rows)
    return MemberColumns(names.blob, rows, b"".join(targets), b"", above)


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
            warnings.append(f"symlink {shown(names[i])} left out: {exc}")
        else:
            if links[i] is None or b"\0" in links[i]:
                links[i] = None
                warnings.append(f"symlink {shown(names[i])} left out: an empty target or a NUL byte in it")
    return links


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


def _left_out(warnings: list[str], mask, why: str, names: Names, which=None) -> None:
    """One line for all the members ``mask`` leaves out, naming the first."""
    count = int(np.count_nonzero(mask))
    if count:
        first = int(np.flatnonzero(mask)[0])
        name = names[first if which is None else int(which[first])]
        warnings.append(f"{count} {'member' if count == 1 else 'members'} left out: {why} (the first: {shown(name)})")


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



FORMAT = ZipFormat()
