"""Parquet files (``.parquet``): Hugging Face's ``image`` struct {bytes, path} and ``label``, or
any binary and integer column.

pyarrow reads the schema, the labels and the stored paths. Where each column chunk lies is decoded
here from the footer's Thrift (read_footer says why), and where each image lies from the image
column's pages, because pyarrow does not say: a page is a Thrift header and a body of
(optionally) definition levels and values, PLAIN (a 4-byte length, then the bytes) or indices into
a dictionary page of PLAIN values.

* An uncompressed page (what ``datasets.to_parquet`` writes for images, measured) holds the values
  as stored: a sample is a byte range of the file, its offset the file's.
* A compressed page (snappy, zstd, gzip, ...) is decoded whole when one of its samples is read,
  and kept in a bounded cache like lz4 shard blocks. The page is the unit: it is the smallest
  thing Parquet compresses (a row group is many pages: decoding it for one sample would decode
  them all), and a damaged page fails alone: EIO for its samples, with a log line.
  Such a sample's offset is a *virtual offset* (as BGZF's): a flag, the page header's file offset
  and the value's offset in the decoded page, so reading it needs no table but the page header.
"""

from __future__ import annotations

import struct
import threading
import zlib
from typing import NamedTuple

import numpy as np

from shardfs.formats import datafile
from shardfs.formats.arrowipc import names_in
from shardfs.formats.base import ByteSource, Fetch, ScanResult, ShardFormatError, Window
from shardfs.formats.lz4shard import BLOCK_CACHE
from shardfs.storage.base import ShardIOError

VIRTUAL = 1 << 62  # set in an offset that points into a decoded page
_WITHIN_BITS = 26  # a value's offset in its decoded page: pages up to 64 MiB
_PAGE_BITS = 36  # the page header's offset in the file: compressed pages in the first 64 GiB
MAX_HEADER = 1 << 20
MAX_FOOTER = 64 << 20  # pyarrow's own default bound on a footer's Thrift is 100 MB
MAX_NESTING = 16  # structs and lists within each other, as this decoder counts: a footer's deepest is 8
_DATA, _DICTIONARY, _DATA_V2 = 0, 2, 3
_PLAIN, _PLAIN_DICTIONARY, _RLE_DICTIONARY = 0, 2, 8
_CODECS = {"SNAPPY": "snappy", "GZIP": "gzip", "ZSTD": "zstd", "BROTLI": "brotli", "LZ4_RAW": "lz4_raw"}


def virtual(page_at: int, within: int) -> int:
    return VIRTUAL | page_at << _WITHIN_BITS | within


# --------------------------------------------------------------------------- Thrift compact protocol


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise ShardFormatError("Thrift data cut short")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 70:
            raise ShardFormatError("bad varint in Thrift data")


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _value(buf: bytes, pos: int, kind: int, depth: int):
    if depth > MAX_NESTING:  # lists in lists too: Python's own recursion limit is no answer to damage
        raise ShardFormatError("Thrift data nested too deep")
    if kind in (1, 2):
        return kind == 1, pos
    if kind == 3:
        return buf[pos], pos + 1
    if kind in (4, 5, 6):
        n, pos = _varint(buf, pos)
        return _zigzag(n), pos
    if kind == 7:
        return None, pos + 8
    if kind == 8:
        n, pos = _varint(buf, pos)
        return buf[pos : pos + n], pos + n
    if kind in (9, 10):
        head = buf[pos]
        pos += 1
        count, elem = head >> 4, head & 0x0F
        if count == 15:
            count, pos = _varint(buf, pos)
        if count > len(buf) - pos:  # every element takes a byte at least
            raise ShardFormatError("a Thrift list longer than its data")
        items = []
        for _ in range(count):
            if elem in (1, 2):  # a bool in a list is a byte of its own, not a field type
                item, pos = buf[pos] == 1, pos + 1
            else:
                item, pos = _value(buf, pos, elem, depth + 1)
            items.append(item)
        return items, pos
    if kind == 12:
        return _struct(buf, pos, depth + 1)
    raise ShardFormatError(f"unknown Thrift type {kind}")


