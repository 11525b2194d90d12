"""Zip shards: archives written by the real tools (Info-ZIP zip, 7-Zip, Python's zipfile), mounted
for real and compared file by file with what `unzip` extracts (sha256, mode, mtime, symlink
targets, folders); damaged ones refused with one line while the rest serve."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import stat
import struct
import subprocess
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import needs_fuse, shardfs_cmd
from shardfs.formats import zip as zipformat
from shardfs.formats.base import ShardFormatError
from shardfs.index import shard_index
from shardfs.storage import open_shard

needs_tools = pytest.mark.skipif(not all(shutil.which(t) for t in ("zip", "unzip", "7z")),
                                 reason="needs zip, unzip and 7z (tools/setup.sh installs them)")
MTIME = 1_600_000_000  # an even second: DOS times have 2-second steps


def make_tree(root: Path) -> Path:
    """Folders, incompressible and compressible files, an empty file and folder, modes, a symlink,
    a UTF-8 name; fixed mtimes."""
    rng = __import__("random").Random(7)
    (root / "img" / "cat").mkdir(parents=True)
    (root / "img" / "dog").mkdir(parents=True)
    (root / "empty").mkdir()
    for i in range(6):
        (root / "img" / ("cat" if i % 2 else "dog") / f"{i}.jpg").write_bytes(rng.randbytes(rng.randint(100, 60_000)))
    (root / "notes.txt").write_text("compressible text\n" * 2000)
    (root / "big.bin").write_bytes(rng.randbytes(300_000) + b"\0" * 300_000)
    (root / "zero").write_bytes(b"")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(root / "run.sh", 0o755)
    os.chmod(root / "notes.txt", 0o600)
    (root / "caf\u00e9.txt").write_text("utf-8 name\n")
    os.symlink("img/cat/1.jpg", root / "link")
    for path in [*sorted(root.rglob("*"), reverse=True), root]:
        os.utime(path, (MTIME, MTIME), follow_symlinks=False)
    return root


def entries(root: Path, times: bool = True) -> dict[str, tuple]:
    """Relative path -> (kind, sha256 or target, mode, mtime) for everything under ``root``."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            st = os.lstat(full)
            mode, mtime = stat.S_IMODE(st.st_mode), int(st.st_mtime) if times else None
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("symlink", os.readlink(full), None, None)  # unzip sets no mode or time on links
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = ("dir", None, mode, mtime)
            else:
                with open(full, "rb") as f:
                    found[rel] = ("file", hashlib.sha256(f.read()).hexdigest(), mode, mtime)
    return found


def _run(*cmd: str, cwd: Path | None = None) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, f"{cmd}: {done.stdout}\n{done.stderr}"


def _zipfile(compression: int, **kwargs):
    def write(src: Path, out: Path, top: str) -> None:
        with zipfile.ZipFile(out, "w", compression, **kwargs) as z:
            for path in sorted(src.rglob("*")):
                name = f"{top}/{path.relative_to(src)}"
                if path.is_symlink():
                    info = zipfile.ZipInfo(name, (2020, 9, 13, 12, 26, 40))
                    info.external_attr = (stat.S_IFLNK | 0o777) << 16
                    z.writestr(info, os.readlink(path))
                else:
                    z.write(path, name)
    return write


def _zipfile_forced_zip64(src: Path, out: Path, top: str) -> None:
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(src.rglob("*")):
            if path.is_file() and not path.is_symlink():
                info = zipfile.ZipInfo.from_file(path, f"{top}/{path.relative_to(src)}")
                info.compress_type = zipfile.ZIP_DEFLATED
                with z.open(info, "w", force_zip64=True) as f:
                    f.write(path.read_bytes())


class _Unseekable(io.RawIOBase):
    """A pipe as zipfile sees it: it writes data descriptors."""

    def __init__(self, f):
        self._f = f

    def writable(self):
        return True

    def write(self, b):
        return self._f.write(b)

    def flush(self):
        self._f.flush()


