"""Arrow IPC files (``.arrow``): the file format (the JSC course's one record batch per sample)
and the stream format (``datasets``' ``save_to_disk``), read as a sequence of messages.

Each record batch's metadata says where its buffers lie in its body; without compression a
binary column's values are those bytes as stored, so a sample's image is a byte range of the file
(served like a tar member). The scan walks the messages through forward windows and reads only
metadata, value offsets and labels: never an image's bytes except its first few (its type).
pyarrow parses the schema; the record-batch metadata (a flatbuffer of a few fields) is read here,
because pyarrow does not say where a buffer lies in the file.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np

from shardfs.formats import datafile
from shardfs.formats.base import AsStored, ByteSource, ScanResult, ShardFormatError, Window
from shardfs.storage.base import ShardIOError

FILE_MAGIC = b"ARROW1"
CONTINUATION = 0xFFFFFFFF
MAX_METADATA = 64 << 20  # a message's flatbuffer larger than this is hostile
_SCHEMA, _DICTIONARY, _RECORD_BATCH = 1, 2, 3


class _Table:
    """One flatbuffer table: fields by id (enough of flatbuffers for Arrow's Message)."""

    def __init__(self, buf: bytes, pos: int):
        self.buf, self.pos = buf, pos
        self.vtable = pos - struct.unpack_from("<i", buf, pos)[0]
        self.vsize = struct.unpack_from("<H", buf, self.vtable)[0]

    def _field(self, i: int) -> int:
        at = 4 + 2 * i
        off = struct.unpack_from("<H", self.buf, self.vtable + at)[0] if at < self.vsize else 0
        return self.pos + off if off else 0

    def scalar(self, i: int, fmt: str, default=0):
        at = self._field(i)
        return struct.unpack_from(fmt, self.buf, at)[0] if at else default

    def table(self, i: int) -> "_Table | None":
        at = self._field(i)
        return _Table(self.buf, at + struct.unpack_from("<I", self.buf, at)[0]) if at else None

    def structs(self, i: int, dtype: np.dtype) -> np.ndarray:
        at = self._field(i)
        if not at:
            return np.empty(0, dtype)
        vec = at + struct.unpack_from("<I", self.buf, at)[0]
        count = struct.unpack_from("<I", self.buf, vec)[0]
        return np.frombuffer(self.buf, dtype, count, vec + 4)


_PAIR = np.dtype([("a", "<i8"), ("b", "<i8")])  # FieldNode (length, null_count), Buffer (offset, length)


def _buffer_count(t) -> int:
    """Buffers a field of type ``t`` has in a record batch, its children's included (pre-order)."""
    import pyarrow as pa

    if pa.types.is_struct(t):
        return 1 + sum(_buffer_count(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        return 2 + _buffer_count(t.value_type if not pa.types.is_map(t) else pa.struct([t.key_field, t.item_field]))
    if pa.types.is_fixed_size_list(t):
        return 1 + _buffer_count(t.value_type)
    if pa.types.is_null(t):
        return 0
    if pa.types.is_dictionary(t):  # validity and indices; the values come in dictionary batches
        return 2
    if (pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t)
            or pa.types.is_large_string(t)):
        return 3
    if pa.types.is_primitive(t) or pa.types.is_fixed_size_binary(t) or pa.types.is_decimal(t):
        return 2
    raise ShardFormatError(f"column type {t} is not read here")


def _node_count(t) -> int:
    import pyarrow as pa

    if pa.types.is_struct(t):
        return 1 + sum(_node_count(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return 1 + _node_count(t.value_type)
    if pa.types.is_map(t):
        return 1 + _node_count(pa.struct([t.key_field, t.item_field]))
    return 1


def _leaves(schema) -> dict[str, tuple]:
    """Every column and struct child: dotted name -> (type, first node index, first buffer index);
    up to the first column of a type not read here (where the next ones' buffers are is unknown)."""
    out: dict[str, tuple] = {}
    node = buf = 0

    def walk(name: str, t) -> None:
        nonlocal node, buf
        import pyarrow as pa

        out[name] = (t, node, buf)
        if pa.types.is_struct(t):
            node, buf = node + 1, buf + 1
            for i in range(t.num_fields):
                walk(f"{name}.{t.field(i).name}", t.field(i).type)
        else:
            node, buf = node + _node_count(t), buf + _buffer_count(t)

    for field in schema:
        try:
            walk(field.name, field.type)
        except ShardFormatError:
            out.pop(field.name, None)
            break
    return out


class _Columns:
    """Where a batch's image, label and stored path are, as node and buffer indices."""

    def __init__(self, path: str, schema, columns: datafile.Columns):
        import pyarrow as pa

        leaves = _leaves(schema)
        binary = [n for n, (t, _, _) in leaves.items() if pa.types.is_binary(t) or pa.types.is_large_binary(t)]
        integer = [n for n, (t, _, _) in leaves.items() if "." not in n and pa.types.is_integer(t)]
        # Hugging Face's Image feature: a struct {bytes, path}, named by its struct.
        structs = {n: f"{n}.bytes" for n in leaves if f"{n}.bytes" in binary}
        image, label = datafile.choose(path, columns, binary + list(structs), integer, list(schema.names))
        self.image = leaves[structs.get(image, image)]
        self.label = leaves[label]
        self.path = leaves.get(f"{image}.path") if image in structs else None
        self.classes = _class_names(schema, label, path)


def _class_names(schema, label: str, path: str) -> list[str] | None:
    """Hugging Face ClassLabel names: in the schema metadata, else in save_to_disk's dataset_info.json."""
    infos = []
    meta = schema.metadata or {}
    if b"huggingface" in meta:
        try:
            infos.append(json.loads(meta[b"huggingface"]).get("info", {}))
        except ValueError:
            pass
    beside = os.path.join(os.path.dirname(path), "dataset_info.json")
    if "://" not in path and os.path.isfile(beside):
        try:
            with open(beside, encoding="utf-8") as f:
                infos.append(json.load(f))
        except (OSError, ValueError):
            pass
    return names_in(infos, label)


def names_in(infos: list, label: str) -> list[str] | None:
    for info in infos:
        feature = (info.get("features") or {}).get(label) if isinstance(info, dict) else None
        names = feature.get("names") if isinstance(feature, dict) else None
        if isinstance(names, list) and all(isinstance(n, str) for n in names):
            return names
    return None


class ArrowIpcFormat(AsStored):
    name = "arrow"
    suffixes = (".arrow",)

    def scan(self, src: ByteSource, columns: datafile.Columns = datafile.Columns()) -> ScanResult:
        path = getattr(src, "path", "")
        pa = datafile.need("pyarrow", path)
        win = Window(src, datafile.SCAN_WINDOW)
        rows: list[datafile.Row] = []
        state = {"rows": rows, "number": 0, "cols": None, "warnings": [], "nulls": 0}
        error = None
        try:
            self._scan(pa, win, src.size, path, columns, state)
        except ShardFormatError as exc:
            error = str(exc)
        except ShardIOError:
            raise
        if state["cols"] is None:
            raise ShardFormatError(error or "no schema")  # not one member: nothing to serve
        if state["nulls"]:
            state["warnings"].append(f"{state['nulls']} rows without an image left out")
        split = datafile.split_of(path)
        for row in rows:
            row.split = split
        mtime = getattr(src, "mtime_ns", 0) / 1e9
        return datafile.result(rows, state["number"], mtime, state["cols"].classes, state["warnings"], error)

    def _scan(self, pa, win: Window, size: int, path: str, columns, state) -> None:
        pos = 8 if win.get(0, 6) == FILE_MAGIC else 0
        while True:
            if pos + 8 > size:
                raise ShardFormatError(f"truncated at offset {pos} (no end-of-stream marker)")
            head = win.get(pos, 8)
            marker, length = struct.unpack("<Ii", head)
            meta_at = pos + 8
            if marker != CONTINUATION:  # the format before Arrow 0.15: no continuation marker
                length, meta_at = marker, pos + 4
            if length == 0:
                return  # end of stream
            if not 0 < length <= MAX_METADATA or meta_at + length > size:
                raise ShardFormatError(f"bad or truncated message at offset {pos}")
            meta = win.get(meta_at, length)
            with datafile.checked(f"message at offset {pos}"):
                message = _Table(meta, struct.unpack_from("<I", meta, 0)[0])
                kind = message.scalar(1, "<B")
                body_length = message.scalar(3, "<q")
            body = meta_at + length
            if body_length < 0 or body + body_length > size:
                raise ShardFormatError(f"truncated: the message at offset {pos} needs {body + body_length} bytes,"
                                       f" the file has {size}")
            if kind == _SCHEMA:
                if state["cols"] is not None:
                    raise ShardFormatError(f"a second schema at offset {pos}")
                raw = win.get(pos, body - pos)
                try:
                    schema = pa.ipc.read_schema(pa.py_buffer(raw))
                except (pa.ArrowException, ValueError, OSError) as exc:  # pyarrow's errors are OSErrors too
                    raise ShardFormatError(f"cannot read its schema: {exc}") from None
                with datafile.checked(f"schema at offset {pos}"):  # names that are not UTF-8, ...
                    state["cols"] = _Columns(path, schema, columns)
            elif kind == _RECORD_BATCH:
                if state["cols"] is None:
                    raise ShardFormatError(f"a record batch before the schema at offset {pos}")
                with datafile.checked(f"record batch at offset {pos}"):
                    self._batch(win, message.table(2), body, body_length, pos, state)
            pos = body + body_length

    def _batch(self, win: Window, batch: _Table | None, body: int, body_length: int, pos: int, state) -> None:
        if batch is None:
            raise ShardFormatError(f"record batch without its header at offset {pos}")
        if batch.table(3) is not None:
            raise ShardFormatError(f"compressed record batch at offset {pos}: its images are not served")
        n = batch.scalar(0, "<q")
        if n < 0 or 4 * n > body_length:  # the image column's offsets alone take 4 bytes a row
            raise ShardFormatError(f"record batch at offset {pos}: {n} rows cannot fit its body")
        nodes, buffers = batch.structs(1, _PAIR), batch.structs(2, _PAIR)
        cols = state["cols"]

        def buffer(i: int) -> tuple[int, int]:
            if i >= len(buffers):
                raise ShardFormatError(f"record batch at offset {pos}: fewer buffers than its schema has")
            off, length = int(buffers[i]["a"]), int(buffers[i]["b"])
            if off < 0 or length < 0 or off + length > body_length:
                raise ShardFormatError(f"record batch at offset {pos}: a buffer beyond its body")
            return body + off, length

        def read(i: int, dtype, count: int) -> np.ndarray:
            at, length = buffer(i)
            dtype = np.dtype(dtype)
            if count * dtype.itemsize > length:
                raise ShardFormatError(f"record batch at offset {pos}: a buffer shorter than its values")
            return np.frombuffer(win.get(at, count * dtype.itemsize), dtype)

        def valid(node: int, buf: int) -> np.ndarray:
            if node >= len(nodes):
                raise ShardFormatError(f"record batch at offset {pos}: fewer nodes than its schema has")
            if int(nodes[node]["b"]) == 0:
                return np.ones(n, bool)
            bits = read(buf, np.uint8, (n + 7) // 8)
            return np.unpackbits(bits, bitorder="little")[:n].astype(bool)

        itype, inode, ibuf = cols.image
        offsets_dtype = "<i8" if "large" in str(itype) else "<i4"
        ok = valid(inode, ibuf)
        if cols.path is not None:  # the struct itself may be null too
            ok &= valid(inode - 1, ibuf - 1)
        offsets = read(ibuf + 1, offsets_dtype, n + 1).astype(np.int64)
        data_at, data_len = buffer(ibuf + 2)
        if n and (offsets[0] < 0 or np.any(np.diff(offsets) < 0) or offsets[-1] > data_len):
            raise ShardFormatError(f"record batch at offset {pos}: value offsets out of range")
        ltype, lnode, lbuf = cols.label
        labels = read(lbuf + 1, ltype.to_pandas_dtype(), n).astype(np.int64)
        ok &= valid(lnode, lbuf)
        names = None
        if cols.path is not None:
            _, pnode, pbuf = cols.path
            pok = valid(pnode, pbuf)
            poff = read(pbuf + 1, "<i4", n + 1).astype(np.int64)
            pat, plen = buffer(pbuf + 2)
            if n and (poff[0] < 0 or np.any(np.diff(poff) < 0) or poff[-1] > plen):
                raise ShardFormatError(f"record batch at offset {pos}: path offsets out of range")
            text = win.get(pat, int(poff[-1])) if n else b""
            names = [text[poff[k] : poff[k + 1]].decode("utf-8", "replace") if pok[k] else None for k in range(n)]
        for k in range(n):
            if not ok[k]:
                state["nulls"] += 1
            else:
                at, length = data_at + int(offsets[k]), int(offsets[k + 1] - offsets[k])
                stored = names[k] if names is not None else None
                head = b"" if stored and os.path.splitext(stored)[1] else win.get(at, min(length, datafile.HEAD))
                state["rows"].append(datafile.Row(at, length, int(labels[k]), state["number"], stored_name=stored,
                                                  head=head))
            state["number"] += 1


FORMAT = ArrowIpcFormat()
