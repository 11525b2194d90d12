"""Tar shards: one pass over the headers, yielding where every member's bytes are.

Written by hand rather than with ``tarfile`` for two reasons measured here:
``tarfile`` costs ~15 us per member (15 s to index 1M tiny files, this scanner
~3 s), and it gives up at the first damaged header without telling us which
members before it were fine. Handles ustar, GNU (long names/links, base-256
numbers, incremental dumpdirs, sparse files) and PAX (path, linkpath, size, mtime; sparse
formats 0.0, 0.1 and 1.0; global headers).

Plain headers (a regular file, folder or link; octal numbers; a good checksum) are parsed by a
compiled fast path (``_tarscan.c``) many at a time, from large sequential reads; it stops before
any other header, which is read here as before (the plain scanner, ``TarFormat(compiled=False)``,
reads them all), so GNU, PAX, sparse and damaged archives are read alike either way.

What GNU tar does with damage, the scan does too: a header with a bad checksum is skipped and the
next block tried as a header ("Skipping to next header"); a zero block ends the archive; a member
whose data the file cuts short is left out (tar -x writes part of it), and so is an earlier member
of the same name (``ScanResult.cut``). Whatever cannot be served as tar -x writes it (the
continuation of a file from another volume, devices) is left out with a warning naming it.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from shardfs.formats import carries_magic, sparse
from shardfs.formats.base import (
    SMALL_DATA,
    AsStored,
    ByteSource,
    Kind,
    MemberRecord,
    OtherFormat,
    ScanResult,
    ShardFormatError,
    Window,
)
from shardfs.formats.tarcolumns import NFIELDS, MemberColumns
from shardfs.storage.base import ShardIOError

try:
    from shardfs.formats import _tarscan
except ImportError:  # a checkout whose extensions are not built: the plain scanner alone
    _tarscan = None
if _tarscan is not None and _tarscan.NFIELDS != NFIELDS:
    _tarscan = None  # built from another version of _tarscan.c (build_ext again): not to be misread

BLOCK = 512
PAGE = mmap.PAGESIZE
MAX_EXT_HEADER = 1 << 20  # a PAX or GNU long-name record (or a PAX 1.0 sparse map) larger than this is hostile

_REGULAR = {b"0", b"\0", b"7"}
_DIRS = {b"5", b"D"}  # D: a GNU --listed-incremental dumpdir (its data lists the directory: not served)
_SKIPPED = {
    b"3": "character device not served",
    b"4": "block device not served",
    b"6": "fifo not served",
    b"M": "GNU multi-volume continuation (the start of its data is in another volume) not served",
    b"N": "old GNU long-name list not served",
}
_IGNORED = {b"V"}  # a GNU volume label: tar -x creates nothing for it either
_SPARSE_PAX = b"GNU.sparse."  # PAX sparse formats 0.0, 0.1 and 1.0 on a regular typeflag
_SPARSE_STAR = b"SCHILY.realsize"  # star's name for a sparse file's real size (its map: not read here)
_SPARSE_0_0 = (b"GNU.sparse.offset", b"GNU.sparse.numbytes")  # PAX 0.0: a map as repeated records
SKIP_READ = 1 << 20  # how much is read at once while skipping damage block by block
_NO_CHECKSUM = bytes(8)  # a zero block's checksum field
_OLD_SPARSE_AT, _OLD_SPARSE_ENTRIES, _EXT_SPARSE_ENTRIES = 386, 4, 21  # GNU 'S': map in the header, then blocks
# The fast path reads this much at once, on from where it last read while what it skips is less
# (one sequential stream, as the RAM cache loads a shard, not a seek per member).
CHUNK = 4 << 20
_PLAIN_WAY = 1  # _tarscan stopped before a header it leaves to the plain scanner
# PAX global records that change how a plain header reads (sparse ones are tested apart)
_GLOBAL_PLAIN = (b"path", b"linkpath", b"size", b"mtime")


def _number(field: bytes) -> int:
    if field and field[0] & 0x80:  # GNU base-256 for values that do not fit in octal
        value = int.from_bytes(field[1:], "big")
        return value - (1 << (8 * len(field) - 8)) if field[0] & 0x40 else value
    text = field.split(b"\0", 1)[0].strip(b" ")
    if not text:
        return 0
    if not text.isdigit():  # int() would also take "-1", "+7", "1_0", "0o7"
        raise ShardFormatError(f"bad number field {field!r}")
    try:
        return int(text, 8)
    except ValueError:  # an 8 or a 9
        raise ShardFormatError(f"bad number field {field!r}") from None


def _checksum_ok(header: bytes) -> bool:
    # Octal only (every writer's; tar -x reads base-256 here too, but none writes it): a block of
    # data fails on this test alone, which keeps skipping through damage fast (~1 us a block).
    text = header[148:156].split(b"\0", 1)[0].strip(b" ")
    if not text.isdigit():
        return False
    try:
        want = int(text, 8)
    except ValueError:  # an 8 or a 9
        return False
    unsigned = sum(header[:148]) + 256 + sum(header[156:])
    if want == unsigned:
        return True
    signed = sum(b - 256 if b > 127 else b for b in header[:148] + b" " * 8 + header[156:])
    return want == signed


def _skip_damage(win: Window, pos: int, size: int) -> int:
    """Where tar -x goes on after a header with a bad checksum: the next block that is a good
    header, or a zero block (which ends the archive); read in large pieces, as this may be far."""
    while pos + BLOCK <= size:
        chunk = win.get(pos, min(SKIP_READ, (size - pos) // BLOCK * BLOCK))
        for at in range(0, len(chunk), BLOCK):
            block = chunk[at : at + BLOCK]
            if (block[148:156] == _NO_CHECKSUM and block.count(0) == BLOCK) or _checksum_ok(block):
                return pos + at
        pos += len(chunk)
    return pos


def _pax_items(data: bytes):
    """(key, value) of each record, in order (PAX 0.0 sparse maps repeat their keys)."""
    pos = 0
    while pos < len(data):
        if data[pos] == 0:
            break
        space = data.find(b" ", pos)
        if space < 0:
            raise ShardFormatError("bad PAX record")
        try:
            length = int(data[pos:space])
        except ValueError:
            raise ShardFormatError("bad PAX record length") from None
        if length <= space - pos or pos + length > len(data):
            raise ShardFormatError("PAX record length out of range")
        key, sep, value = data[space + 1 : pos + length - 1].partition(b"=")
        if not sep:
            raise ShardFormatError("PAX record without '='")
        yield key, value
        pos += length


def _name_field(field: bytes) -> bytes:
    return field.split(b"\0", 1)[0]


def _is_sparse(attrs: dict[bytes, bytes]) -> bool:
    """Whether a regular member's PAX records say its data area holds a sparse map and data blocks."""
    return any(key.startswith(_SPARSE_PAX) or key == _SPARSE_STAR for key in attrs)


