"""POSIX behaviour of a mount: listing, stat, links, mmap, random reads, df, xattrs, EROFS."""

import errno
import glob
import io
import os
import random
import tarfile

import numpy as np
import pytest

from conftest import needs_fuse

pytestmark = needs_fuse

BIG = random.Random(1).randbytes(3 * 1024 * 1024 + 17)
ARRAY = np.arange(10000, dtype=np.float32).reshape(100, 100)
LONG_DIR = "deep/" + "d" * 150
NON_UTF8 = b"latin/\xe9t\xe9.txt"


def _add(tf, name, data=b"", **attrs):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 1_600_000_000
    for key, value in attrs.items():
        setattr(info, key, value)
    tf.addfile(info, io.BytesIO(data) if data else None)


@pytest.fixture
def special_shards(tmp_path):
    out = tmp_path / "special"
    out.mkdir()
    npy = io.BytesIO()
    np.save(npy, ARRAY)
    with tarfile.open(out / "a.tar", "w", format=tarfile.GNU_FORMAT) as tf:
        _add(tf, "data", type=tarfile.DIRTYPE, mode=0o750)
        _add(tf, "./data/array.npy", npy.getvalue())
        _add(tf, "data/big.bin", BIG)
        _add(tf, "data/link.npy", type=tarfile.SYMTYPE, linkname="array.npy", mode=0o777)
        _add(tf, "data/hard.bin", type=tarfile.LNKTYPE, linkname="data/big.bin")
        _add(tf, f"{LONG_DIR}/file.txt", b"long name\n")
        _add(tf, "data/empty", b"")
    with tarfile.open(out / "b.tar", "w", format=tarfile.PAX_FORMAT) as tf:
        _add(tf, "ünïcode/ファイル.txt", b"pax\n")
        _add(tf, "data/more.txt", b"second shard\n", mode=0o600)
    with tarfile.open(out / "c.tar", "w", format=tarfile.GNU_FORMAT, encoding="utf-8",
                      errors="surrogateescape") as tf:
        _add(tf, os.fsdecode(NON_UTF8), b"bytes name\n")
    return out


def test_listing_and_stat(special_shards, mount):
    m = mount(special_shards)
    root = m.path
    walked = {os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files}
    assert walked == {
        "data/array.npy", "data/big.bin", "data/link.npy", "data/hard.bin", "data/empty", "data/more.txt",
        f"{LONG_DIR}/file.txt", "ünïcode/ファイル.txt", os.fsdecode(NON_UTF8),
    }
    assert sorted(glob.glob(os.path.join(root, "data", "*.bin"))) == [
        os.path.join(root, "data", n) for n in ("big.bin", "hard.bin")]

    st = os.stat(os.path.join(root, "data", "big.bin"))
    assert st.st_size == len(BIG)
    assert st.st_blocks == (len(BIG) + 511) // 512
    assert st.st_nlink == 1 and st.st_mtime == 1_600_000_000
    d = os.stat(os.path.join(root, "data"))
    assert d.st_mode & 0o7777 == 0o750  # explicit directory member keeps its mode
    assert d.st_nlink == 2  # no subdirectories
    assert os.stat(root).st_nlink == 2 + 4  # data, deep, ünïcode, latin
    assert os.stat(os.path.join(root, "data", "more.txt")).st_mode & 0o777 == 0o600

    inodes = {os.lstat(os.path.join(root, p)).st_ino for p in walked}
    assert len(inodes) == len(walked)  # unique
    assert os.stat(os.path.join(root, "data", "big.bin")).st_ino == st.st_ino  # stable

    with open(os.path.join(root, LONG_DIR, "file.txt"), "rb") as f:
        assert f.read() == b"long name\n"
    with open(os.path.join(os.fsencode(root), NON_UTF8), "rb") as f:
        assert f.read() == b"bytes name\n"
    assert open(os.path.join(root, "data", "empty"), "rb").read() == b""


def test_links_mmap_and_random_reads(special_shards, mount):
    m = mount(special_shards)
    data = os.path.join(m.path, "data")
    assert os.readlink(os.path.join(data, "link.npy")) == "array.npy"
    assert os.path.islink(os.path.join(data, "link.npy"))
    arr = np.load(os.path.join(data, "link.npy"), mmap_mode="r")
    assert np.array_equal(arr, ARRAY)
    with open(os.path.join(data, "hard.bin"), "rb") as f:
        assert f.read() == BIG
    rng = random.Random(7)
    with open(os.path.join(data, "big.bin"), "rb") as f:
        for _ in range(200):
            off = rng.randrange(0, len(BIG) + 100)
            n = rng.randrange(0, 300_000)
            f.seek(off)
            assert f.read(n) == BIG[off : off + n]