def _struct(buf: bytes, pos: int, depth: int = 0) -> tuple[dict, int]:
    """A Thrift compact struct: field id -> value (nested structs as dicts)."""
    if depth > MAX_NESTING:
        raise ShardFormatError("Thrift data nested too deep")
    fields, last = {}, 0
    while True:
        if pos >= len(buf):
            raise ShardFormatError("Thrift data cut short")
        head = buf[pos]
        pos += 1
        if head == 0:
            return fields, pos
        kind, delta = head & 0x0F, head >> 4
        if delta:
            last += delta
        else:
            n, pos = _varint(buf, pos)
            last = _zigzag(n)
        if kind == 1 or kind == 2:
            fields[last] = kind == 1
        else:
            fields[last], pos = _value(buf, pos, kind, depth)


def read_header(fetch: Fetch, at: int, limit: int) -> tuple[dict, int]:
    """The page header at ``at`` and where its body starts."""
    want = 256
    while True:
        buf = fetch(at, min(want, limit - at))
        try:
            header, used = _struct(buf, 0)
            return header, at + used
        except (ShardFormatError, IndexError):
            if want >= MAX_HEADER or at + want >= limit:
                raise ShardFormatError(f"bad page header at offset {at}") from None
            want *= 8


def _size(header: dict, field: int) -> int:
    """A page header's size field, -1 (refused by the callers) unless it is a whole number: a
    damaged header may hold any Thrift type there (found by fuzzing: None compared with an int)."""
    value = header.get(field, -1)
    return value if type(value) is int else -1


# --------------------------------------------------------------------------- page bodies


def _hybrid(buf: bytes, pos: int, end: int, width: int, count: int) -> np.ndarray:
    """Parquet's RLE / bit-packed hybrid encoding: ``count`` values of ``width`` bits."""
    if width == 0:
        return np.zeros(count, np.int64)
    parts, have = [], 0
    weights = 1 << np.arange(width, dtype=np.int64)
    while have < count:
        if pos >= end:
            raise ShardFormatError("levels or indices cut short")
        head, pos = _varint(buf, pos)
        if head & 1:
            nbytes = (head >> 1) * width
            bits = np.unpackbits(np.frombuffer(buf, np.uint8, nbytes, pos), bitorder="little")
            values = bits.reshape(-1, width).astype(np.int64) @ weights
            pos += nbytes
        else:
            size = (width + 7) // 8
            values = np.full(head >> 1, int.from_bytes(buf[pos : pos + size], "little"), np.int64)
            pos += size
        parts.append(values)
        have += len(values)
    return np.concatenate(parts)[:count]


def _plain(body: bytes, pos: int, end: int, count: int) -> list[tuple[int, int]]:
    """(offset, size) of ``count`` PLAIN byte-array values from ``pos``."""
    out = []
    for _ in range(count):
        if pos + 4 > end:
            raise ShardFormatError("values cut short")
        (n,) = struct.unpack_from("<I", body, pos)
        if pos + 4 + n > end:
            raise ShardFormatError("a value beyond its page")
        out.append((pos + 4, n))
        pos += 4 + n
    return out


def decode_body(header: dict, raw: bytes, codec: str | None, where: str) -> bytes:
    """The page's body as an uncompressed page would hold it (levels, then values)."""
    import pyarrow as pa

    if 4 in header and zlib.crc32(raw) != header[4] & 0xFFFFFFFF:
        raise ShardFormatError(f"{where}: checksum mismatch")
    usize = header[2]
    levels = 0
    v2 = header.get(8)
    if v2 is not None:
        levels = v2.get(5, 0) + v2.get(6, 0)
        if not v2.get(7, True):
            codec = None
    if codec is None:
        return raw
    try:
        values = pa.decompress(raw[levels:], usize - levels, codec=codec, asbytes=True)
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise ShardFormatError(f"{where}: cannot decode ({codec}): {exc}") from None
    if len(values) != usize - levels:
        raise ShardFormatError(f"{where}: decoded to {len(values)} bytes, expected {usize - levels}")
    return bytes(raw[:levels]) + values


