"""The tar scanner's compiled fast path (formats/_tarscan.c) against the plain scanner it stands in
for (``TarFormat(compiled=False)``): on every archive the writer and edge-case suites use, on
hand-made headers at the fast path's borders, and on damaged copies of the writers' archives, both
give the same members (names, kinds, offsets, sizes, modes, mtimes, links, kept data, sparse maps),
warnings, errors and cut member. Each is scanned in the default large chunks and in small odd
chunks, so that chunk ends fall inside headers and members."""

from __future__ import annotations

import io
import os
import tarfile
import tempfile

import numpy as np
import pytest
import tar_corpus
from hypothesis import given, settings
from hypothesis import strategies as st
from tarcraft import _fix_checksum, archive, header, member
from test_fuzz_tar_writers import FUZZ, MemorySource, _header_offsets, edits, mutate

from shardfs.formats import tar
from shardfs.formats import tarcolumns
from shardfs.formats.tar import TarFormat
from shardfs.index import names as names_module
from shardfs.index import plain, shard_index
from shardfs.storage.local import LocalShard

PLAIN = TarFormat(compiled=False)
CHUNKS = [tar.CHUNK, 1024, 1536 + 512 * 3, 64 * 1024 + 512]  # small ones end inside headers and members



@pytest.fixture(autouse=True, scope="module")
def compiled_scanner():
    """Without it every comparison here would be the plain scanner's with itself: a checkout not
    built, or built from another _tarscan.c, fails (module scope: hypothesis takes no function fixture)."""
    assert tar._tarscan is not None, ("the compiled scanner is not loaded (not built, or built from another "
                                      "_tarscan.c): python setup.py build_ext --inplace")


def scanned(result) -> tuple:
    """What a scan found; members from the compiled scanner's columns too (scan(columns=True))."""
    assert not (result.members and result.columns)
    records = result.members or (list(result.columns.records()) if result.columns is not None else [])
    members = [(m.path, int(m.kind), m.offset, m.size, m.mode, m.mtime, m.link, m.small,
                None if m.sparse is None else m.sparse.tolist()) for m in records]
    return members, result.warnings, result.error, result.cut


def assert_alike(data: bytes, chunks=CHUNKS) -> tuple:
    """Alike from memory (pread) and from a file, through the page cache and, as after a shard of
    tiny members, into the thread's buffer from a page boundary (O_DIRECT where the filesystem
    takes it)."""
    want = scanned(PLAIN.scan(MemorySource(data)))
    with tempfile.NamedTemporaryFile(dir=os.environ.get("TMPDIR", "/var/tmp"), suffix=".tar") as f:
        f.write(data)
        f.flush()
        for chunk in chunks:
            for columns in (False, True):
                got = scanned(TarFormat(chunk=chunk).scan(MemorySource(data), columns=columns))
                assert got == want, f"chunk {chunk}, columns={columns}"
                for direct in (False, True):
                    shard = LocalShard.open(f.name)
                    tar._buffers.direct = direct
                    try:
                        got = scanned(TarFormat(chunk=chunk).scan(shard, columns=columns))
                    finally:
                        shard.close()
                    assert got == want, f"from a file, chunk {chunk}, columns={columns}, direct={direct}"
    return want


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return tar_corpus.make_tree(tmp_path_factory.mktemp("tarscan") / "src", big=100_000)


@pytest.mark.parametrize("name", list(tar_corpus.WRITERS))
def test_writer_archives_scan_alike(tree, tmp_path, name):
    if (why := tar_corpus.missing_tool(name)) is not None:
        pytest.skip(why)
    case = tar_corpus.build(name, tree, tmp_path / name)
    for path in case.archives:
        members, *_ = assert_alike(path.read_bytes())
        assert members, path


def test_edge_case_archives_scan_alike(tmp_path):
    if tar_corpus.missing_tool("tar") is not None:
        pytest.skip("needs GNU tar")
    cases = tar_corpus.edge_cases(tmp_path)
    assert len(cases) > 20
    for case in cases:
        for path in case.archives:
            assert_alike(path.read_bytes())


def _with(h: bytes, at: int, value: bytes) -> bytes:
    """A header with a field rewritten and its checksum fixed."""
    out = bytearray(h)
    out[at : at + len(value)] = value
    return _fix_checksum(out)


def _signed_checksum(h: bytes) -> bytes:
    """Bytes over 127 in the name, checksummed as old writers did (signed bytes)."""
    out = bytearray(h)
    out[0:4] = b"\xe9\xe8\xff\x80"
    out[148:156] = b" " * 8
    out[148:156] = b"%06o\0 " % (sum(b - 256 if b > 127 else b for b in out) & 0o777777)
    return bytes(out)


