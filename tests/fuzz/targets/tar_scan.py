"""The tar scanner (formats/tar.py with its compiled fast path, formats/_tarscan.c, and the index's
compiled plain-members pass), on an archive's bytes as a shard would hold them.

Beyond "no crash": the compiled scanner gives exactly what the plain Python scanner gives (members,
offsets, sizes, names, modes, mtimes, links, kept data, sparse maps, warnings, errors), read in
large chunks and in small ones that end inside headers; every served range lies inside the
archive; wherever Python's tarfile reads a regular member at the same data offset, size and
sparse map agree with it (so the bytes do); the compiled plain-members pass (C, without the GIL)
gives the members that replaying the records in Python gives; the scan allocates at most 8 MiB
whatever sizes the headers claim. atheris covers the Python side only: the C side is checked by
these comparisons, not steered by its own coverage.
"""

from __future__ import annotations

import tarfile

import numpy as np
from fuzzlib import bounded, tar_bytes
from tarcraft import _fix_checksum, archive, header, member, old_sparse_member
from test_fuzz_tar_writers import MEMORY_BOUND, MemorySource, _pax_record, agrees_with_tarfile, scan_checked
from test_tarscan import scanned

from shardfs.formats import tar
from shardfs.formats.tar import TarFormat
from shardfs.index import plain, shard_index

PLAIN = TarFormat(compiled=False)
SMALL_CHUNK = 1024 + 512  # ends inside headers and members


def one_input(data: bytes) -> None:
    result = scan_checked(data)  # compiled, default chunks; bounded memory; ranges inside; errors say where
    agrees_with_tarfile(data, result)
    want = scanned(PLAIN.scan(MemorySource(data)))
    assert scanned(result) == want, "the compiled scanner and the plain one disagree"
    if tar._tarscan is None:
        return
    with bounded(MEMORY_BOUND, "the scan in small chunks"):
        columns = TarFormat(chunk=SMALL_CHUNK).scan(MemorySource(data), columns=True)
    assert scanned(columns) == want, "the compiled scanner disagrees with itself in small chunks"
    _plain_members_agree(data, columns)


def _plain_members_agree(data: bytes, result) -> None:
    """Where the compiled pass takes a shard as plain, replaying its records gives the same members."""
    if result.columns is None:
        return
    fast = plain.members(result.columns, result.cut)
    if fast is None:
        return
    result.members = list(result.columns.records())
    slow = shard_index._replayed(MemorySource(data), tar.FORMAT, result, False, lambda line: None)
    for field in ("blob", "dirs", "dir_count"):
        assert getattr(fast, field) == getattr(slow, field), f"plain members: {field} differs from replay"
    for field in ("name_end", "kind", "offset", "size", "mode", "mtime", "parent", "hashes", "cls_member", "cls_value"):
        assert np.array_equal(getattr(fast, field), getattr(slow, field)), f"plain members: {field} differs"


def seeds() -> list[bytes]:
    files = {"a/b.txt": b"hello\n", "a/c.cls": b"3", "d/e.bin": bytes(range(256)) * 3, "f": b""}
    long = {"d/" + "e" * 120 + ".bin": b"long name"}  # beyond ustar: GNU 'L' or a PAX path
    base256 = bytearray(header(b"big", 5))
    base256[124:136] = b"\x80" + (5).to_bytes(11, "big")
    pax = b"".join(_pax_record(k, v) for k, v in [(b"path", b"pax/long/" + b"p" * 150), (b"mtime", b"1.5")])
    sparse_1_0 = b"".join(_pax_record(k, v) for k, v in [
        (b"GNU.sparse.major", b"1"), (b"GNU.sparse.minor", b"0"), (b"GNU.sparse.name", b"s.bin"),
        (b"GNU.sparse.realsize", b"3000")])
    return [
        tar_bytes(files, tarfile.USTAR_FORMAT),
        tar_bytes({**files, **long}, tarfile.GNU_FORMAT),
        tar_bytes({**files, **long, "ünï/名.txt": b"x"}, tarfile.PAX_FORMAT),
        archive(_fix_checksum(base256) + b"hello".ljust(512, b"\0"), member(b"after", b"1")),
        archive(member(b"PaxHeader", pax, typeflag=b"x"), member(b"short", b"data")),
        archive(member(b"pax_global_header", _pax_record(b"comment", b"hi"), typeflag=b"g"), member(b"g", b"1")),
        archive(member(b"././@LongLink", b"L" * 200 + b"\0", typeflag=b"L"), member(b"x", b"long name")),
        archive(member(b"t", b"target"), header(b"s", typeflag=b"2", linkname=b"t"),
                header(b"h", typeflag=b"1", linkname=b"t"), header(b"d", typeflag=b"5")),
        archive(old_sparse_member(b"sparse", [(0, b"a" * 512), (4096, b"b" * 512), (9000, b"c" * 100)], 10_000)),
        archive(member(b"PaxHeader", sparse_1_0, typeflag=b"x"),
                member(b"s", b"1\n100\n200\n".ljust(512, b"\0") + b"z" * 200)),
        member(b"a", b"1") + header(b"cut", 5000) + b"x" * 100,  # a member the file cuts short
        archive(member(b"a", b"1"), b"\x01" * 512, member(b"b", b"2")),  # a damaged header skipped
    ]