def _values(header: dict, body: bytes, max_def: int, where: str, dictionary: list | None):
    """Each value of a data page, None for a null: (offset, size) in ``body``, or for indices into
    the dictionary its entry as given; a dictionary page: its entries, (offset, size) in ``body``."""
    kind = header.get(1)
    if kind == _DICTIONARY:
        return _plain(body, 0, len(body), header[7][1])
    v2 = header.get(8)
    info = v2 if kind == _DATA_V2 else header.get(5)
    if kind not in (_DATA, _DATA_V2) or info is None:
        return []  # an index page: no values
    count, encoding = info[1], info[2] if kind == _DATA else info[4]
    pos, width = 0, max_def.bit_length()
    defined = np.ones(count, bool)
    if max_def:
        if kind == _DATA:
            (length,) = struct.unpack_from("<I", body, 0)
            levels = _hybrid(body, 4, 4 + length, width, count)
            pos = 4 + length
        else:
            levels = _hybrid(body, v2.get(6, 0), v2.get(6, 0) + v2.get(5, 0), width, count)
            pos = v2.get(5, 0) + v2.get(6, 0)
        defined = levels == max_def
    elif kind == _DATA_V2:
        pos = v2.get(6, 0)
    present = int(defined.sum())
    if encoding == _PLAIN:
        found = _plain(body, pos, len(body), present)
    elif encoding in (_PLAIN_DICTIONARY, _RLE_DICTIONARY):
        if dictionary is None:
            raise ShardFormatError(f"{where}: dictionary-encoded without a dictionary page")
        indices = _hybrid(body, pos + 1, len(body), body[pos], present)
        if present and (indices.min() < 0 or indices.max() >= len(dictionary)):
            raise ShardFormatError(f"{where}: a dictionary index out of range")
        found = [dictionary[i] for i in indices.tolist()]
    else:
        raise ShardFormatError(f"{where}: values in encoding {encoding} are not read here")
    it = iter(found)
    return [next(it) if d else None for d in defined.tolist()]


# --------------------------------------------------------------------------- the format


class Chunk(NamedTuple):
    start: int  # its first page: the dictionary page's, or the first data page's
    end: int
    codec: str  # pyarrow's name for it: UNCOMPRESSED, SNAPPY, ...
    path: str  # the column it holds, dotted as pyarrow's ColumnDescriptor.path