def _decimal(attrs: dict[bytes, bytes], key: bytes) -> int:
    if key not in attrs:
        raise ShardFormatError(f"no {key.decode()}")
    return sparse.numbers(attrs[key], key.decode())[0]


def _old_gnu_map(win: Window, header: bytes, data_at: int, size: int) -> tuple[list[int], int]:
    """The map of a GNU 'S' member (numbers, in pairs) and where its data starts, read as GNU tar
    does: entries until one with an empty length field, then extension blocks while the last
    block read says another follows and no entry ended the map."""
    pairs: list[int] = []

    def entries(block: bytes, at: int, count: int) -> bool:
        for i in range(at, at + 24 * count, 24):
            if not block[i + 12]:
                return False
            pairs.extend((_number(block[i : i + 12]), _number(block[i + 12 : i + 24])))
            if len(pairs) > 2 * sparse.MAX_RUNS:
                raise ShardFormatError("a sparse map too long")
        return True

    more = entries(header, _OLD_SPARSE_AT, _OLD_SPARSE_ENTRIES) and header[482]
    while more:
        if data_at + BLOCK > size:
            raise ShardFormatError(f"truncated inside a GNU sparse map at offset {data_at}")
        block = win.get(data_at, BLOCK)
        data_at += BLOCK
        more = entries(block, 0, _EXT_SPARSE_ENTRIES) and block[504]
    return pairs, data_at


