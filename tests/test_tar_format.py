"""The tar scanner against what real tools write, and against damage."""

import io
import os
import shutil
import subprocess
import tarfile

import pytest

from shardfs.storage import open_shard
from shardfs.index import shard_index as index
from shardfs.index import names
from shardfs.formats.base import Kind
from shardfs.formats.tar import FORMAT as TAR
from shardfs.formats import sparse
from tarcraft import archive, header, member, old_sparse_member

# 157 bytes: a GNU long name, a PAX path, and for ustar a prefix ("./a/b...", 94 <= 155 bytes)
# and a name ("c...txt", 64 <= 100 bytes; its folder's entry "b.../", 91), so every format holds it.
LONG = "a/" + "b" * 90 + "/" + "c" * 60 + ".txt"


def _tree(root):
    (root / "cls1").mkdir(parents=True)
    (root / "cls1" / "x.jpg").write_bytes(b"x" * 700)
    (root / "cls2").mkdir()
    (root / "cls2" / "y.jpg").write_bytes(b"y" * 3)
    deep = root / os.path.dirname(LONG)
    deep.mkdir(parents=True)
    (root / LONG).write_bytes(b"long")
    os.symlink("x.jpg", root / "cls1" / "link.jpg")


def _read(path, rec):
    with open(path, "rb") as f:
        f.seek(rec.offset)
        return f.read(rec.size)


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs GNU tar")
@pytest.mark.parametrize("fmt", ["gnu", "posix", "ustar"])
def test_gnu_tar_sort_name_output(tmp_path, fmt):
    _tree(tmp_path / "src")
    out = tmp_path / f"{fmt}.tar"
    done = subprocess.run(["tar", "--sort=name", f"--format={fmt}", "-cf", str(out), "-C", str(tmp_path / "src"), "."],
                          capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    assert len(LONG) > 100 and (fmt != "ustar" or b"././@LongLink" not in out.read_bytes())  # the prefix field
    ix = index.build(str(out))
    assert ix.error is None and ix.warnings == []
    result = TAR.scan(open_shard(str(out)))
    by_name = {names.normalise(r.path): r for r in result.members if r.path.strip(b"./")}
    assert _read(out, by_name[b"cls1/x.jpg"]) == b"x" * 700
    assert _read(out, by_name[LONG.encode()]) == b"long"
    assert by_name[b"cls1/link.jpg"].kind == Kind.SYMLINK and by_name[b"cls1/link.jpg"].link == b"x.jpg"
    assert by_name[b"cls2"].kind == Kind.DIR


def test_tarfile_formats_and_hardlinks(tmp_path):
    for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        path = tmp_path / f"{fmt}.tar"
        with tarfile.open(path, "w", format=fmt) as tf:
            for name, data in (("dir/" + "p" * 90 + "/f.bin", b"1" * 513), ("top.bin", b"")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            link = tarfile.TarInfo("alias.bin")
            link.type, link.linkname = tarfile.LNKTYPE, "dir/" + "p" * 90 + "/f.bin"
            tf.addfile(link)
        ix = index.build(str(path))
        assert ix.error is None and ix.warnings == []
        got = {ix.name(i): (int(ix.offset[i]), int(ix.size[i])) for i in range(len(ix))}
        assert got[b"alias.bin"] == got[("dir/" + "p" * 90 + "/f.bin").encode()]
        assert got[b"top.bin"][1] == 0


def test_base256_size_and_skipped_types(tmp_path):
    h = bytearray(header(b"big.bin", 0))
    h[124:136] = b"\x80" + (5).to_bytes(11, "big")  # GNU base-256 size
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    data = bytes(h) + b"hello".ljust(512, b"\0")
    path = tmp_path / "b.tar"
    path.write_bytes(archive(data, member(b"fifo", typeflag=b"6"), member(b"dev", typeflag=b"3")))
    result = TAR.scan(open_shard(str(path)))
    assert [(r.path, r.size) for r in result.members] == [(b"big.bin", 5)]
    assert result.warnings == ["member fifo: fifo not served", "member dev: character device not served"]


def test_damage_keeps_members_before_it(tmp_path):
    good = member(b"one.txt", b"1") + member(b"two.txt", b"2")
    bad = bytearray(member(b"three.txt", b"3"))
    bad[0] ^= 0xFF  # breaks the header checksum
    path = tmp_path / "d.tar"
    path.write_bytes(good + bytes(bad) + b"\0" * 1024)
    result = TAR.scan(open_shard(str(path)))
    assert [r.path for r in result.members] == [b"one.txt", b"two.txt"]
    assert "damaged header: bad header checksum at offset 2048" in result.error


def test_hostile_pax_records(tmp_path):
    for record in (b"999 path=x\n", b"abc path=x\n", b"12 nokeyhere\n", b"11 size=-5\n", b"12 size=abc\n"):
        path = tmp_path / "p.tar"
        path.write_bytes(archive(member(b"pax", record, typeflag=b"x"), member(b"f", b"data")))
        result = TAR.scan(open_shard(str(path)))
        assert result.error and "PAX" in result.error and result.members == []


def test_absurd_pax_mtimes_become_zero(tmp_path):
    for value in (b"inf", b"nan", b"-1e300"):
        record = b"mtime=" + value + b"\n"
        record = b"%d %s" % (len(record) + 3, record)
        path = tmp_path / "t.tar"
        path.write_bytes(archive(member(b"pax", record, typeflag=b"x"), member(b"f", b"data")))
        ix = index.build(str(path))
        assert len(ix) == 1 and ix.mtime[0] == 0.0


def test_hardlink_to_missing_target_is_reported(tmp_path):
    path = tmp_path / "h.tar"
    path.write_bytes(archive(member(b"link", typeflag=b"1", linkname=b"nowhere")))
    ix = index.build(str(path))
    assert len(ix) == 0
    assert ix.warnings == ["h.tar: hard link link -> nowhere: target missing"]


@pytest.mark.parametrize("raw,expected", [
    (b"./a//b/", b"a/b"), (b"a/./b", b"a/b"), (b"x", b"x"), (b"\xe9t\xe9", b"\xe9t\xe9"),
    (b"/abs/x", b"abs/x"), (b"//abs", b"abs"),  # leading slashes stripped, as GNU tar and bsdtar do
])
def test_normalise(raw, expected):
    assert names.normalise(raw) == expected


@pytest.mark.parametrize("raw,why", [
    (b"/../x", "climbs"), (b"../x", "climbs"), (b"a/../../x", "climbs"), (b"a/..", "climbs"),
    (b"a\0b", "NUL"), (b"./", "empty"), (b"x" * 256, "longer than 255"), ((b"d/" * 2100) + b"f", "longer than 4095"),
])
def test_normalise_refuses(raw, why):
    with pytest.raises(names.BadName, match=why):
        names.normalise(raw)


def _pax(**records: bytes) -> bytes:
    body = b""
    for key, value in records.items():
        line = b" %s=%s\n" % (key.replace("_", ".").encode(), value)
        length = len(line) + len(str(len(line) + 2))
        body += b"%d%s" % (length, line)
    return member(b"PaxHeader", body, typeflag=b"x")


def test_constructs_tar_does_not_extract_alone_are_left_out(tmp_path):
    path = tmp_path / "n.tar"
    path.write_bytes(archive(
        member(b"part", b"rest of a file", typeflag=b"M"),
        _pax(path=b"first"), _pax(path=b"second"), member(b"twice", b"?"),
        _pax(GNU_sparse_major=b"2", GNU_sparse_minor=b"0", GNU_sparse_name=b"real/name"),
        member(b"./GNUSparseFile.1/name", b"map and data"),
        member(b"after", b"still read"),
    ))
    result = TAR.scan(open_shard(str(path)))
    assert [(r.path, _read(path, r)) for r in result.members] == [(b"after", b"still read")]
    assert [w.split(":")[0] for w in result.warnings] == ["member part", "member second", "member real/name"]
    assert "unknown sparse format" in result.warnings[2]
    assert result.error is None


def test_old_gnu_sparse_map_with_extension_blocks(tmp_path):
    """Thirty runs: four in the header, then two extension blocks (21 + 5)."""
    runs = [(i * 10_000 + i, bytes([65 + i % 26]) * (100 + i)) for i in range(30)]
    content = bytearray(400_000)
    for offset, chunk in runs:
        content[offset : offset + len(chunk)] = chunk
    path = tmp_path / "s.tar"
    path.write_bytes(archive(old_sparse_member(b"holes", runs, len(content)), member(b"after", b"x")))
    ix = index.build(str(path))
    assert ix.error is None and ix.warnings == [] and [ix.name(i) for i in range(len(ix))] == [b"holes", b"after"]
    data = path.read_bytes()
    stored = lambda o, n: data[int(ix.offset[0]) + o : int(ix.offset[0]) + o + n]  # noqa: E731
    assert int(ix.size[0]) == len(content) and len(ix.sparse[0]) == 30
    assert sparse.read(ix.sparse[0], 0, len(content), stored) == bytes(content)
    for start, length in [(0, 1), (9_999, 5), (10_001, 101), (150_000, 70_000), (399_990, 10)]:
        assert sparse.read(ix.sparse[0], start, length, stored) == bytes(content[start : start + length])
    with tarfile.open(path) as tf:  # Python's tarfile reads the same map
        assert tf.extractfile("holes").read() == bytes(content)


@pytest.mark.parametrize("runs,real_size", [
    ([(100, b"a"), (50, b"b")], 1000),  # out of order
    ([(0, b"aaaa"), (2, b"b")], 1000),  # overlapping
    ([(990, b"a" * 20)], 1000),  # past the real size
])
def test_hostile_sparse_maps_are_left_out(tmp_path, runs, real_size):
    path = tmp_path / "h.tar"
    path.write_bytes(archive(old_sparse_member(b"bad", runs, real_size), member(b"after", b"x")))
    ix = index.build(str(path))
    assert [ix.name(i) for i in range(len(ix))] == [b"after"]
    assert "member bad: sparse file with a sparse map out of order or beyond the file" in ix.warnings[0]


def test_dumpdirs_and_slash_ended_regular_members_are_directories(tmp_path):
    path = tmp_path / "d.tar"
    path.write_bytes(archive(member(b"inc/", b"Yfile\0Nold\0\0", typeflag=b"D"), member(b"v7dir/", typeflag=b"\0"),
                             member(b"inc/file", b"data")))
    result = TAR.scan(open_shard(str(path)))
    assert [(r.path, r.kind) for r in result.members] == [(b"inc/", Kind.DIR), (b"v7dir/", Kind.DIR),
                                                           (b"inc/file", Kind.FILE)]


@pytest.mark.parametrize("field", [b"+0000000005\0", b"0_000000005\0", b"0o000000005\0", b"00000000009\0"])
def test_numbers_are_plain_octal(tmp_path, field):
    h = bytearray(header(b"f", 5))
    h[124:136] = field
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    path = tmp_path / "o.tar"
    path.write_bytes(archive(bytes(h) + b"hello".ljust(512, b"\0")))
    result = TAR.scan(open_shard(str(path)))
    assert result.members == [] and "bad number field" in result.error


def test_pax_size_beyond_the_octal_field_wins(tmp_path):
    path = tmp_path / "s.tar"
    path.write_bytes(archive(_pax(size=b"5"), header(b"big", 0) + b"hello".ljust(512, b"\0"), member(b"next", b"n")))
    result = TAR.scan(open_shard(str(path)))
    assert [(r.path, _read(path, r)) for r in result.members] == [(b"big", b"hello"), (b"next", b"n")]