DATA = bytes(range(256)) * 3
CRAFTED = {
    "ustar-prefix": archive(_with(header(b"name.bin", len(DATA)), 345, b"the/prefix") + DATA + b"\0" * 256),
    "prefix-and-no-name": archive(_with(header(b"", 0), 345, b"only/prefix")),
    "gnu-magic-ignores-prefix": archive(_with(header(b"n", 0, magic=b"ustar  \0"), 345, b"not/a/prefix")),
    "regular-named-as-a-folder": archive(member(b"olddir/"), member(b"olddir/f", b"x")),
    "links": archive(member(b"t", b"target"), header(b"s", typeflag=b"2", linkname=b"t"),
                     header(b"h", typeflag=b"1", linkname=b"t"), header(b"d", typeflag=b"5")),
    "types-left-to-the-plain-way": archive(header(b"fifo", typeflag=b"6"), header(b"dev", typeflag=b"3"),
                                           member(b"dump", b"a\0", typeflag=b"D"), member(b"after", b"ok")),
    "base-256-size": archive(_with(header(b"big", 5), 124, b"\x80" + (5).to_bytes(11, "big")) + b"hello".ljust(512, b"\0")),
    "an-8-in-the-mode": archive(_with(header(b"m", 0), 100, b"0000648\0"), member(b"n", b"x")),
    "spaces-around-numbers": archive(_with(header(b"sp", 3), 124, b"  3        \0") + b"abc".ljust(512, b"\0")),
    "signed-checksum": archive(_signed_checksum(header(b"name", 0)), member(b"next", b"y")),
    "bad-checksum-then-good": archive(member(b"a", b"1"), b"\x01" * 512, member(b"b", b"2")),
    "zero-block-inside": member(b"a", b"1") + b"\0" * 512 + member(b"b", b"2") + b"\0" * 1024,
    "small-data-at-a-chunk-end": archive(*(member(b"f%d" % i, b"z" * (i % 40)) for i in range(40))),
    "truncated-member": member(b"a", b"1") + header(b"b", 5000) + b"x" * 100,
    "truncated-folder": member(b"a", b"1") + _with(header(b"d", typeflag=b"5"), 124, b"%011o\0" % 4096),
    "no-end-marker": member(b"a", b"1") + member(b"b", b"2"),
    "global-comment-keeps-the-fast-path": archive(member(b"pax_global_header", b"17 comment=abcd\n", typeflag=b"g"),
                                                  member(b"a", b"1")),
    "global-path": archive(member(b"pax_global_header", b"13 path=zzzz\n", typeflag=b"g"), member(b"a", b"1"),
                           member(b"b", b"2")),
    "global-mtime": archive(member(b"pax_global_header", b"15 mtime=12.5\n", typeflag=b"g"), member(b"a", b"1")),
    "pax-then-plain": archive(member(b"PaxHeader", b"12 path=pp\n", typeflag=b"x"), member(b"a", b"1"),
                              member(b"b", b"2")),
    "long-name-then-plain": archive(member(b"././@LongLink", b"L" * 300 + b"\0", typeflag=b"L"), member(b"a", b"1"),
                                    member(b"b", b"2")),
}


@pytest.mark.parametrize("name", list(CRAFTED))
def test_crafted_headers_scan_alike(name):
    members, _, error, _ = assert_alike(CRAFTED[name], CHUNKS + [2048, 2560, 3072])
    assert members or error, name


def test_the_fast_path_reads_plain_headers(monkeypatch):
    """It is the compiled scanner that reads a plain archive (the tests above compare something)."""
    calls, compiled = [], tar._tarscan
    monkeypatch.setattr(tar, "_tarscan", type("Spy", (), {
        "NFIELDS": compiled.NFIELDS, "scan": staticmethod(lambda *a: calls.append(a) or compiled.scan(*a))}))
    data = CRAFTED["small-data-at-a-chunk-end"]
    result = TarFormat(chunk=1024).scan(MemorySource(data))
    assert len(result.members) == 40 and len(calls) >= 20


@pytest.fixture(scope="module")
def seeds(tree, tmp_path_factory):
    root = tmp_path_factory.mktemp("tarscan-seeds")
    found = []
    for name in ["gnutar-gnu", "gnutar-posix-sparse-1.0", "bsdtar-pax", "bsdtar-ustar", "tarfile-ustar",
                 "tarfile-gnu", "webdataset-tarwriter"]:
        if tar_corpus.missing_tool(name) is None:
            for path in tar_corpus.build(name, tree, root / name).archives:
                data = path.read_bytes()
                found.append((data, _header_offsets(data)))
    assert len(found) >= 4
    return found