def _zipfile_streamed(src: Path, out: Path, top: str) -> None:
    with open(out, "wb") as raw, zipfile.ZipFile(_Unseekable(raw), "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(src.rglob("*")):
            if path.is_file() and not path.is_symlink():
                info = zipfile.ZipInfo.from_file(path, f"{top}/{path.relative_to(src)}")
                info.compress_type = zipfile.ZIP_DEFLATED
                with z.open(info, "w") as f:
                    f.write(path.read_bytes())


def _infozip(*options: str):
    def write(src: Path, out: Path, top: str) -> None:
        _run("zip", "-q", "-r", "-y", *options, str(out), top, cwd=src.parent)
    return write


def _7zip(method: str):
    def write(src: Path, out: Path, top: str) -> None:
        _run("7z", "a", "-tzip", f"-mm={method}", "-bd", str(out), top, cwd=src.parent)
    return write


WRITERS = {
    "infozip-deflate": _infozip(),
    "infozip-stored": _infozip("-0"),
    "infozip-zip64": _infozip("-fz"),
    "infozip-bzip2": _infozip("-Z", "bzip2"),
    "7zip-deflate": _7zip("Deflate"),
    "7zip-stored": _7zip("Copy"),
    "7zip-bzip2": _7zip("BZip2"),
    "7zip-lzma": _7zip("LZMA"),
    "7zip-deflate64": _7zip("Deflate64"),
    "zipfile-stored": _zipfile(zipfile.ZIP_STORED),
    "zipfile-deflate": _zipfile(zipfile.ZIP_DEFLATED),
    "zipfile-bzip2": _zipfile(zipfile.ZIP_BZIP2),
    "zipfile-lzma": _zipfile(zipfile.ZIP_LZMA),
    "zipfile-zip64": _zipfile_forced_zip64,
    "zipfile-streamed": _zipfile_streamed,
}
BEYOND_UNZIP = ("7zip-lzma", "7zip-deflate64", "zipfile-lzma")


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    """Every writer's zip of the tree, each under a top folder named after the writer, in one
    directory; and what unzip extracts from each, in another."""
    if not all(shutil.which(t) for t in ("zip", "unzip", "7z")):
        pytest.skip("needs zip, unzip and 7z")
    base = tmp_path_factory.mktemp("zips")
    shards, reference = base / "shards", base / "reference"
    shards.mkdir()
    reference.mkdir()
    for name, write in WRITERS.items():
        src = make_tree(base / "trees" / name)
        write(src, shards / f"{name}.zip", name)
        if name in BEYOND_UNZIP:  # unzip 6.0 has no LZMA or Deflate64: 7-Zip extracts those
            _run("7z", "x", "-bd", "-y", f"-o{reference}", str(shards / f"{name}.zip"))
        else:
            _run("unzip", "-q", "-o", str(shards / f"{name}.zip"), "-d", str(reference))
    return shards, reference


@needs_tools
@needs_fuse
def test_mounted_zips_equal_unzip(archives, mount):
    shards, reference = archives
    m = mount(shards)
    expected, served = entries(reference), entries(Path(m.path))
    assert len(expected) > 100
    for rel, want in expected.items():
        writer = rel.split("/")[0]
        if writer == "7zip-deflate64" and "deflate64" not in zipformat.METHODS:
            continue
        got = served.get(rel)
        if want[0] == "dir" and not writer.startswith(("infozip", "7zip")):
            got, want = got and got[:2], want[:2]  # zipfile wrote no entry for some folders: unzip made them now
        assert got == want, f"{rel}: served {got}, unzip made {want}"
    assert set(served) == set(expected), set(served) ^ set(expected)
    log = m.log()
    assert "left out" not in log and "refused" not in log, log


@needs_tools
def test_each_writer_uses_what_it_is_meant_to(archives):
    """The archives hold what their names say (so the comparison above covers each feature)."""
    shards, _ = archives

    def infos(name):
        with zipfile.ZipFile(shards / f"{name}.zip") as z:
            return z.infolist()

    assert {i.compress_type for i in infos("infozip-deflate")} >= {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED}
    assert zipfile.ZIP_LZMA in {i.compress_type for i in infos("7zip-lzma")}
    assert 9 in {i.compress_type for i in infos("7zip-deflate64")}
    assert zipfile.ZIP_BZIP2 in {i.compress_type for i in infos("infozip-bzip2")}
    assert all(i.flag_bits & 0x08 for i in infos("zipfile-streamed"))
    data = (shards / "infozip-zip64.zip").read_bytes()
    assert data.count(b"PK\x06\x06") == 1 and b"PK\x06\x07" in data  # zip64 end records
    data = (shards / "zipfile-zip64.zip").read_bytes()
    assert b"\xff\xff\xff\xff\xff\xff\xff\xff" in data  # zip64 local headers
    assert any(i.create_system == 3 and (i.external_attr >> 16) & 0o170000 == stat.S_IFLNK
               for i in infos("infozip-deflate"))


@needs_tools
@needs_fuse
def test_zips_and_tars_in_one_tree(archives, mount, tmp_path):
    shards, reference = archives
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    os.link(shards / "infozip-deflate.zip", mixed / "a.zip")
    tree = make_tree(tmp_path / "tartree" / "fromtar")
    _run("tar", "-cf", str(mixed / "b.tar"), "fromtar", cwd=tree.parent)
    m = mount(mixed)
    served = entries(Path(m.path))
    assert served["fromtar/notes.txt"][:2] == entries(tree)["notes.txt"][:2]
    assert served["infozip-deflate/notes.txt"] == entries(reference)["infozip-deflate/notes.txt"]


@needs_tools
@needs_fuse
def test_dos_times_in_local_time_as_unzip(tmp_path, mount, monkeypatch):
    """Without an extended timestamp (zipfile writes none) the DOS time is local time: the daemon
    and unzip both read it with the TZ they run under."""
    monkeypatch.setenv("TZ", "Asia/Kolkata")  # +05:30, no DST: any hour-based mistake shows
    src = make_tree(tmp_path / "tree" / "t")
    shards = tmp_path / "shards"
    shards.mkdir()
    _zipfile(zipfile.ZIP_DEFLATED)(src, shards / "t.zip", "t")
    _run("unzip", "-q", str(shards / "t.zip"), "-d", str(tmp_path / "ref"))
    expected = entries(tmp_path / "ref")
    assert expected["t/notes.txt"][3] != MTIME  # zipfile wrote the DOS time in our TZ, unzip read it in Kolkata's
    m = mount(shards)
    served = entries(Path(m.path))
    assert {k: v for k, v in served.items() if v[0] == "file"} == {k: v for k, v in expected.items() if v[0] == "file"}


@needs_tools
def test_ls_and_verify(archives):
    shards, _ = archives
    path = shards / "infozip-deflate.zip"
    done = shardfs_cmd("ls", "-R", "-l", str(path))
    assert done.returncode == 0, done.stderr
    assert "notes.txt" in done.stdout and "run.sh" in done.stdout and "-rwxr-xr-x" in done.stdout
    done = shardfs_cmd("verify", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


def test_verify_checks_every_members_crc(tmp_path):
    """Stored members are served as they lie; verify reads them all and checks their CRC-32."""
    path = _good(tmp_path, method=zipfile.ZIP_STORED)
    data = bytearray(path.read_bytes())
    at = data.find(b"member 2 ")
    data[at] ^= 1
    path.write_bytes(data)
    done = shardfs_cmd("verify", str(path))
    assert done.returncode != 0 and "f2.txt: CRC-32 mismatch" in done.stdout + done.stderr, done.stdout
    assert "f1.txt" not in done.stdout + done.stderr


def test_over_65535_members(tmp_path):
    """zipfile writes zip64 end records for this many; every member is indexed and served."""
    path = tmp_path / "many.zip"
    with zipfile.ZipFile(path, "w") as z:
        for i in range(70_000):
            z.writestr(f"d{i % 7}/{i}.txt", str(i))
    assert b"PK\x06\x06" in path.read_bytes()[-200:]
    with opened(path) as shard:
        ix = shard_index.build(shard)
        assert len(ix) == 70_000 and not ix.error and not ix.warnings
        for i in (0, 65_535, 69_999):
            name = ix.name(i)
            assert shard.pread(int(ix.offset[i]), int(ix.size[i])) == name.split(b"/")[1][:-4]


# --------------------------------------------------------------------------- names


def test_cp437_and_utf8_names(tmp_path):
    """No UTF-8 flag: CP437 from a DOS host (as unzip and zipfile read it); the flag: UTF-8."""
    path = tmp_path / "names.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("caf\u00e9-utf8.txt", b"a")  # zipfile sets the UTF-8 flag for this one
    # a second archive by hand: one entry named with CP437 byte 0x82 (é), made by MS-DOS, no flag
    (tmp_path / "dos.zip").write_bytes(hand_made(b"caf\x82.txt", b"b", b"b", 0, made_by=20))
    names = {n.decode() for p in (path, tmp_path / "dos.zip") for n in _names(p)}
    assert names == {"caf\u00e9-utf8.txt", "caf\u00e9.txt"}
    with zipfile.ZipFile(tmp_path / "dos.zip") as z:
        assert z.namelist() == ["caf\u00e9.txt"]


def hand_made(name: bytes, data: bytes, stored: bytes, method: int, made_by: int = 0x314) -> bytes:
    """A zip of one member written by hand: ``stored`` is ``data`` as ``method`` compresses it."""
    crc = zipfile.crc32(data)
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0x21, crc, len(stored), len(data), len(name), 0)
    central = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, made_by, 20, 0, method, 0, 0x21, crc, len(stored),
                          len(data), len(name), 0, 0, 0, 0, 0o100644 << 16 if made_by >> 8 == 3 else 0, 0)
    body, cd = local + name + stored, central + name
    return body + cd + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(cd), len(body), 0)


