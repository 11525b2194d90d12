"""Compressed tar shards (formats/ctar.py, compressed.py): archives written by the real tools (GNU
tar -z/-J/-j/--zstd, pigz, gzip, zstd, xz, bzip2; several members, frames and streams in one
file), mounted for real and compared file by file with what `tar -x` extracts from them (bytes,
modes, mtimes, symlinks, hard links, folders); a `.tar` that is gzip inside; damaged ones; the disk
tier and the RAM budget holding the decompressed tar."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import force_unmount, needs_fuse
from tar_corpus import reference_entries
from shardfs.formats import compressed, ctar
from shardfs.index import shard_index
from shardfs.storage import buffers, open_shard
from shardfs.storage.buildfill import Keeper
from shardfs.storage.ram import ShardCache
from shardfs.view import dataset

TOOLS = ("tar", "gzip", "pigz", "zstd", "xz", "bzip2")
pytestmark = pytest.mark.skipif(any(shutil.which(t) is None for t in TOOLS),
                                reason=f"needs {', '.join(TOOLS)} (tools/setup.sh installs them)")
MTIME = 1_650_000_000


def make_tree(root, name: str) -> None:
    """Under root/name: files of several sizes (random, text, zeros, empty), modes, mtimes,
    folders (one empty), a symlink, a hard link."""
    top = root / name
    (top / "sub" / "deeper").mkdir(parents=True)
    (top / "empty-dir").mkdir()
    seed = hashlib.sha256(name.encode()).digest()
    files = {
        "random.bin": b"".join(hashlib.sha256(seed + i.to_bytes(4, "little")).digest() for i in range(9000)),
        "text.txt": b"".join(b"line %d of %s\n" % (i, name.encode()) for i in range(4000)),
        "zeros.bin": bytes(1 << 20),
        "empty": b"",
        "sub/small.cls": b"7",
        "sub/deeper/exec.sh": b"#!/bin/sh\necho hi\n",
    }
    for rel, data in files.items():
        (top / rel).write_bytes(data)
    os.chmod(top / "sub/deeper/exec.sh", 0o755)
    os.chmod(top / "text.txt", 0o600)
    os.symlink("sub/small.cls", top / "link")
    os.link(top / "random.bin", top / "sub/hard.bin")
    for i, (dirpath, dirs, names) in enumerate(os.walk(top, topdown=False)):
        for n in names:
            os.utime(os.path.join(dirpath, n), (MTIME, MTIME + i), follow_symlinks=False)
        os.utime(dirpath, (MTIME, MTIME - 1000 + i))


def _run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def _pieces_with(tool: list[str], data: bytes, parts: int = 3) -> bytes:
    """``data`` cut in ``parts``, each compressed alone by ``tool``, back to back: several gzip
    members, zstd frames, xz or bzip2 streams making one stream."""
    step = -(-len(data) // parts)
    return b"".join(_run(tool, input=data[i : i + step], stdout=subprocess.PIPE).stdout
                    for i in range(0, len(data), step))


# name -> (file name, how the file is written from the folder's plain tar)
WRITERS = {
    "gz": ("gz.tar.gz", lambda root, n, out: _run(["tar", "-C", root, "-czf", out, n])),
    "pigz": ("pigz.tgz", lambda root, n, out: _run(f"tar -C {root} -cf - {n} | pigz -p 2 > {out}", shell=True)),
    "gzmembers": ("gzmembers.tar.gz", None, ["gzip", "-c"]),
    "zst": ("zst.tar.zst", lambda root, n, out: _run(["tar", "-C", root, "--zstd", "-cf", out, n])),
    "zstframes": ("zstframes.tar.zst", None, ["zstd", "-q", "-c"]),
    "xz": ("xz.tar.xz", lambda root, n, out: _run(["tar", "-C", root, "-cJf", out, n])),
    "xzstreams": ("xzstreams.txz", None, ["xz", "-c"]),
    "bz2": ("bz2.tar.bz2", lambda root, n, out: _run(["tar", "-C", root, "-cjf", out, n])),
    "bz2streams": ("bz2streams.tar.bz2", None, ["bzip2", "-c"]),
    "gzinside": ("gzinside.tar", lambda root, n, out: _run(["tar", "-C", root, "-czf", out, n])),
    "plain": ("plain.tar", lambda root, n, out: _run(["tar", "-C", root, "-cf", out, n])),
}


def write(root, name: str, out_dir) -> str:
    file_name, how, *tool = WRITERS[name]
    out = str(out_dir / file_name)
    if how is None:
        plain = _run(["tar", "-C", str(root), "-cf", "-", name], stdout=subprocess.PIPE).stdout
        with open(out, "wb") as f:
            f.write(_pieces_with(tool[0], plain))
    else:
        how(str(root), name, out)
    return out


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    """Every writer's archive of its own folder, in one source directory; the reference: what
    `tar -x` extracts from each (it detects the compression itself)."""
    base = tmp_path_factory.mktemp("ctar")
    tree, src, ref = base / "tree", base / "src", base / "reference"
    for d in (tree, src, ref):
        d.mkdir()
    paths = {}
    for name in WRITERS:
        make_tree(tree, name)
        paths[name] = write(tree, name, src)
        _run(["tar", "-x", "-f", paths[name], "-C", str(ref)])
    return src, ref, paths


def entries(root) -> dict:
    """Relative path -> (kind, sha256 or link target, permission bits, mtime) of each entry (hard
    links: each name's bytes)."""
    return reference_entries(root, attrs=True)


def read_all(root: str) -> int:
    count = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                f.read()
            count += 1
    return count


DECOMPRESS = {"gzip": "gzip", "zstd": "zstd", "xz": "xz", "bzip2": "bzip2"}


# ---- the streams, without a mount --------------------------------------------------------


@pytest.mark.parametrize("name", [n for n in WRITERS if n != "plain"])
def test_each_writer_decompresses_to_the_tar_tarfile_reads(archives, name):
    """The stream equals the codec's own tool's output; the index's members equal tarfile's reading of it."""
    src, _, paths = archives
    data = open(paths[name], "rb").read()
    stream = compressed.Stream(compressed.codec_of(data[:8]), lambda o, n: data[o : o + n], len(data))
    out = bytearray()
    while chunk := stream.read(1 << 16):
        out += chunk
    codec = compressed.codec_of(data[:8]).name
    reference = _run([DECOMPRESS[codec], "-dc", paths[name]], stdout=subprocess.PIPE).stdout
    assert out == reference
    with tarfile.open(fileobj=io.BytesIO(reference), mode="r:") as tar:
        want = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile() or m.islnk()}
    ix = shard_index.build(paths[name])
    assert ix.format == "ctar" and ix.error is None and ix.logical_size == len(out)
    assert ix.shard_size == os.path.getsize(paths[name])
    got = {ix.name(i).decode(): bytes(out[ix.offset[i] : ix.offset[i] + ix.size[i]])
           for i in range(len(ix)) if ix.kind[i] == 0}
    assert got == want