@settings(max_examples=300, **FUZZ)
@given(pick=st.integers(0, 1 << 16), plan=st.lists(edits, min_size=1, max_size=4),
       chunk=st.sampled_from([1024, 1536, 4096 + 512, 64 * 1024]))
def test_damaged_archives_scan_alike(seeds, pick, plan, chunk):
    data, headers = seeds[pick % len(seeds)]
    damaged = mutate(data, headers, plan)
    want = scanned(PLAIN.scan(MemorySource(damaged)))
    assert scanned(TarFormat(chunk=chunk).scan(MemorySource(damaged), columns=chunk > 2000)) == want


@settings(max_examples=100, **FUZZ)
@given(files=st.lists(st.tuples(st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=120),
                                st.binary(max_size=1500)), min_size=1, max_size=30),
       fmt=st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]),
       chunk=st.sampled_from([1024, 2048 + 512, 64 * 1024]))
def test_tarfile_archives_scan_alike(files, fmt, chunk):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tf:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_600_000_000
            try:
                tf.addfile(info, io.BytesIO(data))
            except ValueError:  # a name ustar cannot hold
                continue
    data = out.getvalue()
    want = scanned(PLAIN.scan(MemorySource(data)))
    assert scanned(TarFormat(chunk=chunk).scan(MemorySource(data), columns=chunk > 2000)) == want


def indexed(path, monkeypatch, compiled: bool) -> tuple:
    """Everything shard_index.build records of a shard, built with or without the compiled scanner
    (its columns indexed by index/plain.py where every member is plain)."""
    with monkeypatch.context() as m:
        m.setattr(tar.FORMAT, "compiled", compiled)
        ix = shard_index.build(str(path))
    arrays = [ix.name_end, ix.kind, ix.offset, ix.size, ix.mode, ix.mtime, ix.hash, ix.parent, ix.cls_member, ix.cls_value]
    return (ix.names, [(a.dtype.str, a.tolist()) for a in arrays], list(ix.dirs), ix.symlinks,
            {k: v.tolist() for k, v in ix.sparse.items()}, ix.warnings, ix.error)


PLAIN_SHARDS = {
    "gnu-dot-slash": archive(member(b"./", typeflag=b"5"), member(b"./a/", typeflag=b"5"), member(b"./a/x.jpg", b"x" * 900),
                             member(b"./a/y.cls", b"7"), member(b"./b/z.jpg", b"z")),
    "webdataset-labels": archive(*(member(b"s%04d.%s" % (i, ext), data) for i in range(50)
                                   for ext, data in ((b"jpg", b"j" * 3000), (b"cls", b"%d" % (i % 7)), (b"txt", b"t"))),
                                 member(b"bad.cls", b"not a number")),
    "twice": archive(member(b"a/x", b"1"), member(b"a/x", b"2")),
    "file-then-folder": archive(member(b"a", b"file"), member(b"a/x", b"under a file")),
    "folder-then-file": archive(member(b"a/x", b"1"), member(b"a", b"over a full folder")),
    "links": CRAFTED["links"],
    "file-named-dot": archive(member(b".", b"dot"), member(b"ok", b"k")),
    "denormal": archive(member(b"a//b", b"1"), member(b"/abs", b"2"), member(b"c/./d", b"3")),
    "root-entries": archive(member(b"/", typeflag=b"5"), member(b"..", typeflag=b"5"), member(b"k", b"k")),
    "long-component": archive(member(b"d/" + b"n" * 98, b"1")),
    "mtime-far": archive(_with(header(b"far", 1), 136, b"77777777777\0") + b"1".ljust(512, b"\0")),
}


FROM_COLUMNS = {"gnu-dot-slash", "webdataset-labels", "long-component", "mtime-far", "root-entries"}  # the others: replay.py


@pytest.mark.parametrize("name", list(PLAIN_SHARDS))
def test_shards_index_alike_from_columns(name, tmp_path, monkeypatch):
    path = tmp_path / "a.tar"
    path.write_bytes(PLAIN_SHARDS[name])
    found = []
    members = plain.members
    monkeypatch.setattr(plain, "members", lambda *a: found.append(members(*a)) or found[-1])
    assert indexed(path, monkeypatch, True) == indexed(path, monkeypatch, False)
    assert len(found) == 1 and (found[0] is not None) == (name in FROM_COLUMNS)