def test_zstd_member(tmp_path):
    import zstandard  # (a dependency of shardfs: formats/compressed.py, squashfs)
    data = b"zstd member " * 1000
    path = tmp_path / "zstd.zip"
    path.write_bytes(hand_made(b"z.txt", data, zstandard.ZstdCompressor().compress(data), zipformat.ZSTD))
    with opened(path) as shard:
        (member,) = zipformat.FORMAT.scan(shard).members
        assert zipformat.FORMAT.open_layout(shard, shard.size).read(member.offset, member.size, shard.pread) == data


def _names(path: Path) -> list[bytes]:
    ix = shard_index.build(str(path))
    assert not ix.error, ix.error
    return [ix.name(i) for i in range(len(ix))]


def test_names_that_climb_go_through_the_shared_rules(tmp_path):
    path = tmp_path / "climb.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("ok/a.txt", b"a")
        z.writestr("../evil.txt", b"b")
        z.writestr("/abs.txt", b"c")
    ix = shard_index.build(str(path))
    got = {ix.name(i) for i in range(len(ix))}
    assert b"ok/a.txt" in got and b"abs.txt" in got
    assert not any(b".." in n for n in got)
    assert any("evil" in w for w in ix.warnings)


# --------------------------------------------------------------------------- damaged input


def _good(tmp_path: Path, name: str = "good.zip", method=zipfile.ZIP_DEFLATED) -> Path:
    path = tmp_path / name
    with zipfile.ZipFile(path, "w", method) as z:
        for i in range(5):
            z.writestr(f"f{i}.txt", (f"member {i} " * 500).encode())
    return path