def test_df_and_xattrs(special_shards, mount):
    m = mount(special_shards)
    vfs = os.statvfs(m.path)
    served = len(ARRAY.tobytes()) + 2 * len(BIG)  # roughly; hard link counted as a second file
    assert vfs.f_blocks * vfs.f_frsize >= served
    assert vfs.f_files >= 9
    big = os.path.join(m.path, "data", "big.bin")
    names = os.listxattr(big)
    assert "user.shardfs.shard" in names
    assert os.getxattr(big, "user.shardfs.shard").decode().endswith("a.tar")
    offset = int(os.getxattr(big, "user.shardfs.offset"))
    with open(special_shards / "a.tar", "rb") as f:
        f.seek(offset)
        assert f.read(1000) == BIG[:1000]
    with pytest.raises(OSError) as exc:
        os.getxattr(big, "user.nothing")
    assert exc.value.errno == errno.ENODATA


def test_every_write_is_erofs(special_shards, mount):
    m = mount(special_shards)
    f = os.path.join(m.path, "data", "big.bin")
    attempts = [
        lambda: open(f, "r+b"),
        lambda: open(os.path.join(m.path, "new.txt"), "wb"),
        lambda: os.mkdir(os.path.join(m.path, "newdir")),
        lambda: os.rename(f, f + ".moved"),
        lambda: os.unlink(f),
        lambda: os.rmdir(os.path.join(m.path, "data")),
        lambda: os.chmod(f, 0o777),
        lambda: os.chown(f, 1, 1),
        lambda: os.truncate(f, 0),
        lambda: os.utime(f, (0, 0)),
        lambda: os.symlink("x", os.path.join(m.path, "sym")),
        lambda: os.link(f, os.path.join(m.path, "hard")),
        lambda: os.setxattr(f, "user.x", b"1"),
        lambda: os.removexattr(f, "user.shardfs.shard"),
    ]
    for attempt in attempts:
        with pytest.raises(OSError) as exc:
            attempt()
        assert exc.value.errno == errno.EROFS
    assert open(f, "rb").read() == BIG


def test_inode_numbers_match_readdir_and_survive_added_shards(special_shards, mount, tmp_path):
    first = mount(special_shards, name="first")
    big = os.path.join("data", "big.bin")
    before = {p: os.lstat(os.path.join(first.path, p)).st_ino for p in (big, "data", "")}
    with os.scandir(os.path.join(first.path, "data")) as entries:
        for entry in entries:
            assert entry.inode() == os.lstat(entry.path).st_ino
    with tarfile.open(special_shards / "0-first.tar", "w") as tf:  # sorts first: shifts every member
        _add(tf, "aaa/new.txt", b"new\n")
    second = mount(special_shards, name="second")
    after = {p: os.lstat(os.path.join(second.path, p)).st_ino for p in (big, "data", "")}
    assert after == before
    assert before[""] == 1


def test_a_listing_primes_every_entry_of_a_large_directory(tmp_path, mount):
    """After one listing, opening and reading each of 2,000 files costs no LOOKUP, also for the
    entries past the kernel's first readdir batch; its bytes come by one READ, or with the
    isatty of its open() once the shard is in RAM (pushed)."""
    out = tmp_path / "many"
    out.mkdir()
    files = {f"cls/{i:05d}.bin": random.Random(i).randbytes(100 + i % 900) for i in range(2000)}
    with tarfile.open(out / "a.tar", "w") as tf:
        for name, data in files.items():
            _add(tf, name, data)
    m = mount(out)
    before = m.stats()["fuse_ops"]
    assert len(os.listdir(os.path.join(m.path, "cls"))) == 2000
    for name, data in files.items():
        with open(os.path.join(m.path, name), "rb") as f:
            assert f.read() == data
    stats = m.stats()
    ops = stats["fuse_ops"]
    assert ops.get("read", 0) - before.get("read", 0) + stats["pushed_with_open"] == 2000
    assert ops.get("getattr", 0) - before.get("getattr", 0) <= 2