def _pax_1_0_map(win: Window, data_at: int, data_size: int) -> tuple[list[int], int]:
    """PAX 1.0: the map is decimal lines at the start of the data (a count, then pairs), padded to
    a block; the runs' bytes follow it. Returns the numbers of the pairs and where the runs start."""
    text = b""
    while True:
        lines = text.split(b"\n")[:-1]  # the complete ones
        if lines:
            count = sparse.numbers(lines[0], "PAX 1.0")[0]
            if count > sparse.MAX_RUNS:
                raise ShardFormatError("a sparse map too long")
            if len(lines) >= 1 + 2 * count:
                break
        block = win.get(data_at + len(text), BLOCK)
        if len(text) >= min(data_size, MAX_EXT_HEADER) or not block:
            raise ShardFormatError("a PAX 1.0 sparse map longer than its data")
        text += block
    used = sum(len(line) + 1 for line in lines[: 1 + 2 * count])
    pairs = sparse.numbers(b"\n".join(lines[1 : 1 + 2 * count]), "PAX 1.0") if count else []
    return pairs, data_at + (used + BLOCK - 1) // BLOCK * BLOCK


def _sparse_map(win: Window, header: bytes, attrs: dict[bytes, bytes], old_map: list[int] | None,
                map_0_0: list[bytes], data_at: int, data_size: int):
    """A sparse member's runs (sparse.runs), real size and where its runs' bytes start, from
    whichever of the four encodings it has."""
    end = data_at + data_size
    if old_map is not None:
        pairs, real_size = old_map, _number(header[483:495])
    elif attrs.get(b"GNU.sparse.major") == b"1" and attrs.get(b"GNU.sparse.minor") == b"0":
        pairs, data_at = _pax_1_0_map(win, data_at, data_size)
        real_size = _decimal(attrs, b"GNU.sparse.realsize")
    elif b"GNU.sparse.map" in attrs:
        pairs = sparse.numbers(attrs[b"GNU.sparse.map"], "GNU.sparse.map")
        real_size = _decimal(attrs, b"GNU.sparse.size")
    elif map_0_0:
        pairs = sparse.numbers(b",".join(map_0_0), "GNU.sparse.offset")
        real_size = _decimal(attrs, b"GNU.sparse.size")
    else:
        raise ShardFormatError("records of an unknown sparse format")
    return sparse.runs(pairs, real_size, end - data_at), real_size, data_at


def _fast(win: Window, pos: int, size: int, add: Callable[[MemberColumns], None], chunk_size: int) -> int:
    """The plain headers from ``pos`` on, parsed by the compiled scanner in chunks read through
    ``win`` and given to ``add`` a batch at a time; returns where the first header it leaves to
    the plain scanner is (or the shard's end)."""
    stalled = False  # the chunk ends inside the next header or a small member's data
    asked = None  # where the last chunk read here was wanted from
    while pos + BLOCK <= size:
        end = win.start + len(win.buf)
        if stalled or pos < win.start or pos + BLOCK > end:
            if stalled and asked == pos:
                return pos  # a fresh chunk does not hold it either: the plain scanner reads it
            asked = at = end if end <= pos < end + chunk_size else pos
            try:
                win.start, win.buf = _read_chunk(win.src, at, min(chunk_size, size - at))
            except ShardIOError as exc:
                if exc.unavailable:
                    raise
                return pos  # a bad spot: the plain scanner reads around it in small pieces
        base = win.start
        stop, reason, *columns = _tarscan.scan(win.buf, pos - base, base, size, SMALL_DATA)
        batch = MemberColumns.of(*columns)
        if len(batch):
            add(batch)
        if reason == _PLAIN_WAY:
            return base + stop
        stalled, pos = base + stop == pos, base + stop
    return pos


