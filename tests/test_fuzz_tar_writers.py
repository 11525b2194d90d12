"""Fuzzing the tar scanner with damaged copies of what real writers produce (tar_corpus.py).

Every mutated archive is scanned in memory. Properties: no exception escapes (damage becomes
ScanResult.error, naming the offset where it is, or a warning), memory stays bounded whatever
sizes a header claims, every served range lies inside the archive, and where Python's tarfile
still reads the archive and finds a regular member at the same data offset, it agrees on the
size and the sparse map (so on the bytes)."""

from __future__ import annotations

import datetime
import io
import re
import tarfile
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tar_corpus
from shardfs.formats.base import Kind
from shardfs.formats.tar import FORMAT as TAR

SEED_CASES = ["gnutar-gnu", "gnutar-oldgnu", "gnutar-posix-sparse-0.0", "gnutar-posix-sparse-0.1",
              "gnutar-posix-sparse-1.0", "gnutar-incremental-level1", "gnutar-multivolume-posix",
              "gnutar-multivolume-gnu", "gnutar-volume-label", "bsdtar-pax", "bsdtar-gnutar", "bsdtar-v7",
              "tarfile-ustar", "tarfile-gnu", "tarfile-pax", "webdataset-tarwriter"]
MEMORY_BOUND = 8 << 20  # a window, one extended header of at most 1 MiB and its records, with room
# A case takes milliseconds; the deadline only turns a hang into a failure.
FUZZ = dict(deadline=datetime.timedelta(seconds=10), suppress_health_check=list(HealthCheck))
# (offset, length) of header fields worth rewriting with a valid checksum
FIELDS = [(0, 100), (100, 8), (124, 12), (136, 12), (156, 1), (157, 100), (257, 8), (345, 155), (482, 1)]


class MemorySource:
    """An archive's bytes as a ByteSource."""

    window = 64 * 1024

    def __init__(self, data: bytes):
        self.data, self.size = data, len(data)

    def pread(self, offset: int, length: int) -> bytes:
        return self.data[offset : offset + length]


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    """Each archive of the seed cases, with the offsets of its headers."""
    root = tmp_path_factory.mktemp("fuzzseeds")
    tree = tar_corpus.make_tree(root / "src", big=100_000)
    found = []
    for name in SEED_CASES:
        if tar_corpus.missing_tool(name) is None:
            for path in tar_corpus.build(name, tree, root / name).archives:
                data = path.read_bytes()
                found.append((f"{name}/{path.name}", data, _header_offsets(data)))
    assert len(found) >= 10
    return found


def _header_offsets(data: bytes) -> list[int]:
    """Where the headers are (extended ones too), read with tarfile's own number decoder."""
    offsets, pos = [], 0
    while pos + 512 <= len(data) and data[pos : pos + 512].count(0) < 512:
        offsets.append(pos)
        try:
            size = tarfile.nti(data[pos + 124 : pos + 136])
        except tarfile.HeaderError:
            break
        pos += 512 + (size + 511) // 512 * 512
    return offsets


def _fix_checksum(data: bytearray, at: int) -> None:
    data[at + 148 : at + 156] = b" " * 8
    data[at + 148 : at + 156] = b"%06o\0 " % sum(data[at : at + 512])


def _pax_record(key: bytes, value: bytes) -> bytes:
    body = b" " + key + b"=" + value + b"\n"
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length += 1
    return b"%d%s" % (length, body)


positions = st.integers(0, 1 << 30)
edits = st.one_of(
    st.tuples(st.just("flip"), positions, st.integers(1, 255)),
    st.tuples(st.just("overwrite"), positions, st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("insert"), positions, st.binary(min_size=1, max_size=700)),
    st.tuples(st.just("delete"), positions, st.integers(1, 1100)),
    st.tuples(st.just("truncate"), positions, st.just(b"")),
    # a header field rewritten, checksum fixed: the scanner then trusts the header
    st.tuples(st.just("field"), positions, st.sampled_from(FIELDS), st.one_of(
        st.binary(max_size=16), st.sampled_from([b"S", b"x", b"g", b"L", b"K", b"D", b"M", b"V", b"1", b"2", b"5", b"7"]),
        st.integers(0, 1 << 40).map(lambda n: b"%011o\0" % n),
        st.integers(0, (1 << 88) - 1).map(lambda n: b"\x80" + n.to_bytes(11, "big")),
        st.integers(0, (1 << 56) - 1).map(lambda n: b"\xff" + n.to_bytes(7, "big")),
    )),
    # a PAX record put at the start of an extended header's data; size and checksum fixed
    st.tuples(st.just("pax"), positions, st.sampled_from([
        b"size", b"path", b"linkpath", b"mtime", b"GNU.sparse.map", b"GNU.sparse.major", b"GNU.sparse.name",
        b"GNU.sparse.offset", b"GNU.volume.offset", b"hdrcharset"]), st.one_of(
            st.binary(max_size=40), st.integers(0, 1 << 70).map(lambda n: b"%d" % n), st.just(b"9" * 5000))),
)