def test_several_members_frames_and_streams_are_one_stream(archives):
    _, _, paths = archives
    for name, magic in (("gzmembers", b"\x1f\x8b\x08"), ("zstframes", b"\x28\xb5\x2f\xfd"), ("xzstreams", b"\xfd7zXZ"),
                        ("bz2streams", b"BZh9")):
        assert open(paths[name], "rb").read().count(magic) >= 3, name


@pytest.mark.parametrize("name", ["gz", "zst", "xz", "bz2"])
def test_a_damaged_stream_is_refused_whole(archives, tmp_path, name):
    _, _, paths = archives
    data = open(paths[name], "rb").read()
    cut = tmp_path / ("cut-" + os.path.basename(paths[name]))
    cut.write_bytes(data[: len(data) * 2 // 3])
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x55
    flip = tmp_path / ("flip-" + os.path.basename(paths[name]))
    flip.write_bytes(bytes(flipped))
    for path in (cut, flip):
        ix = shard_index.build(str(path))
        assert len(ix) == 0 and ix.error and ix.error.startswith(path.name + ": ") and "\n" not in ix.error, ix.error


def test_a_stream_of_zeros_is_no_bomb(tmp_path):
    """Each read returns at most what it asked for, however well the input compresses."""
    data = _run(["zstd", "-q", "-c"], input=bytes(64 << 20), stdout=subprocess.PIPE).stdout
    assert len(data) < 1 << 16
    stream = compressed.Stream(compressed.codec_of(data), lambda o, n: data[o : o + n], len(data))
    sizes = [len(stream.read(1 << 20)) for _ in range(3)]
    assert sizes == [1 << 20] * 3


@pytest.mark.parametrize("name", ["gz", "zstframes", "xzstreams", "bz2"])
def test_streams_read_into_their_own_buffers_give_the_tools_bytes(archives, monkeypatch, name):
    """Read through ``Shard.read_at`` into the stream's two buffers, in windows far smaller than
    the file (the input handed to the decompressor as views of them, never copies): the bytes the
    codec's own tool gives, several members, frames and streams included."""
    _, _, paths = archives
    monkeypatch.setattr(compressed, "READ", 8192)
    shard = open_shard(paths[name])
    try:
        stream = compressed.Stream(compressed.codec_of(shard.pread(0, 8)), shard.pread, shard.size, 8192,
                                   shard.read_at)
        assert stream.raw.window == 8192 < shard.size // 4
        out = bytearray()
        buf = bytearray(100_000)
        while got := stream.readinto(buf):
            out += buf[:got]
        stream.close()
    finally:
        shard.close()
    codec = compressed.codec_of(open(paths[name], "rb").read(8)).name
    reference = _run([DECOMPRESS[codec], "-dc", paths[name]], stdout=subprocess.PIPE).stdout
    assert hashlib.sha256(out).digest() == hashlib.sha256(reference).digest()


class CountedRoom:
    """A RAM room of ``limit`` bytes (ctar.SpoolRoom), counting what is taken and given back (the
    ctar_stream fuzz target's too)."""

    def __init__(self, limit: int):
        self.limit, self.held, self.asked = limit, 0, 0

    def take(self, n: int) -> bool:
        self.asked += 1
        if self.held + n > self.limit:
            return False
        self.held += n
        return True

    def give_back(self, n: int) -> None:
        self.held -= n
        assert self.held >= 0


def _tool_output(path: str) -> bytes:
    return _run(["gzip", "-dc", path], stdout=subprocess.PIPE).stdout


def test_a_spool_with_room_is_the_buffer_the_cache_keeps(archives, monkeypatch):
    """Spooled in memory: no scratch file at all, the decompressor's bytes are the buffer handed
    over (its length what it keeps of the room, the rest given back), and the scan read them."""
    _, _, paths = archives
    monkeypatch.setattr(ctar, "_scratch_file", lambda directory: pytest.fail("a scratch file was made"))
    room = CountedRoom(1 << 30)
    shard = open_shard(paths["gz"])
    spooled = ctar.SpooledShard(shard, room=room)
    try:
        want = _tool_output(paths["gz"])
        assert spooled.size == len(want) and spooled.pread(0, spooled.size) == want
        buf = spooled.take_buffer()
        assert len(buf) == buffers.footprint(len(want)) == room.held
        assert buf[: len(want)] == want and spooled.pread(100, 50) == want[100:150]  # (the scan reads on)
    finally:
        spooled.close()
        shard.close()
    assert room.held == len(buf)  # the new owner's: closing the spool gave nothing back twice
    buf.close()


def test_a_spool_past_its_room_moves_to_disk_with_every_byte(archives, monkeypatch, tmp_path):
    """Room for a few steps only: what memory held goes to a scratch file, the rest follows, every
    byte is the tool's, and all the room is given back; with no room at all it starts on disk."""
    _, _, paths = archives
    monkeypatch.setattr(buffers, "HUGE", 64 << 10)  # (steps of room in huge pages: smaller ones here)
    monkeypatch.setattr(ctar, "ROOM_STEP", 64 << 10)
    want = _tool_output(paths["gz"])
    assert len(want) > 8 * (64 << 10)
    for limit in (4 * (64 << 10), 0):
        room = CountedRoom(limit)
        shard = open_shard(paths["gz"])
        spooled = ctar.SpooledShard(shard, scratch=str(tmp_path), room=room)
        try:
            assert room.held == 0 and room.asked >= (3 if limit else 1)
            assert spooled.take_buffer() is None
            assert spooled.size == len(want) and spooled.pread(0, spooled.size) == want
        finally:
            spooled.close()
            shard.close()
        assert os.listdir(tmp_path) == []  # (unlinked at once)


def test_the_cache_keeps_a_spool_as_built_and_counts_its_room(archives, tmp_path, monkeypatch):
    """A daemon's build (a keeper around it): the shard is resident from its spool, its bytes the
    tool's, the budget holding exactly its buffer; a budget too small for it spools to disk and
    keeps nothing, its room all given back."""
    _, _, paths = archives
    want = _tool_output(paths["gz"])
    for budget, kept in ((1 << 30, True), (len(want) // 2, False)):
        cache = ShardCache([], budget)
        keeper = Keeper(None, cache, in_ram=False)
        try:
            with monkeypatch.context() as patch:
                if kept:  # (spooled into the room: no scratch file)
                    patch.setattr(ctar, "_scratch_file", lambda directory: pytest.fail("a scratch file was made"))
                (path, ix, how), = dataset.index_shards([paths["gz"]], str(tmp_path / f"idx-{budget}"), workers=1,
                                                        keep=keeper, save=False)
            assert ix is not None and ix.logical_size == len(want), how
            view = dataset._open_shard(path, ix)
            assert keeper.adopt([view]) == int(kept)
            if kept:
                assert cache.reserved == len(cache.resident[view].buf) == buffers.footprint(len(want))
                got = cache.fetch(view, 0, view.size)
                assert hashlib.sha256(got).digest() == hashlib.sha256(want).digest()
            else:
                assert cache.reserved == 0 and not cache.resident
        finally:
            cache.close()


def test_a_plain_tar_named_tar_gz_is_read_as_tar(archives, tmp_path):
    """A .tar.gz a browser decompressed as it downloaded it (keeping its name) is a plain tar:
    served as one, as `tar -xf` reads it; bytes that are neither are refused with tar's line, and a
    tar compressed twice with one line of its own."""
    _, _, paths = archives
    plain = tmp_path / "downloaded.tar.gz"
    shutil.copy(paths["plain"], plain)
    ix = shard_index.build(str(plain))
    assert ix.format == "tar" and ix.error is None and len(ix) == len(shard_index.build(paths["plain"]))
    garbage = tmp_path / "fake.tar.gz"
    garbage.write_bytes(b"not gzip" * 100)
    ix = shard_index.build(str(garbage))
    assert len(ix) == 0 and ix.error.startswith("fake.tar.gz: not a tar archive")
    twice = tmp_path / "twice.tar.gz"
    twice.write_bytes(_run(["gzip", "-c", paths["gz"]], stdout=subprocess.PIPE).stdout)
    ix = shard_index.build(str(twice))
    assert len(ix) == 0 and ix.error == "twice.tar.gz: compressed twice (its decompressed bytes are compressed again)"


# ---- mounted ---------------------------------------------------------------------------


@needs_fuse
def test_mounted_as_tar_extracts_them_mixed_with_a_plain_tar(archives, mount):
    """One tree of every writer's archive and a plain tar shard: each file as tar -x writes it."""
    src, ref, paths = archives
    m = mount(src)
    served, want = entries(m.path), entries(str(ref))
    assert served.keys() == want.keys()
    different = {k: (served[k], want[k]) for k in want if served[k] != want[k]}
    assert not different
    assert m.stats()["problems"] == 0 and m.stats()["shards"] == len(WRITERS)
    assert m.stats()["decompressed"]["streams"] == len(WRITERS) - 1  # each compressed one once: the plain tar never
    assert os.getxattr(m.path + "/gzinside/text.txt", "user.shardfs.format") == b"ctar"
    assert os.getxattr(m.path + "/plain/text.txt", "user.shardfs.format") == b"tar"
    # a hard link: the same bytes under both names (served as two files, as the index resolves links)
    assert served[b"gz/sub/hard.bin"][1] == served[b"gz/random.bin"][1]


@needs_fuse
def test_damaged_shards_are_one_line_each_and_the_others_serve(archives, tmp_path, mount):
    _, ref, paths = archives
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(paths["zst"], src)
    data = open(paths["gz"], "rb").read()
    (src / "cut.tar.gz").write_bytes(data[: len(data) // 2])
    flipped = bytearray(open(paths["xz"], "rb").read())
    flipped[len(flipped) // 2] ^= 0x01
    (src / "flip.tar.xz").write_bytes(bytes(flipped))
    m = mount(src)
    lines = [line for line in m.output.splitlines() if "cut.tar.gz" in line or "flip.tar.xz" in line]
    assert len(lines) == 2, m.output
    assert "gzip stream cut short" in lines[0] and "damaged xz data" in lines[1]
    assert sorted(os.listdir(m.path)) == ["zst"]
    assert entries(m.path + "/zst") == entries(str(ref / "zst"))


@needs_fuse
def test_the_disk_tier_keeps_the_decompressed_tar_for_the_next_mount(archives, tmp_path, mount):
    """The first mount decompresses each shard once (its index build, which fills the tier); a second
    mount with the tier serves every file without decompressing anything."""
    _, ref, paths = archives
    src = tmp_path / "src"
    src.mkdir()
    for name in ("gz", "zstframes", "bz2"):
        shutil.copy(paths[name], src)
    tier = str(tmp_path / "tier")
    first = mount(src, options=("--disk-cache", tier), name="first")
    assert read_all(first.path) > 0
    stats = first.stats()
    assert stats["decompressed"]["streams"] == 3
    logical = stats["decompressed"]["bytes"]
    assert stats["disk"]["bytes_written"] >= logical > sum(os.path.getsize(p) for p in src.iterdir())
    force_unmount(first.path, first.pid)

    second = mount(src, options=("--disk-cache", tier, "--cache-size", "1M"), name="second")
    assert entries(second.path) == {k: v for k, v in entries(str(ref)).items() if k.split(b"/")[0] in
                                    (b"gz", b"zstframes", b"bz2")}
    stats = second.stats()
    assert stats["indexes_built"] == 0 and stats["decompressed"] == {"streams": 0, "bytes": 0}
    assert stats["disk"]["hits"] > 0 and stats["disk"]["storage_bytes_read"] == 0


@needs_fuse
def test_the_ram_budget_counts_decompressed_bytes(archives, tmp_path, mount):
    """A shard of ~1.5 MB that decompresses to ~2.7 MB: a budget between the two keeps it out of
    RAM (read from its stream, right bytes); a larger one holds the decompressed tar."""
    _, ref, paths = archives
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(paths["zst"], src)
    stored = os.path.getsize(paths["zst"])
    small = mount(src, options=("--cache-size", str(stored + (256 << 10))), name="small")
    assert entries(small.path + "/zst") == entries(str(ref / "zst"))
    cache = small.stats()["cache"]
    assert cache["used_bytes"] <= cache["budget_bytes"] and cache["shards_cached"] == 0
    logical = shard_index.build(paths["zst"]).logical_size
    assert logical > stored + (256 << 10)

    large = mount(src, options=("--cache-size", "64M"), name="large")
    assert entries(large.path + "/zst") == entries(str(ref / "zst"))
    cache = large.stats()["cache"]
    assert cache["shards_cached"] == 1 and cache["used_bytes"] >= logical


@needs_fuse
def test_a_remount_without_a_tier_decompresses_each_shard_once_as_readers_ask(archives, tmp_path, mount):
    """Indexes there already, no disk tier: the RAM cache loads each shard as its first reader asks,
    one stream front to back, while readers of it wait for their chunks (read_concurrently)."""
    from conftest import read_concurrently

    _, ref, paths = archives
    src = tmp_path / "src"
    src.mkdir()
    for name in ("gzmembers", "zst", "xz"):
        shutil.copy(paths[name], src)
    first = mount(src, name="first")
    force_unmount(first.path, first.pid)
    again = mount(src, name="again")
    assert again.stats()["indexes_built"] == 0
    files = [os.path.join(d, f) for d, _, fs in os.walk(again.path) for f in fs
             if not os.path.islink(os.path.join(d, f))]
    got = read_concurrently(sorted(files, reverse=True))  # the last members first
    want = {os.path.join(again.path, os.fsdecode(k)): v[1] for k, v in entries(str(ref)).items() if v[0] == "file"}
    assert {p: hashlib.sha256(data).hexdigest() for p, data in got.items()} == {p: want[p] for p in got}
    assert again.stats()["decompressed"]["streams"] == 3


@needs_fuse
def test_a_remount_from_the_saved_view_serves_the_decompressed_tar(archives, tmp_path, mount):
    """The saved view keeps each compressed shard's stored and decompressed sizes: a remount that
    maps it serves the same bytes (read through the stream, not the stored file's bytes)."""
    from conftest import shardfs_cmd, wait_for

    _, ref, paths = archives
    src = tmp_path / "src"
    src.mkdir()
    for name in ("gz", "plain"):
        shutil.copy(paths[name], src)
    first = mount(src, name="first")
    wait_for(lambda: "view saved in" in first.log(), first.log)
    shardfs_cmd("umount", first.path, check=True)
    again = mount(src, name="again")
    assert "view mapped from" in again.log() and again.stats()["view_mapped"]
    assert entries(again.path) == {k: v for k, v in entries(str(ref)).items() if k.split(b"/")[0] in (b"gz", b"plain")}


# ---- built by hypothesis (the fuzz target's inputs: tests/test_fuzz_targets.py) ------------

_names = st.text(st.characters(codec="utf-8", exclude_characters="\0/"), min_size=1, max_size=30).filter(
    lambda n: n not in (".", ".."))  # (names with dots: test_hostile.py)


def _a_tree(files: dict) -> bool:
    """No file is also another's folder (tar -x keeps one of the two)."""
    return not any(other.startswith(name + "/") for name in files for other in files)


_file_sets = st.dictionaries(st.lists(_names, min_size=1, max_size=3).map("/".join), st.binary(max_size=3000),
                             min_size=1, max_size=6).filter(_a_tree)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=_file_sets, codec=st.sampled_from(["gzip", "zstd", "xz", "bzip2"]), pieces=st.integers(1, 3))
def test_trees_through_each_codec_are_served_as_written(tmp_path, files, codec, pieces):
    """Any small tree, written by tarfile, compressed in 1-3 members/frames/streams: every file
    served with the bytes written, under the name tarfile gave it."""
    import bz2
    import gzip
    import lzma

    import zstandard

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    plain = out.getvalue()
    pack = {"gzip": gzip.compress, "zstd": zstandard.ZstdCompressor(write_checksum=True).compress,
            "xz": lzma.compress, "bzip2": bz2.compress}[codec]
    step = -(-len(plain) // pieces)
    path = tmp_path / f"h-{codec}-{pieces}.tar.gz"
    path.write_bytes(b"".join(pack(plain[i : i + step]) for i in range(0, len(plain), step)))
    ix = shard_index.build(str(path))
    assert ix.format == "ctar" and ix.error is None and ix.logical_size == len(plain)
    served = {ix.name(i): plain[ix.offset[i] : ix.offset[i] + ix.size[i]] for i in range(len(ix)) if ix.kind[i] == 0}
    with tarfile.open(fileobj=io.BytesIO(plain)) as tar:
        want = {m.name.encode(): tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    assert served == want


def test_verify_and_ls_read_the_decompressed_tar(archives):
    from conftest import shardfs_cmd

    src, ref, _ = archives
    done = shardfs_cmd("verify", str(src))
    assert done.returncode == 0, done.stdout + done.stderr
    listed = shardfs_cmd("ls", "-R", str(src))
    assert listed.returncode == 0 and "random.bin" in listed.stdout and "zstframes:" in listed.stdout
