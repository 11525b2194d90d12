"""SquashFS images written by the real tools (mksquashfs, tar2sqfs, gensquashfs), mounted for real
and compared file by file with what `unsquashfs -d` extracts: bytes, modes, times, symlinks,
folders, hard links; damaged images refused with one line while the rest serves."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import struct
import subprocess
import tarfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import force_unmount, needs_fuse
from shardfs.formats import format_for
from shardfs.formats.base import Kind
from shardfs.formats.squashfs import FORMAT, tables
from shardfs.formats.squashfs.inodes import IN_FRAGMENT
from shardfs.formats.base import VIRTUAL
from shardfs.index import index_file, store
from shardfs.storage import open_shard

pytestmark = pytest.mark.skipif(shutil.which("mksquashfs") is None or shutil.which("tar2sqfs") is None,
                                reason="needs squashfs-tools and squashfs-tools-ng (tools/setup.sh)")

BLOCK = 128 << 10


def run(*cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], check=True, capture_output=True, **kw)


def make_tree(root: Path) -> None:
    """Every kind of entry an image holds: files of every shape (empty, a tail only, whole blocks,
    blocks and a tail, incompressible, with holes), hard links, symlinks, folders with their own
    modes and times, an empty folder, a fifo (not served), names with spaces and UTF-8."""
    rnd = __import__("random").Random(7)
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "empty dir").mkdir()
    (root / "ünï").mkdir()
    (root / "empty").write_bytes(b"")
    (root / "tiny").write_bytes(b"hi\n")
    (root / "zeros").write_bytes(bytes(100))  # a tail of zeros alone: mksquashfs stores it as a sparse block
    (root / "sub" / "text.txt").write_bytes(b"".join(b"line %d of some text\n" % i for i in range(20000)))
    (root / "sub" / "random.bin").write_bytes(rnd.randbytes(300_000))
    (root / "sub" / "deeper" / "exact.bin").write_bytes(rnd.randbytes(BLOCK))
    (root / "ünï" / "ß name.jpg").write_bytes(rnd.randbytes(5000))
    with open(root / "sub" / "holes.bin", "wb") as f:  # whole zero blocks at every block size: sparse
        f.write(rnd.randbytes(70_000))
        f.seek(3 << 20)
        f.write(b"after the hole")
    os.link(root / "sub" / "random.bin", root / "hardlink.bin")
    os.symlink("sub/text.txt", root / "link-to-file")
    os.symlink("sub", root / "link-to-dir")
    os.symlink("nowhere/at/all", root / "dangling")
    os.mkfifo(root / "fifo")
    (root / "crowded").mkdir()  # a listing over 8 KiB: an extended directory inode with an index
    for i in range(400):
        (root / "crowded" / f"file-with-a-longish-name-{i:04d}").write_bytes(b"%d" % i)
    os.chmod(root / "tiny", 0o600)
    os.chmod(root / "sub" / "deeper" / "exact.bin", 0o755)
    os.chmod(root / "empty dir", 0o700)
    os.chmod(root / "ünï", 0o750)
    t = 1_600_000_000
    for i, (dirpath, dirnames, filenames) in enumerate(sorted(os.walk(root), reverse=True)):  # files, then folders up
        for j, name in enumerate(sorted(filenames) + sorted(dirnames)):
            os.utime(os.path.join(dirpath, name), (t + 1000 * i + j, t + 1000 * i + j), follow_symlinks=False)


def snapshot(root: Path) -> dict[str, tuple]:
    """Relative path -> what an extraction or a mount shows of it (special files left out)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st_ = os.lstat(full)
            rel = os.path.relpath(full, root)
            if stat.S_ISLNK(st_.st_mode):
                found[rel] = ("symlink", os.readlink(full), int(st_.st_mtime))
            elif stat.S_ISDIR(st_.st_mode):
                found[rel] = ("dir", stat.S_IMODE(st_.st_mode), int(st_.st_mtime))
            elif stat.S_ISREG(st_.st_mode):
                with open(full, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                found[rel] = ("file", stat.S_IMODE(st_.st_mode), int(st_.st_mtime), st_.st_size, digest)
    return found


def unsquashfs(image: Path, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    run("unsquashfs", "-no-progress", "-d", dest, image)
    return dest


def mksquashfs(src: Path, image: Path, *options: str) -> Path:
    run("mksquashfs", src, image, "-noappend", "-quiet", "-no-progress", "-keep-as-directory", *options)
    return image


# Each variant: a top folder of its own in one merged tree, so one mount serves them all.
MKSQUASHFS = {
    "gzip_128k": ("-comp", "gzip"),
    "xz_4k": ("-comp", "xz", "-b", "4K"),
    "lz4_1m": ("-comp", "lz4", "-b", "1M"),
    "zstd_128k": ("-comp", "zstd", "-Xcompression-level", "3"),
    "uncompressed": ("-noI", "-noD", "-noF", "-noX"),
    "zstd_no_fragments": ("-comp", "zstd", "-no-fragments"),
    "lz4_always_fragments_4k": ("-comp", "lz4", "-b", "4K", "-always-use-fragments"),
    "gzip_nopad_64k": ("-nopad", "-b", "64K"),
}


def tar2sqfs(src: Path, image: Path) -> Path:
    with tarfile.open(image.with_suffix(".tar"), "w", format=tarfile.GNU_FORMAT) as tf:
        tf.add(src, arcname=src.name)
    with open(image.with_suffix(".tar"), "rb") as f:
        run("tar2sqfs", "-q", "-c", "zstd", "-b", "65536", image, stdin=f)
    image.with_suffix(".tar").unlink()
    return image


def gensquashfs(src: Path, image: Path) -> Path:
    parent = src.parent / f"{src.name}-parent"
    parent.mkdir()
    src.rename(parent / src.name)
    run("gensquashfs", "-q", "-D", parent, "-k", "-c", "lzma", image)
    return image


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """name -> (image, unsquashfs's extraction of it); the images in one directory with a tar shard."""
    base = tmp_path_factory.mktemp("squashfs")
    tree = base / "tree"
    tree.mkdir()
    make_tree(tree)
    shards = base / "shards"
    shards.mkdir()
    made = {}
    work = base / "work"
    work.mkdir()
    writers = {name: (lambda s, i, o=opts: mksquashfs(s, i, *o)) for name, opts in MKSQUASHFS.items()}
    writers["tar2sqfs"] = tar2sqfs
    writers["gensquashfs_lzma"] = gensquashfs
    for name, write in writers.items():
        src = work / name
        run("cp", "-a", "--sparse=always", tree, src)
        image = write(src, shards / f"{name}.{'squashfs' if name.startswith('gz') else 'sqfs'}")
        made[name] = (image, unsquashfs(image, base / "extracted" / name) / name)
    with tarfile.open(shards / "plain.tar", "w") as tf:
        tf.add(tree / "sub" / "text.txt", arcname="from_tar/text.txt")
    return shards, made


def test_every_writer_variant_is_indexed_without_warnings_but_the_fifo(images):
    _, made = images
    for name, (image, _) in made.items():
        result = FORMAT.scan(open_shard(str(image)))
        assert result.error is None, (name, result.error)
        assert len(result.warnings) == 1 and "fifo" in result.warnings[0], (name, result.warnings)
        types = set(tables_of(image).inodes.type.tolist())
        assert 8 in types or name not in MKSQUASHFS, (name, types)  # mksquashfs indexes the crowded folder: ldir
        assert 9 in types or name == "gensquashfs_lzma", (name, types)  # extended files: hard links


@needs_fuse
def test_mounted_images_equal_unsquashfs_extraction(images, mount):
    shards, made = images
    m = mount(shards)
    for name, (_, extracted) in made.items():
        want = snapshot(extracted)
        assert "fifo" not in snapshot(Path(m.path) / name)
        want_files = {k: v for k, v in want.items() if k != "fifo"}
        got = snapshot(Path(m.path) / name)
        assert got == want_files, (name, sorted(set(got.items()) ^ set(want_files.items())))
        # hard links: one inode in the extraction, the same bytes under both names in the mount
        # (gensquashfs -D packs each name as a file of its own)
        assert name == "gensquashfs_lzma" or os.stat(extracted / "hardlink.bin").st_ino == os.stat(extracted / "sub" / "random.bin").st_ino
    with open(Path(m.path) / "from_tar" / "text.txt", "rb") as f:  # the tar shard in the same tree
        assert f.read() == (shards.parent / "tree" / "sub" / "text.txt").read_bytes()
    assert "error" not in m.log().lower()


def test_uncompressed_and_incompressible_files_are_ranges_of_the_image(images):
    """Files stored as one range (raw blocks, no fragment; or all in a raw fragment block) have the
    image's own offsets: the compiled loop serves them like tar members."""
    _, made = images
    for name in ("uncompressed", "zstd_no_fragments", "gzip_128k"):
        image, _ = made[name]
        members = {m.path: m for m in FORMAT.scan(open_shard(str(image))).members}
        random_bin = members[f"{name}/sub/random.bin".encode()]
        if name != "gzip_128k":  # with fragments on, its tail lies in a (compressed) fragment block
            assert not random_bin.offset & VIRTUAL, name
            data = image.read_bytes()
            assert data[random_bin.offset : random_bin.offset + random_bin.size] == \
                (images[0].parent / "tree" / "sub" / "random.bin").read_bytes()
        assert members[f"{name}/sub/text.txt".encode()].offset & VIRTUAL or name == "uncompressed"
        assert members[f"{name}/sub/holes.bin".encode()].offset & VIRTUAL  # sparse blocks: read by the layout


def test_an_image_of_only_uncompressed_files_has_no_virtual_offset(tmp_path):
    src = tmp_path / "flat"
    src.mkdir()
    for i in range(20):  # a leading non-zero byte: a block of zeros is stored sparse (a virtual file)
        (src / f"{i}.bin").write_bytes(b"\x01" + os.urandom(1000 * i))
    image = mksquashfs(src, tmp_path / "flat.sqfs", "-noI", "-noD", "-noF", "-noX")
    assert not any(m.offset & VIRTUAL for m in FORMAT.scan(open_shard(str(image))).members)


@needs_fuse
def test_ranges_of_the_image_are_served_by_the_compiled_loop_the_others_by_the_layout(tmp_path, mount):
    """In one image, a file stored as one range is copied by the compiled loop from the cached
    image, and a file in compressed blocks is read through the layout in Python (fuse/table.py)."""
    src = tmp_path / "mixed"
    src.mkdir()
    (src / "random.bin").write_bytes(os.urandom(300_000))
    (src / "text.txt").write_bytes(b"".join(b"line %d\n" % i for i in range(40000)))
    shards = tmp_path / "shards"
    shards.mkdir()
    mksquashfs(src, shards / "mixed.sqfs", "-comp", "zstd", "-no-fragments")
    members = {m.path: m for m in FORMAT.scan(open_shard(str(shards / "mixed.sqfs"))).members}
    assert not members[b"mixed/random.bin"].offset & VIRTUAL and members[b"mixed/text.txt"].offset & VIRTUAL
    m = mount(shards)
    in_c = m.stats()["reads_in_c_from_ram"]
    assert (Path(m.path) / "mixed" / "text.txt").read_bytes() == (src / "text.txt").read_bytes()
    assert m.stats()["reads_in_c_from_ram"] == in_c  # the layout's, in Python
    assert (Path(m.path) / "mixed" / "random.bin").read_bytes() == (src / "random.bin").read_bytes()
    assert m.stats()["reads_in_c_from_ram"] > in_c
    force_unmount(m.path, m.pid)
    again = mount(shards, name="remount")  # the view saved by the first mount, mapped
    assert again.stats()["view_mapped"]
    for name in ("text.txt", "random.bin"):
        assert (Path(again.path) / "mixed" / name).read_bytes() == (src / name).read_bytes()


def test_files_in_one_fragment_are_read_without_walking_the_inode_table(tmp_path):
    """Files under the block size (all in a compressed fragment block) carry their fragment in the
    offset: the layout reads them with the fragment table alone; the first read of a file in
    blocks walks the inode table once. An index made before (stream offsets for every virtual
    file) still reads the same bytes."""
    src = tmp_path / "mixed"
    src.mkdir()
    want = {f"tiny{i}.txt": b"tiny file %d\n" % i * (i + 1) for i in range(50)}
    want["blocks.txt"] = b"".join(b"line %d\n" % i for i in range(60000))  # blocks and a tail
    for name, data in want.items():
        (src / name).write_bytes(data)
    image = mksquashfs(src, tmp_path / "mixed.sqfs", "-comp", "zstd", "-b", "64K")
    members = {m.path.decode().split("/", 1)[1]: m for m in FORMAT.scan(open_shard(str(image))).members
               if m.kind == Kind.FILE}
    assert set(members) == set(want)
    shard = open_shard(str(image))
    fetch = lambda off, n: shard.pread(off, n)  # noqa: E731
    layout = FORMAT.open_layout(shard, shard.size)
    for name, data in want.items():
        if name != "blocks.txt":
            assert members[name].offset & IN_FRAGMENT, name
            assert layout.read(members[name].offset, len(data), fetch) == data
            assert layout.read(members[name].offset + 3, 5, fetch) == data[3:8]
    assert not layout.walked
    big = members["blocks.txt"]
    assert not big.offset & IN_FRAGMENT and big.offset & VIRTUAL
    assert layout.read(big.offset + 70_000, 100_000, fetch) == want["blocks.txt"][70_000:170_000]
    assert layout.walked

    t = tables_of(image)  # the offsets an index made before IN_FRAGMENT holds
    old_offsets = t.plan.offsets.copy()
    old_offsets[t.plan.virtual] = VIRTUAL + t.plan.stream
    by_offset = {int(o): name for name, m in members.items() for o in [m.offset]}
    old_layout = FORMAT.open_layout(shard, shard.size)
    for new, old in zip(t.plan.offsets.tolist(), old_offsets.tolist()):
        if new in by_offset:
            data = want[by_offset[new]]
            assert old_layout.read(old, len(data), fetch) == data, by_offset[new]


def test_squashfs_indexes_are_a_version_a_shardfs_before_in_fragment_does_not_read(tmp_path, monkeypatch):
    """A SquashFS image's index is written as version 6 (IN_FRAGMENT offsets, which a shardfs before
    them answers EIO for): a reader of version 5 alone refuses it as newer and builds its own; a
    tar's index stays 5, which that reader still takes. One written as 5 by the shardfs that brought
    IN_FRAGMENT is loaded, not rebuilt, and written again as 6."""
    src = tmp_path / "img"
    src.mkdir()
    for i in range(20):  # (text: its fragment block compresses, so its files are IN_FRAGMENT)
        (src / f"t{i}.txt").write_bytes(b"tiny file %d\n" % i * (i + 1))
    (src / "a.txt").write_bytes(b"tiny\n")
    image = mksquashfs(src, tmp_path / "img.sqfs", "-comp", "zstd")
    with tarfile.open(tmp_path / "t.tar", "w") as tar:
        tar.add(src / "a.txt", "a.txt")

    def version(path) -> int:
        with open(path, "rb") as f:
            return int.from_bytes(f.read(12)[8:12], "little")

    sq, how = store.load_or_build(str(image))
    tr, _ = store.load_or_build(str(tmp_path / "t.tar"))
    assert how == "built" and all(o & IN_FRAGMENT for o in sq.offset[sq.kind == Kind.FILE].tolist())
    assert (version(sq.stored_at), version(tr.stored_at)) == (6, 5) == (index_file.SQUASHFS_VERSION,
                                                                         index_file.INDEX_VERSION)
    with monkeypatch.context() as patch:  # the check of a shardfs that reads version 5 alone
        patch.setattr(index_file, "CURRENT", (5,))
        patch.setattr(index_file, "OLDER_FLAT", ())
        with pytest.raises(index_file.OutdatedIndex):
            index_file.load(sq.stored_at)
        assert len(index_file.load(tr.stored_at)) == len(tr)
    with monkeypatch.context() as patch:  # as written before version 6
        patch.setattr(index_file, "SQUASHFS_VERSION", 5)
        index_file.save(sq, sq.stored_at)
    assert version(sq.stored_at) == 5 and index_file.load(sq.stored_at).legacy
    again, how = store.load_or_build(str(image))
    assert how == "loaded" and not again.legacy and version(sq.stored_at) == 6
    assert again.offset.tolist() == sq.offset.tolist()


@needs_fuse
def test_file_over_4_gib_with_sparse_blocks(tmp_path, mount):
    """A 5 GiB file: an extended file inode with a 64-bit size, its holes stored as blocks of size 0
    (GNU tar -S's sparse map through tar2sqfs writes them without reading 5 GiB of zeros)."""
    src = tmp_path / "big"
    src.mkdir()
    marks = {0: b"start" * 100, (4 << 30) - 7: b"across-4GiB", 5 << 30: b"end"}
    with open(src / "huge", "wb") as f:
        for at, data in marks.items():
            f.seek(at)
            f.write(data)
    shards = tmp_path / "shards"
    shards.mkdir()
    tar = subprocess.run(["tar", "-S", "-C", tmp_path, "-cf", "-", "big"], check=True, capture_output=True).stdout
    run("tar2sqfs", "-q", "-b", "1048576", shards / "big.sqfs", input=tar)
    extracted = unsquashfs(shards / "big.sqfs", tmp_path / "x")
    m = mount(shards)
    served, reference = Path(m.path) / "big" / "huge", extracted / "big" / "huge"
    assert served.stat().st_size == reference.stat().st_size == (5 << 30) + 3
    with open(served, "rb") as got, open(reference, "rb") as want:
        for at in (0, (1 << 30) + 12345, (4 << 30) - 100, (5 << 30) - 50):
            got.seek(at)
            want.seek(at)
            assert got.read(300_000) == want.read(300_000), at


def test_lzo_image_is_refused_with_one_line(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"x" * 1000)
    image = mksquashfs(src, tmp_path / "lzo.sqfs", "-comp", "lzo")
    result = FORMAT.scan(open_shard(str(image)))
    assert result.members == [] and "lzo" in result.error and "\n" not in result.error


def test_an_empty_image_a_lone_file_and_an_empty_file(tmp_path):
    """An empty root (no directory table blocks at all: the fragment table starts where it would),
    one file at the root, one empty file."""
    src = tmp_path / "src"
    src.mkdir()
    got = {}
    for name, content in (("empty", None), ("lone", b"x\n"), ("zero", b"")):
        if content is not None:
            (src / "only").write_bytes(content)
        image = tmp_path / f"{name}.sqfs"
        run("mksquashfs", src, image, "-noappend", "-quiet", "-no-progress", "-no-fragments")
        shard = open_shard(str(image))
        result = FORMAT.scan(shard)
        assert result.error is None and not result.warnings, (name, result.error)
        layout = FORMAT.open_layout(shard, shard.size)
        got[name] = {m.path: layout.read(m.offset, m.size, shard.pread) for m in result.members}
    assert got == {"empty": {}, "lone": {b"only": b"x\n"}, "zero": {b"only": b""}}


def test_registered_by_suffix():
    assert format_for("/x/a.sqfs") is FORMAT and format_for("/x/a.squashfs") is FORMAT


# --------------------------------------------------------------------------- damaged images


def good_image(tmp_path: Path, name: str, *options: str) -> tuple[Path, dict]:
    src = tmp_path / f"src-{name}"
    (src / "d" / "e").mkdir(parents=True)
    (src / "d" / "e" / "f.txt").write_bytes(b"".join(b"%d\n" % i for i in range(40000)))
    (src / "d" / "g.bin").write_bytes(os.urandom(10000))
    os.utime(src / "d" / "e", (1_000_000, 1_000_000))
    os.utime(src / "d", (2_000_000, 2_000_000))
    image = tmp_path / f"{name}.sqfs"
    run("mksquashfs", src, image, "-noappend", "-quiet", "-no-progress", "-keep-as-directory", "-b", "4K", *options)
    return image, {"src": src}


def tables_of(image: Path):
    return tables.read(open_shard(str(image)))


def patch(image: Path, at: int, data: bytes) -> None:
    with open(image, "r+b") as f:
        f.seek(at)
        f.write(data)


def inode_position(image: Path, t, path: bytes) -> int:
    """Where in the image the inode of ``path`` is (-noI: the inode table's blocks stored as is).
    Files are told apart by their offsets, folders by their distinct mtimes (good_image)."""
    member = next(m for m in FORMAT.scan(open_shard(str(image))).members if m.path == path)
    if member.kind == Kind.FILE:
        at = int(t.inodes.files["at"][list(t.plan.offsets).index(member.offset)])
    else:
        at = next(a for a, mtime in zip(t.inodes.at.tolist(), t.inodes.mtime.tolist())
                  if a in t.inodes.dirs and mtime == member.mtime)
    i = max(j for j, u in enumerate(t.inode_run.ustarts) if u <= at)
    return t.sb.inode_table + t.inode_run.starts[i] + 2 + at - t.inode_run.ustarts[i]


def damaged_images(tmp_path: Path) -> tuple[dict[str, Path], Path]:
    """name -> a damaged image (whole image refused), and one with a single damaged file."""
    out = {}
    image, _ = good_image(tmp_path, "bad_magic")
    patch(image, 0, b"hsqX")
    out["bad_magic"] = image
    image, _ = good_image(tmp_path, "bad_block_size")
    patch(image, 12, struct.pack("<I", 3000))
    out["bad_block_size"] = image
    image, _ = good_image(tmp_path, "truncated")
    with open(image, "r+b") as f:
        f.truncate(image.stat().st_size // 2)
    out["truncated"] = image
    image, _ = good_image(tmp_path, "inode_table_past_end")
    patch(image, 64, struct.pack("<Q", 1 << 40))
    out["inode_table_past_end"] = image
    # a loop: folder d/e's inode made to list the folder d (its listing names e again)
    image, _ = good_image(tmp_path, "loop", "-noI")
    t = tables_of(image)
    d_at = inode_position(image, t, b"src-loop/d")
    e_at = inode_position(image, t, b"src-loop/d/e")
    raw = image.read_bytes()
    patch(image, e_at + 16, raw[d_at + 16 : d_at + 32])
    out["loop"] = image
    # a data block that expands beyond the block size, and a file whose blocks lie past the end
    image, _ = good_image(tmp_path, "bad_blocks", "-noI", "-no-fragments")
    t = tables_of(image)
    f_at = inode_position(image, t, b"src-bad_blocks/d/e/f.txt")
    start, _frag, _off, _size = struct.unpack_from("<IIII", image.read_bytes(), f_at + 16)
    (first,) = struct.unpack_from("<I", image.read_bytes(), f_at + 32)
    bomb = zlib.compress(b"x" * (64 << 10))
    assert len(bomb) <= first & 0xFFFFFF
    patch(image, start, bomb)
    g_at = inode_position(image, t, b"src-bad_blocks/d/g.bin")
    patch(image, g_at + 16, struct.pack("<I", image.stat().st_size + 4096))
    return out, image


@needs_fuse
def test_damaged_images_are_refused_with_one_line_and_the_rest_serves(tmp_path, mount):
    shards = tmp_path / "shards"
    shards.mkdir()
    damaged, bad_blocks = damaged_images(tmp_path)
    for image in [*damaged.values(), bad_blocks]:
        image.rename(shards / image.name)
    good, _ = good_image(tmp_path, "good", "-comp", "zstd")
    good.rename(shards / good.name)
    with tarfile.open(shards / "plain.tar", "w") as tf:
        tf.add(tmp_path / "src-good" / "d" / "g.bin", arcname="from_tar/g.bin")
    m = mount(shards)
    assert sorted(os.listdir(m.path)) == ["from_tar", "src-bad_blocks", "src-good"]
    assert (Path(m.path) / "src-good" / "d" / "e" / "f.txt").read_bytes() == \
        (tmp_path / "src-good" / "d" / "e" / "f.txt").read_bytes()
    assert (Path(m.path) / "from_tar" / "g.bin").read_bytes() == (tmp_path / "src-good" / "d" / "g.bin").read_bytes()
    for name in ("d/e/f.txt", "d/g.bin"):  # that file alone: EIO
        with pytest.raises(OSError) as exc:
            (Path(m.path) / "src-bad_blocks" / name).read_bytes()
        assert exc.value.errno == 5
    log = m.log()
    for name in damaged:
        lines = [line for line in log.splitlines() if f"{name}.sqfs" in line]
        assert len(lines) == 1, (name, lines, log)
    assert "expands beyond" in log and "does not fit the image" in log


def test_each_damage_is_named(tmp_path):
    damaged, _ = damaged_images(tmp_path)
    why = {name: FORMAT.scan(open_shard(str(image))).error for name, image in damaged.items()}
    assert "not a SquashFS image" in why["bad_magic"]
    assert "block size" in why["bad_block_size"]
    assert "truncated" in why["truncated"]
    assert "inode table" in why["inode_table_past_end"]
    assert "reached twice" in why["loop"]


# --------------------------------------------------------------------------- hypothesis

names = st.text(st.characters(min_codepoint=48, max_codepoint=122, blacklist_characters="\\`^[]"),
                min_size=1, max_size=12)
trees = st.recursive(
    st.one_of(st.binary(max_size=3000), st.integers(0, 3).map(lambda k: b"ab" * (40000 * k + 1))),
    lambda children: st.dictionaries(names, children, max_size=5), max_leaves=12)


def write_tree(root: Path, tree) -> None:
    for name, value in tree.items():
        if isinstance(value, dict):
            (root / name).mkdir()
            write_tree(root / name, value)
        else:
            (root / name).write_bytes(value)


@needs_fuse
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=st.dictionaries(names, trees, min_size=1, max_size=5), comp=st.sampled_from(["gzip", "lz4", "zstd"]),
       block=st.sampled_from(["4K", "128K"]), fragments=st.booleans())
def test_hypothesis_trees_through_mksquashfs_equal_the_mount(tmp_path_factory, mount, tree, comp, block, fragments):
    base = tmp_path_factory.mktemp("hyp")
    src = base / "top"
    src.mkdir()
    write_tree(src, tree)
    shards = base / "shards"
    shards.mkdir()
    mksquashfs(src, shards / "t.sqfs", "-comp", comp, "-b", block, *([] if fragments else ["-no-fragments"]))
    extracted = unsquashfs(shards / "t.sqfs", base / "x")
    m = mount(shards, name=f"mnt-{base.name}")
    assert snapshot(Path(m.path)) == snapshot(extracted)


@pytest.mark.parametrize("files, size, options", [(10, 60_000, ()), (3_000, 300, ("-noI", "-noD")), (2, 40_000, ())])
def test_an_index_build_reads_the_tables_and_the_fingerprint_in_three_reads(tmp_path, files, size, options):
    """An image's index build reads its head, its tables (from at least its last 64 KiB on) and
    the fingerprint's middle window, and keeps what those reads hold of the fingerprint's other
    windows: three reads where the image is over 192 KiB, whatever its tables' size; its
    fingerprint is fingerprint.of's either way (the image under 192 KiB is hashed whole)."""
    from shardfs.index import fingerprint, shard_index
    from shardfs.storage.local import LocalShard
    from shardfs.view.dataset import builds_in_threads

    src = tmp_path / "src"
    src.mkdir()
    rnd = __import__("random").Random(files)
    for i in range(files):
        (src / f"{i:05d}.jpg").write_bytes(rnd.randbytes(size))
    image = mksquashfs(src, tmp_path / "i.sqfs", "-comp", "zstd", *options)  # (-noI -noD: tables over 64 KiB)
    reads = []
    shard = LocalShard.open(str(image))
    pread = shard.pread
    shard.pread = lambda offset, length: reads.append((offset, length)) or pread(offset, length)
    ix = shard_index.build(shard)
    assert len(ix) == files + 1 and not ix.error and not ix.warnings
    assert ix.shard_fingerprint == fingerprint.of(LocalShard.open(str(image)))
    if image.stat().st_size > 3 * fingerprint.WINDOW:
        assert len(reads) == 3, reads
    if options:
        assert image.stat().st_size - tables.read(LocalShard.open(str(image))).sb.inode_table > 64 << 10
    assert builds_in_threads(str(image))  # (no worker processes for a scan of a few reads)