def test_writer_and_edge_shards_index_alike(tree, tmp_path, monkeypatch):
    paths = [p for name in ["gnutar-gnu", "gnutar-ustar", "bsdtar-ustar", "tarfile-gnu", "webdataset-tarwriter"]
             if tar_corpus.missing_tool(name) is None for p in tar_corpus.build(name, tree, tmp_path / name).archives]
    if tar_corpus.missing_tool("tar") is None:
        paths += [p for case in tar_corpus.edge_cases(tmp_path / "edge") for p in case.archives]
    assert len(paths) > 20
    for path in paths:
        assert indexed(path, monkeypatch, True) == indexed(path, monkeypatch, False), path


@settings(max_examples=200, **FUZZ)
@given(names=st.lists(st.lists(st.binary(min_size=1, max_size=60).filter(lambda p: b"/" not in p and b"\0" not in p),
                               min_size=1, max_size=4).map(b"/".join).filter(lambda n: len(n) <= 100),
                      min_size=1, max_size=20, unique=True))
def test_the_scanner_hashes_names_as_path_hash(names):
    """The path hash the compiled scanner gives each normal name is shard_index.path_hash of it
    (XXH64 in C, as the xxhash package computes it: names shorter and longer than its 32-byte
    stripes, with every tail length)."""
    result = TarFormat().scan(MemorySource(archive(*(member(n, b"x") for n in names))), columns=True)
    assert result.columns is not None
    rows = result.columns.rows
    normal = rows[:, tarcolumns.NORM_START] >= 0
    begins = np.concatenate([[0], rows[:-1, tarcolumns.NAME_END]])
    for row, begin in zip(rows[normal], begins[normal]):
        name = result.columns.names[begin + row[tarcolumns.NORM_START] : begin + row[tarcolumns.NORM_END]]
        assert int(row[tarcolumns.HASH:tarcolumns.HASH + 1].view(np.uint64)[0]) == shard_index.path_hash(name)
    assert normal.sum() >= len([n for n in names if not n.startswith(b".") and b"/." not in n])


@settings(max_examples=200, **FUZZ)
@given(names=st.lists(st.lists(st.sampled_from([b"a", b"b", b".", b"x" * 130, b"\xe9"]), min_size=1, max_size=5)
                      .map(b"/".join).map(lambda n: n if len(n) <= 100 else n[:100]), min_size=1, max_size=25),
       dot_slash=st.booleans(), chunk=st.sampled_from([tar.CHUNK, 1024, 2048 + 512]))
def test_the_scanner_gives_parents_and_the_folders_above(names, dot_slash, chunk):
    """Each normal name's parent folder (where it ends, its path_hash) and the hashes of the
    folders above the parents are those of names.parent_of and path_hash on the name: plain.py
    groups folders and finds files where a folder must be by them. Members of one folder come
    together and apart, and chunk ends fall between them (the scanner leaves out folders the
    previous member's parent had)."""
    data = archive(*(member((b"./" if dot_slash else b"") + n, b"x") for n in names))
    result = TarFormat(chunk=chunk).scan(MemorySource(data), columns=True)
    if result.columns is None:
        return  # a member the plain scanner reads (none of these names needs it, but a cut may)
    columns = result.columns
    rows = columns.rows
    begins = np.concatenate([[0], rows[:-1, tarcolumns.NAME_END]])
    normal = rows[:, tarcolumns.NORM_START] >= 0
    assert normal.any() or not any(b"." not in n.split(b"/") for n in names)
    want_folders = set()
    for row, begin in zip(rows[normal], begins[normal]):
        name = columns.names[begin + row[tarcolumns.NORM_START] : begin + row[tarcolumns.NORM_END]]
        parent = names_module.parent_of(name)
        end = row[tarcolumns.PARENT_END]
        assert (columns.names[begin + row[tarcolumns.NORM_START] : begin + end] if end >= 0 else b"") == parent
        assert int(row[tarcolumns.PARENT_HASH:].view(np.uint64)[0]) == shard_index.path_hash(parent)
        parts = name.split(b"/")
        want_folders |= {shard_index.path_hash(b"/".join(parts[:i])) for i in range(1, len(parts) - 1)}
    above = set(np.frombuffer(columns.above, np.uint64).tolist())
    parents = set(rows[normal, tarcolumns.PARENT_HASH].view(np.uint64).tolist())
    assert above <= want_folders and want_folders <= above | parents