@contextlib.contextmanager
def opened(path: Path):
    shard = open_shard(str(path))
    try:
        yield shard
    finally:
        shard.close()


def _scan(path: Path):
    with opened(path) as shard:
        return zipformat.FORMAT.scan(shard)


class _Recording:
    """A zip's bytes as a ByteSource that records each read (offset, length)."""

    window = 1 << 20

    def __init__(self, data: bytes):
        self.data, self.size, self.reads = data, len(data), []

    def pread(self, offset: int, length: int) -> bytes:
        self.reads.append((offset, length))
        return self.data[offset : offset + length]


def _spaced_zip(path: Path, count: int, size: int) -> bytes:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for i in range(count):
            z.writestr(f"c/{i:05d}.jpg", os.urandom(16) * (size // 16))
    return path.read_bytes()


def test_local_headers_of_jpeg_sized_members_are_read_front_to_back_once(tmp_path):
    """Members of 100 KB (a zip of JPEGs): the local headers are read with the data between them, in
    a few large reads front to back that follow one another (the build's reads fill the caches as
    a tar's do), not a read each (a seek each on a disk, a request each on remote storage)."""
    data = _spaced_zip(tmp_path / "jpegs.zip", 200, 100_000)
    src = _Recording(data)
    result = zipformat.FORMAT.scan(src)
    assert not result.error and len(result.members) == 200
    directory_at = struct.unpack_from("<I", data, len(data) - 22 + 16)[0]
    tail_at = len(data) - 22 - 0xFFFF  # where the end record is looked for
    before = sorted(r for r in src.reads if r[0] < directory_at and r[0] != tail_at)  # (not the end, the directory)
    assert not [r for r in before if r[1] < 70_000], f"headers read one by one: {before[:5]}"
    spans = before
    assert len(spans) <= len(data) // (4 << 20) + 2
    assert spans[0][0] == 0 and all(a[0] + a[1] == b[0] for a, b in zip(spans, spans[1:])), spans
    assert spans[-1][0] + spans[-1][1] >= data.rfind(b"PK\x03\x04")


def test_local_headers_of_members_far_apart_are_read_alone(tmp_path):
    """Members of 3 MB: each local header is read alone; the data between them is not read."""
    data = _spaced_zip(tmp_path / "big.zip", 6, 3 << 20)
    src = _Recording(data)
    result = zipformat.FORMAT.scan(src)
    assert not result.error and len(result.members) == 6
    assert sum(n for _, n in src.reads) < 1 << 20, src.reads


def test_first_read_of_a_compressed_member_reads_its_own_header_only(tmp_path):
    """A deflated member's first read takes the central directory and its own local header, not
    every member's (that would be a read of the whole zip before the first file is served)."""
    path = tmp_path / "deflated.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for i in range(50):
            z.writestr(f"c/{i:03d}.bin", os.urandom(64_000))  # (stays its size: deflate finds nothing)
    data = path.read_bytes()
    src = _Recording(data)
    result = zipformat.FORMAT.scan(src)
    member = next(m for m in result.members if m.path == b"c/017.bin")
    with zipfile.ZipFile(path) as z:
        want = z.read("c/017.bin")
    layout = zipformat.ZipLayout(src)
    src.reads.clear()
    assert bytes(layout.read(member.offset, member.size, src.pread)) == want
    assert sum(n for _, n in src.reads) < 2 * member.size + (64 << 10), src.reads


def test_the_layout_keeps_eight_bytes_per_entry_after_compressed_reads(tmp_path):
    """Reading compressed members keeps where each central entry lies, no more (the daemon's memory
    per member at 4,000,000 members); each member's fields are read again at its first read."""
    path = tmp_path / "many.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for i in range(2000):
            z.writestr(f"c{i // 100}/{i:04d}.txt", b"member %d\n" % i * 3)
    src = _Recording(path.read_bytes())
    members = zipformat.FORMAT.scan(src).members
    layout = zipformat.ZipLayout(src)
    with zipfile.ZipFile(path) as z:
        for m in members[::97]:
            assert bytes(layout.read(m.offset, m.size, src.pread)) == z.read(m.path.decode())
    assert layout._table.at.nbytes <= 8 * len(members)


def test_a_streamed_member_is_checked_once_not_at_each_read(tmp_path):
    """A deflated member over zipread.WHOLE_MAX is streamed request after request: its bytes are
    zipfile's, and its central entry is read at its first read only (not again for each request)."""
    from shardfs.formats.zipread import WHOLE_MAX

    path = tmp_path / "large.zip"
    payload = os.urandom(WHOLE_MAX + (1 << 20))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("big.bin", payload)
    data = path.read_bytes()
    directory_at = struct.unpack_from("<I", data, len(data) - 22 + 16)[0]
    src = _Recording(data)
    member = next(m for m in zipformat.FORMAT.scan(src).members if m.path == b"big.bin")
    layout = zipformat.ZipLayout(src)
    src.reads.clear()
    got = b"".join(bytes(layout.read(member.offset + at, 1 << 20, src.pread)) for at in range(0, len(payload), 1 << 20))
    assert got == payload
    assert len([r for r in src.reads if r[0] >= directory_at]) <= 3, src.reads[:5]  # the directory, the entry


def test_truncated_and_cut_off_directory(tmp_path):
    data = _good(tmp_path).read_bytes()
    for cut in (len(data) - 10, len(data) - 40, len(data) // 2, 10):
        bad = tmp_path / f"cut{cut}.zip"
        bad.write_bytes(data[:cut])
        result = _scan(bad)
        assert result.error and not result.members, cut


def test_offsets_past_the_end_and_bad_local_headers(tmp_path):
    path = _good(tmp_path, method=zipfile.ZIP_STORED)
    data = bytearray(path.read_bytes())
    cd = data.rfind(b"PK\x01\x02", 0, data.rfind(b"PK\x05\x06"))  # the last entry
    struct.pack_into("<I", data, cd + 42, len(data) + 100)  # its local header past the end
    first = data.find(b"PK\x03\x04")
    data[first + 30] ^= 0x20  # the first local header's name changed (f0.txt -> F0.txt)
    path.write_bytes(data)
    result = _scan(path)
    assert not result.error
    names = [m.path for m in result.members]
    assert names == [b"f1.txt", b"f2.txt", b"f3.txt"]
    assert len([w for w in result.warnings if "left out" in w]) == 2, result.warnings


def test_overlapping_members_are_refused(tmp_path):
    """Two entries sharing one local header's data (a zip bomb's trick): the archive is refused."""
    path = _good(tmp_path, method=zipfile.ZIP_STORED)
    data = bytearray(path.read_bytes())
    eocd = data.rfind(b"PK\x05\x06")
    entries_at = [i for i in range(len(data)) if data[i:i + 4] == b"PK\x01\x02"]
    # entry 1 a copy of entry 0: the same local header and data, named alike (headers all agree)
    data[entries_at[1] : entries_at[1] + 52] = data[entries_at[0] : entries_at[0] + 52]
    path.write_bytes(data)
    assert eocd
    result = _scan(path)
    assert result.error and "overlap" in result.error and not result.members


def test_declared_size_below_the_real_one(tmp_path):
    """A deflate member that inflates to more than its entry says: EIO (ShardFormatError), and at
    most the declared size + 1 bytes decompressed."""
    path = _good(tmp_path)
    data = bytearray(path.read_bytes())
    cd = data.find(b"PK\x01\x02")
    struct.pack_into("<I", data, cd + 24, 100)  # f0.txt: uncompressed size 100 in the central entry
    first = data.find(b"PK\x03\x04")
    struct.pack_into("<I", data, first + 22, 100)  # and in its local header
    path.write_bytes(data)
    with opened(path) as shard:
        result = zipformat.FORMAT.scan(shard)
        f0 = next(m for m in result.members if m.path == b"f0.txt")
        layout = zipformat.FORMAT.open_layout(shard, shard.size)
        with pytest.raises(ShardFormatError, match="more bytes"):
            layout.read(f0.offset, f0.size, shard.pread)
        f1 = next(m for m in result.members if m.path == b"f1.txt")
        assert layout.read(f1.offset, f1.size, shard.pread) == b"member 1 " * 500


def test_crc_mismatch_is_an_error(tmp_path):
    path = _good(tmp_path)
    data = bytearray(path.read_bytes())
    for at in (data.find(b"PK\x01\x02"), data.find(b"PK\x03\x04")):
        struct.pack_into("<I", data, at + (16 if data[at + 2] == 1 else 14), 12345)
    path.write_bytes(data)
    with opened(path) as shard:
        f0 = next(m for m in zipformat.FORMAT.scan(shard).members if m.path == b"f0.txt")
        with pytest.raises(ShardFormatError, match="CRC"):
            zipformat.FORMAT.open_layout(shard, shard.size).read(f0.offset, 10, shard.pread)


def test_encrypted_and_unknown_methods_left_out_with_one_line(tmp_path):
    path = _good(tmp_path, method=zipfile.ZIP_STORED)
    data = bytearray(path.read_bytes())
    entries_at = [i for i in range(len(data)) if data[i:i + 4] == b"PK\x01\x02"]
    for e in entries_at[:2]:
        struct.pack_into("<H", data, e + 8, 1)  # encrypted
    struct.pack_into("<H", data, entries_at[2] + 10, 98)  # PPMd
    struct.pack_into("<H", data, entries_at[3] + 10, 98)
    path.write_bytes(data)
    result = _scan(path)
    assert [m.path for m in result.members] == [b"f4.txt"]
    assert len(result.warnings) == 2, result.warnings


@needs_fuse
def test_damaged_zip_beside_good_shards(tmp_path, mount):
    src = tmp_path / "src"
    src.mkdir()
    good = _good(src, "good.zip")
    bad = src / "bad.zip"
    bad.write_bytes(good.read_bytes()[:-30])  # its end record cut
    other = _good(src, "other.zip", zipfile.ZIP_STORED)
    with zipfile.ZipFile(other, "a") as z:
        z.writestr("only-here.txt", b"x")
    m = mount(src)
    assert (Path(m.path) / "only-here.txt").read_bytes() == b"x"
    assert (Path(m.path) / "f3.txt").read_bytes() == b"member 3 " * 500
    assert sum("bad.zip" in line for line in m.log().splitlines()) == 1, m.log()


# --------------------------------------------------------------------------- a hypothesis-built tree


_segment = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="/\0", exclude_categories=["Cs"]),
                   min_size=1, max_size=12).filter(lambda s: s not in (".", "..") and len(s.encode()) <= 255)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.dictionaries(st.lists(_segment, min_size=1, max_size=3).map("/".join),
                             st.tuples(st.binary(max_size=3000), st.sampled_from([0, 8, 12, 14])), max_size=12))
