"""The Parquet footer and page headers as formats/parquet.py decodes them (Thrift compact protocol):
the column chunks it takes from real writers' files agree with pyarrow's own metadata, and damaged
Thrift is a ShardFormatError, never a recursion, a huge list or an aborted process."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from shardfs.formats import ShardFormatError
from shardfs.formats.base import Window
from shardfs.formats.parquet import FORMAT, Chunk, _struct, read_footer, read_header, row_groups

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

CORPUS = os.path.join(os.path.dirname(__file__), "fuzz", "corpus", "parquet_file")


def _images(n: int) -> list[bytes]:
    return [bytes([i % 251]) * (300 + 37 * i) for i in range(n)]


def _written(**options) -> bytes:
    images = _images(60)
    table = pa.table({"image": pa.array(images, pa.binary()), "label": pa.array(range(60), pa.int64()),
                      "meta": pa.array([{"bytes": b"x", "path": f"{i}.jpg"} for i in range(60)])})
    buf = io.BytesIO()
    pq.write_table(table, buf, **options)
    return buf.getvalue()


WRITERS = {
    "plain": dict(compression="none", use_dictionary=False),
    "snappy, row groups, small pages": dict(compression="snappy", row_group_size=17, data_page_size=2048),
    "zstd, dictionary, v2 pages": dict(compression="zstd", use_dictionary=True, data_page_version="2.0"),
    "gzip, page index, checksums": dict(compression="gzip", write_page_index=True, write_page_checksum=True),
    "no statistics, no stored schema": dict(write_statistics=False, store_schema=False),
}


@pytest.mark.parametrize("writer", list(WRITERS))
def test_the_column_chunks_decoded_here_are_pyarrows(writer):
    data = _written(**WRITERS[writer])
    md = pq.ParquetFile(io.BytesIO(data)).metadata
    groups = row_groups(read_footer(lambda at, n: data[at:at + n], len(data)), md.num_columns)
    assert len(groups) == md.num_row_groups > 0
    for g, (rows, chunks) in enumerate(groups):
        assert rows == md.row_group(g).num_rows
        for j, chunk in enumerate(chunks):
            theirs = md.row_group(g).column(j)
            start = theirs.data_page_offset
            if theirs.has_dictionary_page and 0 < theirs.dictionary_page_offset < start:
                start = theirs.dictionary_page_offset
            assert (chunk.start, chunk.end, chunk.codec, chunk.path) == \
                (start, start + theirs.total_compressed_size, theirs.compression, theirs.path_in_schema)


def test_a_file_without_a_footer_or_with_one_too_long_is_refused():
    data = _written()
    fetch = lambda at, n: data[at:at + n]  # noqa: E731
    with pytest.raises(ShardFormatError, match="no Parquet footer"):
        read_footer(fetch, len(data) - 1)
    longer = data[:-8] + (len(data)).to_bytes(4, "little") + b"PAR1"
    with pytest.raises(ShardFormatError, match="does not fit"):
        read_footer(lambda at, n: longer[at:at + n], len(longer))
    cut = data[:-8][:4] + data[-8:]  # the footer's length kept, its bytes gone
    with pytest.raises(ShardFormatError):
        read_footer(lambda at, n: cut[at:at + n], len(cut))


def test_lists_nested_without_end_are_refused_not_a_recursion():
    """Found by reading: lists in lists did not count toward the nesting bound, so 5,000 of them
    raised RecursionError out of the page-header reader (a crash of the scan, not a refusal)."""
    header = bytes([0x19]) + bytes([0x19]) * 5000
    with pytest.raises(ShardFormatError, match="bad page header"):
        read_header(lambda at, n: header[at:at + n], 0, len(header))
    with pytest.raises(ShardFormatError, match="nested too deep"):
        _struct(header, 0)
    structs = bytes([0x1C]) * 5000  # field 1, a struct, holding field 1, a struct, ...
    with pytest.raises(ShardFormatError, match="nested too deep"):
        _struct(structs, 0)


def test_bools_in_a_list_are_a_byte_each_and_a_list_is_no_longer_than_its_data():
    # field 1: a list of 3 bools (1 true, 2 false as the compact protocol sends them), then field 2: i32 7
    assert _struct(bytes([0x19, 0x31, 1, 2, 1, 0x15, 14, 0]), 0) == ({1: [True, False, True], 2: 7}, 8)
    # a list that says 2**40 bools in 10 bytes: refused at once (it was 2**40 items made from nothing)
    huge = bytes([0x19, 0xF1, 0x80, 0x80, 0x80, 0x80, 0x80, 0x20, 0, 0])  # count 15: a varint count follows
    with pytest.raises(ShardFormatError, match="longer than its data"):
        _struct(huge, 0)


def _scan_in_a_child(path, memory_limit: int = 4 << 30) -> tuple[str, str]:
    """(members, error) of a scan in a child process under an address-space limit: an abort or a
    runaway allocation fails the test, not the test run."""
    child = ("import resource, sys\nresource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]),) * 2)\n"
             "from shardfs.formats import ShardFormatError, format_for\nfrom shardfs.storage import open_shard\n"
             "try:\n    result = format_for(sys.argv[1]).scan(open_shard(sys.argv[1]))\n"
             "    print(len(result.members), result.error)\n"
             "except ShardFormatError as exc:  # the whole file refused\n    print(0, exc)\n")
    done = subprocess.run([sys.executable, "-c", child, str(path), str(memory_limit)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    members, error = done.stdout.split(" ", 1)
    return members, error.strip()


def _corpus_file(name: str, tmp_path):
    path = tmp_path / "train.parquet"
    with open(os.path.join(CORPUS, name), "rb") as f:
        path.write_bytes(f.read())
    return path


def test_a_histogram_of_the_wrong_length_is_a_refused_file_not_an_aborted_process(tmp_path):
    """The fuzzer's input (parquet_file, fifth campaign): a definition-level histogram of 2 for a
    column of 1 level. pyarrow throws a C++ exception while it makes that column chunk's metadata
    object, through a binding that cannot pass it on: the process aborted. In a child, so that the
    old abort is this test failing, not the test run ending."""
    path = _corpus_file("histogram-size-aborted-pyarrow", tmp_path)
    members, error = _scan_in_a_child(path)
    assert members == "0" and error not in ("", "None")
    with pytest.raises(OSError, match="histogram"):  # pyarrow refuses it too, where it can say so
        pq.ParquetFile(str(path)).read(columns=["image_data"])


def test_a_footer_claiming_more_rows_than_bytes_is_refused_before_pyarrow_reads(tmp_path):
    """The fuzzer's input: a row group of 1.6 * 10**12 rows in 7 KB. pyarrow allocates for the rows
    a footer claims (its own read of this file touched 24 GB); the scan refuses it first."""
    members, error = _scan_in_a_child(_corpus_file("rows-claimed-in-the-trillions", tmp_path))
    assert members == "0" and "rows in" in error


def _thrift(fields: dict) -> bytes:
    """A Thrift compact struct of i32 and struct fields (enough for a page header)."""
    out, last = bytearray(), 0
    for fid in sorted(fields):
        value = fields[fid]
        out.append((fid - last) << 4 | (12 if isinstance(value, dict) else 5))
        last = fid
        if isinstance(value, dict):
            out += _thrift(value)
        else:
            out += _varint((value << 1) ^ (value >> 63))
    return bytes(out) + b"\x00"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append(n & 0x7F | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


class _Bytes:
    def __init__(self, data: bytes):
        self.data, self.size, self.window = data, len(data), 1 << 16

    def pread(self, offset: int, length: int) -> bytes:
        return self.data[offset:offset + length]


def test_a_page_may_not_hold_more_values_than_its_row_group_has_rows():
    """Found by reading: 9 bytes of run-length levels said 16 million nulls, and the scan made a
    list of them (416 MB); billions would take the machine. Now the page is refused."""
    levels = _varint((1 << 24) << 1) + b"\x00"  # one run of 2**24 zeros: every value null
    body = len(levels).to_bytes(4, "little") + levels
    header = _thrift({1: 0, 2: len(body), 3: len(body), 5: {1: 1 << 24, 2: 0, 3: 3, 4: 3}})
    data = header + body
    chunk = Chunk(0, len(data), "UNCOMPRESSED", "image")
    with pytest.raises(ShardFormatError, match="more than the 10 rows left"):
        FORMAT._chunk(Window(_Bytes(data)), chunk, 1, len(data), 10, [])
    ten = _thrift({1: 0, 2: len(body), 3: len(body), 5: {1: 10, 2: 0, 3: 3, 4: 3}}) + body
    assert FORMAT._chunk(Window(_Bytes(ten)), Chunk(0, len(ten), "UNCOMPRESSED", "image"), 1, len(ten), 10,
                         []) == [None] * 10