def _read_chunk(src: ByteSource, at: int, length: int) -> tuple[int, bytes | memoryview]:
    """(where they start, the bytes) of a chunk holding ``length`` bytes from ``at``: a ``pread``
    through the page cache (the kernel reads ahead), or, on a thread whose last shard had tiny
    members (``_buffers.direct``), from a source that reads straight into memory (a local file:
    O_DIRECT, ``Shard.reads_into``), from the page boundary below ``at`` into this thread's
    buffer, reused. Measured at 400,000 members of ~1 KB, where the scan is CPU-bound: through the
    page cache into a fresh buffer each time, 0.4-0.6 s of kernel CPU (the copy, page-cache pages
    added and dropped, fresh pages faulted in); straight into one buffer, ~0.05 s. Where members
    are large, storage is the bound, and a capped one (200 IOPS) served the kernel's readahead
    faster than 4 MiB direct reads (110 KB members, index build over a sequential read: 1.7x
    direct, 1.0x through the page cache)."""
    if not (getattr(_buffers, "direct", False) and getattr(src, "reads_into", False)):
        return at, src.pread(at, length)
    start = at - at % PAGE
    length += at - start
    buf = _read_buffer(-(-length // PAGE) * PAGE)  # O_DIRECT reads whole pages
    src.read_at(buf, start, length)
    return start, buf[:length]


_buffers = threading.local()
DIRECT_BELOW = 32 << 10  # mean bytes a member (its header and data) under which a thread reads direct


def _read_buffer(size: int) -> memoryview:
    """This thread's read buffer (page-aligned: an anonymous mapping), made once and grown as
    needed: whatever the chunks scanned last keep of it stays theirs (a view keeps it alive).
    Private, not mmap's default MAP_SHARED: a process forked from this thread (pack's and the
    build's worker processes) would otherwise read its shards into the very pages its parent and
    its siblings read theirs into."""
    buf = getattr(_buffers, "buf", None)
    if buf is None or len(buf) < size:
        buf = _buffers.buf = memoryview(mmap.mmap(-1, max(size, CHUNK + PAGE),
                                                  flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS))
    return buf


class TarFormat(AsStored):
    name = "tar"
    suffixes = (".tar",)
    gives_columns = True  # scan(columns=True): see tarcolumns.py

    def __init__(self, compiled: bool = True, chunk: int = CHUNK):
        """``compiled=False``: the plain scanner alone (the reference the fast path is tested
        against); ``chunk``: how much the fast path reads at once."""
        self.compiled, self.chunk = compiled and _tarscan is not None, chunk

    def scan(self, src: ByteSource, columns: bool = False) -> ScanResult:
        """``columns``: where the compiled scanner reads every member, leave them as its columns
        (``ScanResult.columns``, ``members`` empty) rather than make a record of each."""
        result = ScanResult(members=[], warnings=[])
        skipped: list[list[int]] = []  # [offset, blocks] of each run of headers with a bad checksum
        batches: list[MemberColumns] = []  # the compiled scanner's, while no other member came

        def add_batch(batch: MemberColumns) -> None:
            if columns and not result.members:
                batches.append(batch)
            else:
                result.members.extend(batch.records())

        def add(record: MemberRecord) -> None:
            if batches:  # in archive order
                result.members.extend(MemberColumns.join(batches).records())
                batches.clear()
            result.members.append(record)

        try:
            self._scan(Window(src), src.size, add, add_batch, result, skipped)
        except ShardFormatError as exc:
            result.error = str(exc)
        if batches:
            result.columns = MemberColumns.join(batches)
        count = len(result.members) + (len(result.columns) if result.columns is not None else 0)
        _buffers.direct = count > 0 and src.size / count < DIRECT_BELOW  # for this thread's next shard
        if skipped:
            at, blocks = skipped[0]
            note = (f"{'not a tar archive' if at == 0 else 'damaged header'}: bad header checksum at offset {at}"
                    f" ({blocks} blocks skipped to the next header, as tar -x does"
                    + (f"; {len(skipped) - 1} more damaged places)" if len(skipped) > 1 else ")"))
            result.error = note + (f"; then {result.error}" if result.error else "")
        return result

    def _scan(self, win: Window, size: int, add: Callable[[MemberRecord], None],
              add_batch: Callable[[MemberColumns], None], result: ScanResult, skipped: list[list[int]]) -> None:
        pos = 0
        headers = _ExtendedHeaders()
        try:
            while pos + BLOCK <= size:
                if self.compiled and headers.plain():
                    pos = _fast(win, pos, size, add_batch, self.chunk)
                    if pos + BLOCK > size:
                        continue
                header = win.get(pos, BLOCK)
                if header.count(0) == BLOCK:
                    return  # end-of-archive marker
                if not _checksum_ok(header):
                    if pos == 0 and carries_magic(header):  # a tar compressed inside: tar -x reads it too
                        raise OtherFormat(header)
                    # GNU tar: "Skipping to next header"; what was read for this member is dropped.
                    after = _skip_damage(win, pos + BLOCK, size)
                    skipped.append([pos, (after - pos) // BLOCK])
                    headers.take()
                    pos = after
                    continue
                typeflag = header[156:157]
                data_size = _number(header[124:136])
                if data_size < 0:
                    raise ShardFormatError(f"negative size in header at offset {pos}")
                if typeflag in _EXTENDED:
                    if data_size > MAX_EXT_HEADER:
                        raise ShardFormatError(f"extended header of {data_size} bytes at offset {pos}")
                    if _end_of(pos, data_size) > size:
                        raise ShardFormatError(f"truncated inside the extended header at offset {pos}")
                    headers.read(typeflag, win.get(pos + BLOCK, data_size))
                    pos = _end_of(pos, data_size)
                    continue
                pos = _member(win, size, pos, header, headers.take(), headers, add, result)
        except ShardFormatError as exc:
            if "offset" in str(exc):
                raise
            raise ShardFormatError(f"{exc} (in the header at offset {pos})") from None
        if pos < size:
            raise ShardFormatError(f"truncated at offset {pos}: {size - pos} bytes, not a whole header")
        if size:  # an empty file: nothing to serve and nothing lost (tar -x calls it no archive)
            # Every member is whole, but a download cut at a member's start looks just like this.
            raise ShardFormatError(f"truncated at offset {pos}: no end-of-archive marker")


_EXTENDED = (b"x", b"g", b"L", b"K")  # PAX records (one member's, global), GNU long name and long link


def _end_of(pos: int, data_size: int) -> int:
    """Where the next header is, after the header at ``pos`` and its data in whole blocks."""
    return pos + BLOCK + (data_size + BLOCK - 1) // BLOCK * BLOCK


@dataclass
class _ForMember:
    """What extended headers said of the member whose header comes next."""

    pax: dict[bytes, bytes] = field(default_factory=dict)
    pax_0_0: list[bytes] = field(default_factory=list)  # a PAX 0.0 sparse map: offset and numbytes records in order
    long_name: bytes | None = None
    long_link: bytes | None = None
    continued: bool = False  # a volume's global header: the member is the rest of a file from another volume
    kinds: set[bytes] = field(default_factory=set)  # x, L, K read for it
    repeated: bool = False  # one of those twice (readers differ on which counts)
    # Whether its PAX records may mark it sparse: a substring test on the records' bytes, so that
    # the per-member dict walk is paid by sparse archives only.
    maybe_sparse: bool = False

    def is_empty(self) -> bool:
        return not (self.pax or self.pax_0_0 or self.kinds or self.continued or self.repeated) \
            and self.long_name is None and self.long_link is None


class _ExtendedHeaders:
    """The extended headers read so far: PAX global records (for every member after them) and what
    the others said of the coming member (taken by it, or dropped with a damaged header)."""

    def __init__(self):
        self.globals: dict[bytes, bytes] = {}
        self.maybe_sparse_globals = False
        self.plain_globals = True  # no global record changes how a plain header reads
        self.coming = _ForMember()

    def plain(self) -> bool:
        """Whether the next header reads as a plain one (the compiled scanner may take it)."""
        return self.plain_globals and self.coming.is_empty()

    def take(self) -> _ForMember:
        coming, self.coming = self.coming, _ForMember()
        return coming

    def read(self, typeflag: bytes, data: bytes) -> None:
        coming = self.coming
        if typeflag != b"g":
            coming.repeated |= typeflag in coming.kinds
            coming.kinds.add(typeflag)
        if typeflag == b"x":
            coming.pax = dict(_pax_items(data))
            coming.maybe_sparse = _SPARSE_PAX in data or _SPARSE_STAR in data
            if coming.maybe_sparse and b"GNU.sparse.offset=" in data:
                coming.pax_0_0 = [v for k, v in _pax_items(data) if k in _SPARSE_0_0]
        elif typeflag == b"g":
            records = dict(_pax_items(data))
            self.maybe_sparse_globals |= _SPARSE_PAX in data or _SPARSE_STAR in data
            # GNU tar's posix multi-volume: a volume's global header names the file whose rest
            # comes next; it describes that one member only.
            coming.continued = b"GNU.volume.offset" in records
            self.globals.update(item for item in records.items() if not item[0].startswith(b"GNU.volume."))
            self.plain_globals = not self.maybe_sparse_globals and not any(k in self.globals for k in _GLOBAL_PLAIN)
        elif typeflag == b"L":
            coming.long_name = data.split(b"\0", 1)[0]
        else:
            coming.long_link = data.split(b"\0", 1)[0]


def _member(win: Window, size: int, pos: int, header: bytes, ext: _ForMember, headers: _ExtendedHeaders,
            add: Callable[[MemberRecord], None], result: ScanResult) -> int:
    """The member whose header is at ``pos`` (with what extended headers said of it): added, or
    left out with a warning; where the next header is."""
    typeflag = header[156:157]
    data_size = _number(header[124:136])
    attrs = {**headers.globals, **ext.pax}
    if ext.long_name is not None:
        name = ext.long_name
    elif header[257:263] == b"ustar\x00" and header[345] != 0:
        name = _name_field(header[345:500]) + b"/" + _name_field(header[:100])
    else:
        name = _name_field(header[:100])
    name = attrs.get(b"path", name)
    link = attrs.get(b"linkpath", ext.long_link if ext.long_link is not None else _name_field(header[157:257]))
    if ext.repeated:  # GNU tar keeps the last, tarfile and others the first: no one right answer
        result.warnings.append(f"member {_shown(name)}: two extended headers of one kind (readers differ) not served")
        return _end_of(pos, data_size)
    try:
        if b"size" in attrs:
            if not attrs[b"size"].isdigit():
                raise ValueError
            data_size = int(attrs[b"size"])
        mtime = float(attrs[b"mtime"]) if b"mtime" in attrs else float(_number(header[136:148]))
    except ValueError:
        raise ShardFormatError(f"bad PAX size or mtime for member {name!r}") from None
    mode = _number(header[100:108]) & 0o7777

    # (a regular member whose name ends in "/" is an old-style directory)
    if typeflag == b"S" or (typeflag in _REGULAR and not name.endswith(b"/")):
        sparse_pax = (ext.maybe_sparse or headers.maybe_sparse_globals) and _is_sparse(attrs)
        return _file(win, size, pos, header, ext, attrs, name, data_size, mode, mtime, sparse_pax, add, result)
    if typeflag in _DIRS or typeflag in _REGULAR:
        add(MemberRecord(name, Kind.DIR, 0, 0, mode, mtime))
    elif typeflag == b"2":
        add(MemberRecord(name, Kind.SYMLINK, 0, len(link), mode, mtime, link))
    elif typeflag == b"1":
        add(MemberRecord(name, Kind.HARDLINK, 0, 0, mode, mtime, link))
    elif typeflag in _SKIPPED:
        result.warnings.append(f"member {_shown(name)}: {_SKIPPED[typeflag]}")
    elif typeflag not in _IGNORED:
        result.warnings.append(f"member {_shown(name)}: unknown tar type {typeflag!r} not served")
    return _end_of(pos, data_size)


def _file(win: Window, size: int, pos: int, header: bytes, ext: _ForMember, attrs: dict[bytes, bytes], name: bytes,
          data_size: int, mode: int, mtime: float, sparse_pax: bool, add: Callable[[MemberRecord], None],
          result: ScanResult) -> int:
    """A regular or sparse file's member; where the next header is."""
    if sparse_pax:
        name = attrs.get(b"GNU.sparse.name", name)
    data_at, next_pos = pos + BLOCK, _end_of(pos, data_size)
    old_map = None
    if header[156:157] == b"S":  # its map goes on in blocks before the data
        old_map, map_end = _old_gnu_map(win, header, data_at, size)
        next_pos, data_at = next_pos + map_end - data_at, map_end
    if ext.continued:
        result.warnings.append(f"member {_shown(name)}: {_SKIPPED[b'M']}")
    elif next_pos > size:  # tar -x writes part of it (its last block too: tar reads whole blocks)
        result.cut = name
        raise ShardFormatError(f"truncated at offset {pos}: member {_shown(name)} needs {next_pos} bytes, "
                               f"the shard has {size}")
    elif old_map is not None and sparse_pax:  # GNU tar reads one map, tarfile the other: no one right answer
        result.warnings.append(f"member {_shown(name)}: sparse file with both an old GNU map and PAX sparse "
                               "records (readers differ) not served")
    elif old_map is not None or sparse_pax:
        try:
            runs, real_size, data_at = _sparse_map(win, header, attrs, old_map, ext.pax_0_0, data_at, data_size)
        except ShardFormatError as why:
            result.warnings.append(f"member {_shown(name)}: sparse file with {why}: not served")
        else:
            small = sparse.read(runs, 0, real_size, lambda o, n: win.get(data_at + o, n)) \
                if real_size <= SMALL_DATA else None
            add(MemberRecord(name, Kind.FILE, data_at, real_size, mode, mtime, small=small, sparse=runs))
    else:
        # A tiny member's data sits in the window just read: keep it (labels, see labels.py).
        small = win.get(data_at, data_size) if data_size <= SMALL_DATA else None
        add(MemberRecord(name, Kind.FILE, data_at, data_size, mode, mtime, small=small))
    return next_pos


def _shown(name: bytes) -> str:
    return name.decode("utf-8", "backslashreplace")

FORMAT = TarFormat()