def test_hypothesis_tree_through_zipfile(tmp_path, files):
    """Any tree zipfile writes is served with zipfile's own bytes for every member it reads back
    (names that are a file and a folder at once are what replay.py decides: left out of this)."""
    path = tmp_path / "h.zip"
    with zipfile.ZipFile(path, "w") as z:
        for name, (data, method) in files.items():
            z.writestr(name, data, compress_type=method)
    with zipfile.ZipFile(path) as z:
        expected = {i.filename.encode(): z.read(i) for i in z.infolist()}
    with opened(path) as shard:
        ix = shard_index.build(shard)
        layout = zipformat.FORMAT.open_layout(shard, shard.size)
        for i in range(len(ix)):
            if ix.kind[i] == 0:
                name = ix.name(i)
                assert layout.read(int(ix.offset[i]), int(ix.size[i]), shard.pread) == expected[name]
        served = {ix.name(i) for i in range(len(ix)) if ix.kind[i] == 0}
    clash = {n for n in expected if any(o.startswith(n + b"/") for o in expected)}
    involved = clash | {o for o in expected for n in clash if o.startswith(n + b"/")}
    assert served <= set(expected) and set(expected) - involved <= served


def test_columns_path_equals_replay(tmp_path):
    """A zip of plain members is indexed from columns (index/plain.py); the same members as records
    through index/replay.py give the same index."""
    from shardfs.index import plain, replay

    path = tmp_path / "plain.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.mkdir("top")
        for i in range(300):
            z.writestr(f"top/c{i % 7}/{i}.bin", os.urandom(i), compress_type=(zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)[i % 2])
    with opened(path) as shard:
        columns = zipformat.FORMAT.scan(shard, columns=True).columns
        assert plain.members(columns, None) is not None
        ix = shard_index.build(shard)
        records = {r.path: r for r in replay.extracted(zipformat.FORMAT.scan(shard).members, None, print)}
    assert len(ix) == len(records) == 301  # the folders c0..c6 have no entries: the tree makes them
    for i in range(len(ix)):
        r = records[ix.name(i)]
        assert (r.kind, r.offset, r.size, r.mode, r.mtime) == (ix.kind[i], ix.offset[i], ix.size[i], ix.mode[i],
                                                               ix.mtime[i])


@needs_fuse
def test_deflated_members_after_a_remount_from_the_saved_view(tmp_path, mount):
    """A remount maps the saved view (view/snapshot.py): compressed members' virtual offsets
    still reach the layout, stored ones the compiled loop."""
    src = tmp_path / "src"
    src.mkdir()
    with zipfile.ZipFile(src / "a.zip", "w") as z:
        z.writestr("deflated.txt", b"deflated " * 1000, compress_type=zipfile.ZIP_DEFLATED)
        z.writestr("stored.bin", b"stored " * 1000, compress_type=zipfile.ZIP_STORED)
    index_dir = str(tmp_path / "idx")
    for name in ("first", "again"):
        m = mount(src, options=("--index-dir", index_dir), name=name)
        assert (Path(m.path) / "deflated.txt").read_bytes() == b"deflated " * 1000
        assert (Path(m.path) / "stored.bin").read_bytes() == b"stored " * 1000
        shardfs_cmd("umount", m.path)
    assert "view mapped" in Path(m.log_file).read_text()