def _plain_columns(*members):
    return TarFormat().scan(MemorySource(archive(*members)), columns=True).columns


def _with_hashes(columns, field: int, rows: list[int], value: int):
    changed = columns.rows.copy()
    changed[rows, field] = np.array([value], np.uint64).view(np.int64)[0]
    return tarcolumns.MemberColumns(columns.names, changed, columns.links, columns.smalls, columns.above)


def test_equal_hashes_go_to_replay():
    """plain.members tells names and folders apart by hash only where the hashes differ: two
    names of one hash (another name twice, or a collision), a file whose hash is a folder's, or
    two folders of one hash leave the shard to replay.py, which compares the names themselves."""
    columns = _plain_columns(member(b"a/x", b"1"), member(b"b/y", b"2"), member(b"c/d/z", b"3"))
    assert plain.members(columns, None) is not None
    assert plain.members(_with_hashes(columns, tarcolumns.HASH, [0, 2], 42), None) is None
    folder_d = shard_index.path_hash(b"c/d")
    assert plain.members(_with_hashes(columns, tarcolumns.HASH, [1], folder_d), None) is None
    folder_c = shard_index.path_hash(b"c")  # a folder above a parent (the scanner's above)
    assert plain.members(_with_hashes(columns, tarcolumns.HASH, [1], folder_c), None) is None
    assert plain.members(_with_hashes(columns, tarcolumns.PARENT_HASH, [0, 1], 42), None) is None


def test_folders_from_columns_in_order_of_first_use():
    columns = _plain_columns(member(b"b/x", b"1"), member(b"top", b"2"), member(b"a/y", b"3"), member(b"b/z", b"4"),
                             member(b"a/c/w", b"5"))
    found = plain.members(columns, None)
    assert found.dirs.split(b"\0") == [b"b", b"", b"a", b"a/c"] and found.dir_count == 4
    assert found.parent.tolist() == [0, 1, 2, 0, 3]
    assert found.blob == b"b/xtopa/yb/za/c/w" and found.name_end.tolist() == [3, 6, 9, 12, 17]


@settings(max_examples=150, **FUZZ)
@given(entries=st.lists(st.tuples(st.lists(st.sampled_from([b"a", b"b", b"c", b"."]), min_size=1, max_size=4)
                                  .map(b"/".join), st.booleans()), min_size=1, max_size=30),
       dot_slash=st.booleans())
def test_random_shards_index_alike_from_columns(entries, dot_slash):
    """plain.members (its C part, _tarscan.plain_members) against replay.py on random trees of
    files and folders: names twice, files where folders must be, folders of files seen before or
    after, "./" prefixes and "." components; the index is the same either way."""
    members = [member((b"./" if dot_slash else b"") + name + (b"/" if folder else b""), b"" if folder else name,
                      typeflag=b"5" if folder else b"0")
               for name, folder in entries]
    with tempfile.NamedTemporaryFile(dir=os.environ.get("TMPDIR", "/var/tmp"), suffix=".tar") as f:
        f.write(archive(*members))
        f.flush()
        with pytest.MonkeyPatch.context() as mp:
            assert indexed(f.name, mp, True) == indexed(f.name, mp, False)


def test_a_thread_reads_direct_after_a_shard_of_tiny_members(tmp_path):
    """The fast path reads a shard into its thread's buffer (Shard.read_at) once the thread's last
    shard had tiny members, through the page cache (pread) after one of large members."""
    tiny, large = tmp_path / "tiny.tar", tmp_path / "large.tar"
    tiny.write_bytes(archive(*(member(b"t%04d" % i, b"x" * 300) for i in range(3000))))
    large.write_bytes(archive(*(member(b"l%d" % i, b"y" * 200_000) for i in range(30))))
    calls = []

    def scan(path):
        shard = LocalShard.open(str(path))
        pread, read_at = shard.pread, shard.read_at
        shard.pread = lambda offset, length: calls.append("pread") or pread(offset, length)
        shard.read_at = lambda buf, offset, length: calls.append("read_at") or read_at(buf, offset, length)
        try:
            return TarFormat().scan(shard, columns=True)
        finally:
            shard.close()

    tar._buffers.direct = False
    for path, want in ((tiny, "pread"), (tiny, "read_at"), (large, "read_at"), (large, "pread"), (tiny, "pread")):
        calls.clear()
        assert scanned(scan(path)) == scanned(PLAIN.scan(MemorySource(path.read_bytes())))
        assert calls and set(calls) == {want}, (path.name, calls)