def mutate(data: bytes, headers: list[int], plan) -> bytes:
    out = bytearray(data)
    for op, pos, *args in plan:
        if not out:
            break
        # Half the edits land in a header, where they matter most.
        at = headers[pos % len(headers)] + (pos >> 20) % 512 if headers and pos & 1 else pos % len(out)
        at = min(at, len(out) - 1)
        if op == "flip":
            out[at] ^= args[0]
        elif op == "overwrite":
            out[at : at + len(args[0])] = args[0]
        elif op == "insert":
            out[at:at] = args[0]
        elif op == "delete":
            del out[at : at + args[0]]
        elif op == "truncate":
            del out[at:]
        elif headers:
            start = headers[pos % len(headers)]
            if start + 512 > len(out):
                continue
            if op == "field":
                (field, width), value = args
                out[start + field : start + field + width] = value[:width].ljust(width, b"\0")
            else:  # a new extended header with one record, just before this header
                key, value = args
                record = _pax_record(key, value)
                extended = bytearray(out[start : start + 512])
                extended[0:100] = b"PaxHeader".ljust(100, b"\0")
                extended[124:136] = b"%011o\0" % len(record)
                extended[156:157] = b"x"
                _fix_checksum(extended, 0)
                out[start:start] = extended + record.ljust((len(record) + 511) // 512 * 512, b"\0")
                continue
            _fix_checksum(out, start)
    return bytes(out)


def scan_checked(data: bytes):
    """Scan; no exception, bounded memory, every served range inside the archive.

    Tracing already on (a fuzzing process keeps it on) is left on: started and stopped for each
    input, tracemalloc leaks ~5-8 KB an input in CPython 3.11, which ended tar_scan's fuzzing
    pieces at their 2 GB bound."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        result = TAR.scan(MemorySource(data))
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        if started:
            tracemalloc.stop()
    assert peak < MEMORY_BOUND, f"scan allocated {peak} bytes"
    assert result.error is None or re.search(r"at offset \d+", result.error), result.error  # where it stopped
    for rec in result.members:
        if rec.kind == Kind.FILE:
            stored = rec.size if rec.sparse is None else int(rec.sparse[:, 1].sum())
            assert 0 < rec.offset and rec.offset + stored <= len(data)
            if rec.sparse is None:
                assert rec.small is None or rec.small == data[rec.offset : rec.offset + rec.size]
            else:  # runs in order, inside the real size (sparse.runs checks them; here checked again)
                ends = rec.sparse[:, 0] + rec.sparse[:, 1]
                assert (rec.sparse >= 0).all() and (ends[:-1] <= rec.sparse[1:, 0]).all()
                assert ends.max(initial=0) <= rec.size
    return result


def tarfile_regulars(data: bytes) -> list[tarfile.TarInfo]:
    """The regular members Python's tarfile reads from the archive, up to where it gives up."""
    found = []
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
            found.extend(info for info in tf if info.isreg())
    except Exception:  # noqa: BLE001 - tarfile gives up on this damage (its own way): compare what it read
        pass
    return found


def agrees_with_tarfile(data: bytes, result) -> int:
    """Where tarfile reads a regular member at the same data offset, the served size matches and
    so does the sparse map, if any (so do the bytes). Returns how many members were compared."""
    served = {rec.offset: rec for rec in result.members if rec.kind == Kind.FILE}
    compared = 0
    for info in tarfile_regulars(data):
        rec = served.get(info.offset_data)
        if rec is not None:
            runs = None if rec.sparse is None else [tuple(run) for run in rec.sparse.tolist()]
            # (runs past the real size are cut by tar -x and tarfile alike: the file is that size)
            theirs = None if info.sparse is None else \
                [(o, min(n, info.size - o)) for o, n in info.sparse if n and o < info.size]
            assert runs == theirs, f"{info.name}: tarfile reads another sparse map"
            assert rec.size == info.size, f"{info.name}: tarfile reads another size"
            compared += 1
    return compared


def _fuzz(seeds, pick, plan):
    _, data, headers = seeds[pick % len(seeds)]
    mutated = mutate(data, headers, plan)
    agrees_with_tarfile(mutated, scan_checked(mutated))


def test_an_old_gnu_sparse_member_with_pax_sparse_records_is_left_out(seeds):
    # found by the fuzzer: a PAX header's sparse map before a GNU 'S' member, whose own map says
    # otherwise (tarfile takes the PAX one, GNU tar the header's)
    _, data, headers = seeds[0]
    mutated = mutate(data, headers, [("pax", 674, b"GNU.sparse.map", b"0")])
    result = scan_checked(mutated)
    assert [w for w in result.warnings if "old GNU map and PAX sparse records" in w] == [
        "member ./sparse/holes.bin: sparse file with both an old GNU map and PAX sparse records (readers differ) "
        "not served"]
    assert b"./sparse/holes.bin" not in [rec.path for rec in result.members]
    assert agrees_with_tarfile(mutated, result) > 0


@settings(max_examples=2500, **FUZZ)
@given(pick=st.integers(0, 1000), plan=st.lists(edits, min_size=1, max_size=4))
def test_mutated_writer_archives(seeds, pick, plan):
    _fuzz(seeds, pick, plan)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # ten times the default run's cases, with longer edit lists
@settings(max_examples=25_000, **FUZZ)
@given(pick=st.integers(0, 1000), plan=st.lists(edits, min_size=1, max_size=8))
def test_mutated_writer_archives_long_run(seeds, pick, plan):
    _fuzz(seeds, pick, plan)


def test_unmutated_seeds_agree_with_tarfile(seeds):
    """The seeds themselves: every regular member tarfile finds (sparse ones too) is served at its offset
    (tarfile knows no GNU volumes: their seeds are only checked for agreement)."""
    compared = 0
    for name, data, _ in seeds:
        result = scan_checked(data)
        assert result.error is None or "multivolume" in name, f"{name}: {result.error}"
        compared += agrees_with_tarfile(data, result)
        if "multivolume" not in name:
            served = {rec.offset for rec in result.members if rec.kind == Kind.FILE}
            missed = [i.name for i in tarfile_regulars(data) if i.offset_data not in served]
            assert not missed, f"{name}: tarfile reads {missed}, the scanner does not serve them"
    assert compared > 100


def _claim_beyond_the_archive(data: bytes, result) -> int:
    """The offset a "truncated at offset N" error names (it must lie beyond the archive)."""
    match = re.fullmatch(r"truncated at offset (\d+): no end-of-archive marker", result.error or "")
    assert match, result.error
    assert int(match.group(1)) > len(data)
    return int(match.group(1))


@pytest.mark.parametrize("plan, outcome", [
    ([("pax", 0, b"size", b"9" * 30)], "truncated"),  # the first member claims 10^30 bytes
    ([("pax", 0, b"size", b"9" * 4000)], "truncated"),
    ([("pax", 0, b"path", b"p" * 900_000)], "long path"),
    ([("pax", 0, b"GNU.sparse.map", b"0," * 300_000)], "ignored"),  # a map for a member that is not sparse
    ([("field", 0, (124, 12), b"\x80" + (1 << 80).to_bytes(11, "big"))], "2^80"),  # base-256: 2^80 bytes of data
    ([("field", 0, (156, 1), b"L"), ("field", 0, (124, 12), b"%011o\0" % (8**11 - 1))], "refused"),  # an 8 GiB name
])
def test_huge_claims_do_not_allocate(seeds, plan, outcome):
    """Memory stays bounded (scan_checked), and each claim has the one outcome it should."""
    _, data, headers = seeds[0]
    assert headers[0] == 0
    whole = [rec.path for rec in TAR.scan(MemorySource(data)).members]
    mutated = mutate(data, headers, plan)
    result = scan_checked(mutated)
    paths = [rec.path for rec in result.members]
    if outcome == "truncated":  # the first member is served; its data would end past the archive
        _claim_beyond_the_archive(mutated, result)
        assert paths == whole[:1]
    elif outcome == "2^80":
        assert _claim_beyond_the_archive(mutated, result) == 512 + (1 << 80)
        assert paths == whole[:1]
    elif outcome == "long path":
        assert result.error is None and paths == [b"p" * 900_000, *whole[1:]]
    elif outcome == "ignored":
        assert result.error is None and paths == whole
    else:
        assert result.error == f"extended header of {8**11 - 1} bytes at offset 0" and paths == []