_CODEC_NAMES = ("UNCOMPRESSED", "SNAPPY", "GZIP", "LZO", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW")


def read_footer(pread: Fetch, size: int) -> dict:
    """The file's FileMetaData, decoded here. The column chunks come from this, not from pyarrow's
    metadata objects: pyarrow checks a chunk's size statistics while it makes the object and throws
    a C++ exception through a binding that cannot pass it on, which aborts the process (found by
    fuzzing: pyarrow 26, a definition-level histogram of the wrong length)."""
    tail = pread(size - 8, 8) if size >= 12 else b""
    if len(tail) != 8 or tail[4:] != b"PAR1":
        raise ShardFormatError("no Parquet footer at its end")
    (length,) = struct.unpack_from("<I", tail)
    if length > size - 12 or length > MAX_FOOTER:
        raise ShardFormatError(f"its footer length ({length} bytes) does not fit the file")
    buf = pread(size - 8 - length, length)
    try:
        return _struct(buf, 0)[0]
    except IndexError:
        raise ShardFormatError("its footer is cut short") from None


def row_groups(footer: dict, columns: int | None = None) -> list[tuple[int, list[Chunk]]]:
    """(rows, the chunk of each column) of every row group; ``columns``: the schema's leaf count,
    which every row group must have."""
    groups = footer.get(4)
    if not isinstance(groups, list):
        raise ShardFormatError("its footer has no list of row groups")
    out = []
    for g, group in enumerate(groups):
        chunks = group.get(1) if isinstance(group, dict) else None
        rows = group.get(3) if isinstance(group, dict) else None
        if not isinstance(chunks, list) or type(rows) is not int or rows < 0:
            raise ShardFormatError(f"row group {g}: no column chunks or no row count in the footer")
        if columns is not None and len(chunks) != columns:
            raise ShardFormatError(f"row group {g}: {len(chunks)} column chunks for {columns} columns")
        out.append((rows, [_chunk_of(c, f"row group {g}, column {j}") for j, c in enumerate(chunks)]))
    return out


def _plausible(groups: list, size: int, file_rows: int) -> list:
    """Row groups whose rows fit the file: at least a byte a row (the file's own count too). pyarrow
    allocates for the rows the footer claims before it reads a page (a damaged count of 10**12 made
    it touch 24 GB: found by fuzzing), and an image dataset's rows are kilobytes each."""
    rows = max(sum(g[0] for g in groups), file_rows)
    if rows > size:
        raise ShardFormatError(f"its footer claims {rows} rows in {size} bytes")
    return groups


def _chunk_of(chunk, where: str) -> Chunk:
    meta = chunk.get(3) if isinstance(chunk, dict) else None
    if not isinstance(meta, dict):
        raise ShardFormatError(f"{where}: no column metadata (encrypted columns are not read here)")
    if chunk.get(1) is not None:
        raise ShardFormatError(f"{where}: its pages are in another file")
    codec, size, data_at, dictionary_at, path = meta.get(4), meta.get(7), meta.get(9), meta.get(11), meta.get(3)
    if not all(type(v) is int and v >= 0 for v in (codec, size, data_at)) or not isinstance(path, list) \
            or not all(isinstance(p, bytes) for p in path):
        raise ShardFormatError(f"{where}: a bad codec, size, offset or path in the footer")
    start = data_at
    if type(dictionary_at) is int and 0 < dictionary_at < data_at:  # as Arrow's reader takes it
        start = dictionary_at
    name = _CODEC_NAMES[codec] if codec < len(_CODEC_NAMES) else f"codec {codec}"
    return Chunk(start, start + size, name, ".".join(p.decode("utf-8", "replace") for p in path))


def _codec(name: str) -> str | None:
    if name == "UNCOMPRESSED":
        return None
    if name not in _CODECS:
        raise ShardFormatError(f"pages compressed with {name} are not read here")
    return _CODECS[name]


def _metadata(src: ByteSource):
    pq = datafile.need("pyarrow.parquet", getattr(src, "path", ""))
    import pyarrow as pa

    try:
        return pq.ParquetFile(datafile.FileObject(src))
    except (pa.ArrowException, OSError, ValueError) as exc:
        if isinstance(exc, ShardIOError):
            raise
        raise ShardFormatError(f"cannot read its footer: {exc}") from None


class ParquetLayout:
    """Reads offsets as the file's own, or (VIRTUAL) in a page decoded once into a bounded cache.
    The footer (which column chunk a page is in, and its codec) is read at the first such read."""

    def __init__(self, src: ByteSource):
        self._src = src
        self._chunks: tuple | None = None
        self._lock = threading.Lock()
        self._cache = BLOCK_CACHE  # one bound for lz4 blocks and Parquet pages
        self._id = self._cache.owner()

    def _chunk_table(self) -> tuple:
        with self._lock:
            if self._chunks is None:
                footer = read_footer(self._src.pread, self._src.size)
                chunks = sorted(c for _rows, group in row_groups(footer) for c in group)
                self._chunks = (np.array([c.start for c in chunks], np.int64),
                                np.array([c.end for c in chunks], np.int64), [c.codec for c in chunks])
            return self._chunks

    def read(self, offset: int, length: int, fetch: Fetch) -> bytes:
        if not offset & VIRTUAL:
            return fetch(offset, length)
        page_at = (offset & ~VIRTUAL) >> _WITHIN_BITS
        within = offset & ((1 << _WITHIN_BITS) - 1)
        key = (self._id, page_at)
        body = self._cache.get(key)
        if body is None:
            body = self._page(page_at, fetch)
            self._cache.put(key, body)
        if within + length > len(body):
            raise ShardFormatError(f"page at {page_at}: a value beyond its decoded page")
        return body[within : within + length]

    def _page(self, page_at: int, fetch: Fetch) -> bytes:
        where = f"page at {page_at}"
        starts, ends, codecs = self._chunk_table()
        i = int(np.searchsorted(starts, page_at, side="right")) - 1
        if i < 0 or page_at >= ends[i]:
            raise ShardFormatError(f"{where}: in no column chunk")
        header, body_at = read_header(fetch, page_at, int(ends[i]))
        stored = _size(header, 3)
        if stored < 0 or body_at + stored > ends[i]:
            raise ShardFormatError(f"{where}: its body lies beyond its column chunk")
        raw = fetch(body_at, stored)
        if len(raw) != stored:
            raise ShardFormatError(f"{where}: short read ({len(raw)} of {stored} bytes)")
        with datafile.checked(where):
            return decode_body(header, raw, _codec(codecs[i]), where)


class ParquetFormat:
    name = "parquet"
    suffixes = (".parquet",)
    # Samples in compressed pages are decoded in Python (the shard cache, disk tier and prefetch
    # serve the pages' bytes); see as_stored for files without any.
    members_as_stored = False

    def as_stored(self, offsets: np.ndarray) -> bool:
        """A file whose images all lie in uncompressed pages is served like a tar (by the compiled loop)."""
        return not np.any(offsets & VIRTUAL)

    def open_layout(self, src: ByteSource, size: int) -> ParquetLayout:
        if src.size != size:
            raise ShardFormatError(f"file is {src.size} bytes, expected {size} (shard changed?)")
        return ParquetLayout(src)

    def scan(self, src: ByteSource, columns: datafile.Columns = datafile.Columns()) -> ScanResult:
        path = getattr(src, "path", "")
        pf = _metadata(src)
        import pyarrow as pa

        image, label, stored = _columns(pf, path, columns)
        leaf = next(j for j in range(pf.metadata.num_columns) if pf.schema.column(j).path == image)
        max_def = pf.schema.column(leaf).max_definition_level
        if pf.schema.column(leaf).max_repetition_level:
            raise ShardFormatError(f"column {image} is repeated: one image per row is read here")
        groups = _plausible(row_groups(read_footer(src.pread, src.size), pf.metadata.num_columns), src.size,
                            pf.metadata.num_rows)
        try:
            labels = pf.read(columns=[label]).column(0).to_numpy(zero_copy_only=False)
            names = pf.read(columns=[stored]).column(0).to_pylist() if stored else None
        except (pa.ArrowException, OSError, ValueError) as exc:
            if isinstance(exc, ShardIOError):
                raise
            raise ShardFormatError(f"cannot read its labels: {exc}") from None
        if names is not None and names and isinstance(names[0], dict):  # the struct, with its one child
            names = [n and next(iter(n.values())) for n in names]
        win = Window(src, datafile.SCAN_WINDOW)
        rows: list[datafile.Row] = []
        warnings: list[str] = []
        error, number, left_out = None, 0, 0
        md = pf.metadata
        for g, (group_rows, chunks) in enumerate(groups):
            try:
                if chunks[leaf].path != image:
                    raise ShardFormatError(f"its column chunk {leaf} holds {chunks[leaf].path!r}, not {image!r}")
                values = self._chunk(win, chunks[leaf], max_def, src.size, group_rows, warnings)
            except ShardFormatError as exc:
                error = f"row group {g}: {exc}"
                break
            if len(values) != group_rows or number + len(values) > len(labels):
                error = f"row group {g}: {len(values)} values for {group_rows} rows"
                break
            for value in values:
                label_value = labels[number]
                if value is None or label_value is None or label_value != label_value:  # NaN: a null label
                    left_out += 1
                    number += 1
                    continue
                at, size, head = value
                rows.append(datafile.Row(at, size, int(label_value), number,
                                         stored_name=names[number] if names else None, head=head))
                number += 1
        if left_out:
            warnings.append(f"{left_out} rows without an image or a label (or in a damaged page) left out")
        split = datafile.split_of(path)
        for row in rows:
            row.split = split
        classes = _class_names(pf, label)
        mtime = getattr(src, "mtime_ns", 0) / 1e9
        return datafile.result(rows, md.num_rows, mtime, classes, warnings, error)

    def _chunk(self, win: Window, chunk: Chunk, max_def: int, size: int, rows: int, warnings: list[str]):
        """(offset, size, head) of each row's image in one column chunk, or None (null or a damaged page).
        ``rows``: its row group's; no page may hold more values than are left of them (a few bytes of
        run-length levels can say billions: found by reading)."""
        codec = _codec(chunk.codec)
        pos, end = chunk.start, chunk.end
        if end > size:
            raise ShardFormatError(f"its column chunk ends at {end}, beyond the file ({size} bytes): truncated")
        out: list = []
        dictionary = None
        while pos < end:
            header, body_at = read_header(win.get, pos, end)
            stored, usize = _size(header, 3), _size(header, 2)
            if stored < 0 or body_at + stored > end or usize < 0:
                raise ShardFormatError(f"page at {pos}: its sizes do not fit its column chunk")
            where = f"page at {pos}"
            kind = header.get(1)
            info = header.get(5) or header.get(8)
            count = info.get(1, 0) if isinstance(info, dict) and kind in (_DATA, _DATA_V2) else 0
            if type(count) is not int or not 0 <= count <= rows:
                raise ShardFormatError(f"{where}: {count} values, more than the {rows} rows left in its row group")
            rows -= count
            try:
                with datafile.checked(where):
                    compressed = codec is not None and not (kind == _DATA_V2 and not header[8].get(7, True))
                    if compressed and (usize >= 1 << _WITHIN_BITS or pos >= 1 << _PAGE_BITS):
                        raise ShardFormatError(f"{where}: a compressed page past 64 GiB or of over 64 MiB")
                    raw = win.get(body_at, stored)
                    body = decode_body(header, raw, codec, where) if compressed else raw
                    found = _values(header, body, max_def, where, dictionary)
            except ShardFormatError as exc:
                if kind == _DICTIONARY:
                    raise
                warnings.append(f"{exc}: its {count} rows left out")
                out.extend([None] * count)
                pos = body_at + stored
                continue
            base = virtual(pos, 0) if compressed else body_at
            if kind == _DICTIONARY:
                dictionary = [(base + o, n, body[o : o + datafile.HEAD]) for o, n in found]
            elif kind in (_DATA, _DATA_V2):
                out.extend(v if v is None or len(v) == 3 else (base + v[0], v[1], body[v[0] : v[0] + datafile.HEAD])
                           for v in found)
            pos = body_at + stored
        return out


def _columns(pf, path: str, columns: datafile.Columns) -> tuple[str, str, str | None]:
    """(image leaf, label column, stored path leaf or None) by the Arrow schema."""
    import pyarrow as pa

    schema = pf.schema_arrow
    binary, integer, structs = [], [], {}
    for field in schema:
        t = field.type
        if pa.types.is_binary(t) or pa.types.is_large_binary(t):
            binary.append(field.name)
        elif pa.types.is_integer(t):
            integer.append(field.name)
        elif pa.types.is_struct(t) and t.get_field_index("bytes") >= 0 and pa.types.is_binary(t.field("bytes").type):
            structs[field.name] = t.get_field_index("path") >= 0
    image, label = datafile.choose(path, columns, binary + list(structs), integer, list(schema.names))
    if image in structs:
        return f"{image}.bytes", label, f"{image}.path" if structs[image] else None
    return image, label, None


def _class_names(pf, label: str) -> list[str] | None:
    import json

    meta = pf.schema_arrow.metadata or {}
    try:
        info = json.loads(meta[b"huggingface"]).get("info", {}) if b"huggingface" in meta else None
    except ValueError:
        info = None
    return names_in([info], label) if info else None


FORMAT = ParquetFormat()
