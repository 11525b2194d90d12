"""Property-based fuzzing of the tar index builder: damage gives a message, never a crash or wrong bytes."""

import io
import os
import tarfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardfs.index import shard_index as index
from shardfs.formats.base import Kind
from tarcraft import archive, member

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _valid_tar(files: dict[str, bytes], fmt) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return out.getvalue()


names = st.text(st.characters(codec="utf-8", exclude_characters="\0/"), min_size=1, max_size=40)
file_sets = st.dictionaries(st.lists(names, min_size=1, max_size=3).map("/".join), st.binary(max_size=2000),
                            min_size=1, max_size=8)
formats = st.sampled_from([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])


def _check(path, files=None):
    """index.build never raises on any bytes; what it serves is exactly what the archive holds."""
    ix = index.build(str(path))
    assert ix.error is None or isinstance(ix.error, str)
    data = path.read_bytes()
    for i in range(len(ix)):
        if ix.kind[i] != Kind.FILE:
            continue
        start, size = int(ix.offset[i]), int(ix.size[i])
        assert 0 <= start and start + size <= len(data)  # never points outside the shard
        if files is not None and ix.name(i).decode("utf-8", "surrogateescape") in files:
            assert data[start : start + size] == files[ix.name(i).decode()]
    return ix


@FUZZ
@given(files=file_sets, fmt=formats)
def test_valid_archives_round_trip(tmp_path_factory, files, fmt):
    path = tmp_path_factory.mktemp("t") / "a.tar"
    path.write_bytes(_valid_tar(files, fmt))
    ix = _check(path, files)
    assert ix.error is None
    assert len(ix) >= len([n for n in files if n.strip("/") not in ("", ".", "..")]) - len(ix.warnings)


@FUZZ
@given(files=file_sets, fmt=formats, flips=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(1, 255)),
                                                    min_size=1, max_size=6), cut=st.integers(0, 1 << 20))
def test_mutated_archives_never_crash_or_point_outside(tmp_path_factory, files, fmt, flips, cut):
    data = bytearray(_valid_tar(files, fmt))
    for pos, xor in flips:
        data[pos % len(data)] ^= xor
    path = tmp_path_factory.mktemp("t") / "m.tar"
    path.write_bytes(bytes(data[: max(1, cut % (len(data) + 1))]))
    _check(path)


@FUZZ
@given(blob=st.binary(max_size=4096) | st.binary(min_size=512, max_size=4096))  # half of them a whole block or more
def test_garbage_is_refused_with_a_message(tmp_path_factory, blob):
    path = tmp_path_factory.mktemp("t") / "g.tar"
    path.write_bytes(blob)
    ix = _check(path)
    if len(ix) == 0 and len(blob) >= 512 and blob[:512].strip(b"\0"):
        # Nothing served from a first block that is no tar header: the shard is refused, and
        # the message names it (zeros alone are an empty archive, as for tar).
        assert ix.error and "g.tar" in ix.error


@FUZZ
@given(size_field=st.binary(min_size=12, max_size=12), pax=st.binary(max_size=200))
def test_hostile_header_fields(tmp_path_factory, size_field, pax):
    """Arbitrary size fields and PAX records: no huge allocation, no exception."""
    h = bytearray(member(b"x", b"data")[:512])
    h[124:136] = size_field
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    path = tmp_path_factory.mktemp("t") / "h.tar"
    path.write_bytes(archive(member(b"PaxHeader", pax, typeflag=b"x"), bytes(h) + b"data".ljust(512, b"\0")))
    _check(path)


def test_a_huge_declared_extended_header_is_refused_without_allocating(tmp_path):
    h = bytearray(member(b"PaxHeader", b"")[:512])
    h[156:157] = b"x"
    h[124:136] = b"\x80" + (1 << 60).to_bytes(11, "big")  # 1 EiB of PAX records
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    path = tmp_path / "huge.tar"
    path.write_bytes(bytes(h) + b"\0" * 1024)
    ix = index.build(str(path))
    assert len(ix) == 0 and "extended header" in ix.error
    assert os.path.getsize(path) == 1536
