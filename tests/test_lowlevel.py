"""The compiled request loop: what it answers without Python, checked through real mounts by the
requests it counts, and its table against the tree it is built from."""

import hashlib
import io
import os
import random
import tarfile

import numpy as np
import pytest

from conftest import drop_page_cache, needs_fuse, wait_for
from shardfs.fuse import _lowlevel, table
from shardfs.storage import tierfile
from shardfs.view import dataset
from shardfs.view.tree import inode_number
from tarcraft import archive, member

pytestmark = needs_fuse


def _walk(root: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, files in os.walk(root) for f in files)


def _sha(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _ops(m) -> dict:
    return m.stats()["fuse_ops"]


def test_a_second_listing_is_served_by_the_kernel(tar_shards, mount):
    m = mount(tar_shards)
    first = _walk(m.path)
    listed = _ops(m).get("readdir", 0)
    assert listed > 0 and len(first) == 72
    assert _walk(m.path) == first
    assert _walk(m.path) == first
    after = _ops(m)
    assert after.get("readdir", 0) == listed  # cached listings (FOPEN_CACHE_DIR)
    assert after.get("opendir", 0) == 1  # answered ENOSYS once: the kernel opens directories itself


def test_python_open_asks_isatty_and_gets_enotty_from_c(tar_shards, sample_tree, mount):
    m = mount(tar_shards)
    files = _walk(m.path)
    for path in files:
        with open(path, "rb") as f:  # buffered: calls isatty() (an ioctl) on every open
            assert not f.isatty()
    ops = _ops(m)
    assert ops.get("ioctl", 0) >= len(files)
    for path in files:
        rel = os.path.relpath(path, m.path)
        assert _sha(path) == _sha(os.path.join(sample_tree, rel))


def test_reads_of_cached_bytes_are_answered_in_c_with_the_right_bytes(tar_shards, sample_tree, mount):
    m = mount(tar_shards)
    files = _walk(m.path)
    want = {p: _sha(os.path.join(sample_tree, os.path.relpath(p, m.path))) for p in files}
    assert {p: _sha(p) for p in files} == want  # the first pass loads the shards (Python)
    before = m.stats()
    for p in files:
        drop_page_cache(p)
    assert {p: _sha(p) for p in files} == want  # now from the published buffers
    stats = m.stats()
    grew = {k: stats[k] - before[k] for k in ("reads_in_c_from_ram", "pushed_with_open")}
    reads = stats["fuse_ops"]["read"] - before["fuse_ops"]["read"]
    assert reads == grew["reads_in_c_from_ram"], (reads, stats)  # none of this pass's reads in Python
    # (a member whose inode the kernel dropped and looked up again, as under memory pressure, has
    # its bytes pushed with open()'s ioctl instead: answered in C too, without a READ)
    assert grew["reads_in_c_from_ram"] + grew["pushed_with_open"] >= len(files), (grew, stats)
    assert stats["cache"]["hits"] >= before["cache"]["hits"] + len(files)
    assert stats["bytes_served"] >= 2 * sum(os.path.getsize(p) for p in files)


def test_lookups_and_attributes_come_from_the_table(tar_shards, mount):
    m = mount(tar_shards)
    for path in _walk(m.path):
        st = os.stat(path)
        rel = os.path.relpath(path, m.path).encode()
        assert st.st_ino == inode_number(rel)
    assert not os.path.exists(os.path.join(m.path, "nope"))
    assert not os.path.exists(os.path.join(m.path, _walk(m.path)[0], "below-a-file"))
    assert _ops(m).get("lookup", 0) > 0


def test_other_xattrs_are_answered_without_python(tar_shards, mount):
    m = mount(tar_shards)
    path = _walk(m.path)[0]
    with pytest.raises(OSError) as exc:
        os.getxattr(path, "security.selinux")
    assert exc.value.errno == 61  # ENODATA
    assert os.getxattr(path, "user.shardfs.format") == b"tar"
    assert "user.shardfs.shard" in os.listxattr(path)


def test_table_lookup_agrees_with_the_tree(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.tar").write_bytes(archive(member(b"x/b.txt", b"1"), member(b"x/a.txt", b"2"),
                                        member(b"x/y/z.txt", b"3"), member(b"top.txt", b"4")))
    (src / "b.tar").write_bytes(archive(member(b"x/c.txt", b"5"), member(b"x/a.txt", b"6")))
    view = dataset.open_dataset([str(src)], str(tmp_path / "ix"))
    t = table.build(view, table.Slots())
    for path in (b"x", b"x/y", b"x/a.txt", b"x/b.txt", b"x/c.txt", b"x/y/z.txt", b"top.txt"):
        parent, _, name = path.rpartition(b"/")
        assert t.lookup(inode_number(parent), name) == inode_number(path), path
    assert t.lookup(1, b"missing") is None
    assert t.lookup(inode_number(b"top.txt"), b"under-a-file") is None


def test_table_lookup_finds_names_that_share_long_prefixes(tmp_path):
    """Children are sorted by the 8 bytes after their folder's common prefix, then the rest: names
    that are prefixes of each other, equal in those 8 bytes, or hold bytes above 0x7f."""
    rng = random.Random(5)
    stem = b"n01440764_"
    names = {stem + bytes(rng.choice(b"0123456789\xe9\xff.") for _ in range(rng.randint(0, 14)))
             for _ in range(400)}
    names |= {stem + b"12345678" + tail for tail in (b"", b"9", b"90", b"\xff", b"1.JPEG")}
    names = sorted(n for n in names if not n.endswith(b"."))
    src = tmp_path / "src"
    src.mkdir()
    half = len(names) // 2  # from two shards, so the folder's children come unsorted
    (src / "a.tar").write_bytes(archive(*(member(b"c/" + n, n) for n in names[half:][::-1])))
    (src / "b.tar").write_bytes(archive(*(member(b"c/" + n, n) for n in names[:half])))
    view = dataset.open_dataset([str(src)], str(tmp_path / "ix"))
    assert view.tree.nfiles == len(names)
    t = table.build(view, table.Slots())
    folder = inode_number(b"c")
    for n in names:
        assert t.lookup(folder, n) == inode_number(b"c/" + n), n
    for absent in (stem, stem + b"1234567", stem + b"123456789\xff", b"n01440764", stem + b"\xff" * 15):
        if absent not in names:
            assert t.lookup(folder, absent) is None, absent


def test_many_children_are_sorted_on_two_threads_as_on_one(tmp_path):
    """70,000 files in 7 folders, from two shards so that each folder's children come unsorted:
    enough that the table sorts them on two threads (each takes the folders of about half the
    children). Every folder's children end in name order, and every file is found."""
    rng = random.Random(7)
    names = sorted({f"d{k}/{rng.getrandbits(48):012x}.bin".encode() for k in range(7) for _ in range(10_000)})
    assert len(names) > 1 << 16  # table.c: SORT_TWO_THREADS_FROM
    src = tmp_path / "src"
    src.mkdir()
    half = len(names) // 2
    (src / "a.tar").write_bytes(archive(*(member(n, b"") for n in names[half:][::-1])))
    (src / "b.tar").write_bytes(archive(*(member(n, b"") for n in names[:half][::-1])))
    view = dataset.open_dataset([str(src)], str(tmp_path / "ix"))
    tree = view.tree
    t, derived = table.build_keeping(view, table.Slots())
    children, starts = derived["children"], derived["child_start"]
    for d in range(tree.ndirs):
        got = [tree.dirs[n].path if n < tree.ndirs else tree.name(int(n) - tree.ndirs)
               for n in children[starts[d]:starts[d + 1]].tolist()]
        got = [p.rpartition(b"/")[2] for p in got]
        assert got == sorted(got), tree.dirs[d].path
    assert sum(int(starts[d + 1] - starts[d]) for d in range(tree.ndirs)) == len(names) + 7
    for n in names[::7]:
        parent, _, base = n.rpartition(b"/")
        assert t.lookup(inode_number(parent), base) == inode_number(n), n


def test_paths_with_the_inode_number_of_another_are_left_out_of_the_table(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    files = [b"x/a.txt", b"x/b.txt", b"x/y/c.txt", b"top.txt"]
    (src / "a.tar").write_bytes(archive(*(member(n, n) for n in files)))
    view = dataset.open_dataset([str(src)], str(tmp_path / "ix"))
    monkeypatch.setattr(table, "_member_ino", lambda hashes: np.full(len(hashes), 12345, np.uint64))
    t = table.build(view, table.Slots())
    found = [n for n in files if t.lookup(inode_number(n.rpartition(b"/")[0]), n.rpartition(b"/")[2]) is not None]
    assert len(found) == 1  # one path keeps the number; the others are left out, not shown twice
    assert t.lookup(inode_number(b"x"), b"y") == inode_number(b"x/y")  # directories stay


def _table_arguments(tmp_path, monkeypatch) -> tuple[tuple, dict]:
    """What table.build hands _lowlevel.Table for a small tree: root {x/, top.txt}, x {b.txt}."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.tar").write_bytes(archive(member(b"x/b.txt", b"1"), member(b"top.txt", b"2")))
    view = dataset.open_dataset([str(src)], str(tmp_path / "ix"))
    made = []
    monkeypatch.setattr(_lowlevel, "Table", lambda *args, **kw: made.append((args, kw)))
    table.build(view, table.Slots())
    monkeypatch.undo()
    [(args, kw)] = made
    return args, kw


def test_a_table_refuses_arrays_that_point_outside_themselves(tmp_path, monkeypatch):
    """The loop trusts a table's indexes once it has it (a saved view's arrays come from a file,
    checked by CRC alone): each kind of wrong one is refused first, in bounds and in order."""
    args, kw = _table_arguments(tmp_path, monkeypatch)
    assert list(args[0]["child_start"]) == [0, 2, 3] and list(args[0]["dir_parent"]) == [0, 0]
    _lowlevel.Table(*args, **kw)  # as built: taken

    def refused(key: str, change) -> str:
        arrays = dict(args[0])
        arrays[key] = change(arrays[key].copy())
        with pytest.raises(ValueError) as exc:
            _lowlevel.Table(arrays, *args[1:], **kw)
        return str(exc.value)

    def set_last(values, value):
        values[-1] = value
        return values

    assert refused("size", lambda a: a[:-1]).startswith("table array size: ")
    assert refused("children", lambda a: set_last(a, 1000)) == "a child is not a node"
    assert refused("by_ino", lambda a: set_last(a, 0)) == "by_ino must be strictly ascending and name nodes"
    assert refused("shard", lambda a: set_last(a, 7)) == "a member's shard is out of range"
    assert refused("name_end", lambda a: set_last(a, 10**6)) == "member name ends go backwards or past the names"
    # each index the loop follows, not only the last: bounds and order
    assert refused("child_start", lambda a: np.array([0, 4, 3], a.dtype)) == "child_start goes backwards"
    assert refused("dir_parent", lambda a: set_last(a, 2)) == "a directory's parent is not a directory"
    backwards = "member name ends go backwards or past the names"
    assert refused("name_end", lambda a: np.array([a[1] + 1, a[1]], a.dtype)) == backwards
    assert refused("name_end", lambda a: np.array([-1, a[1]], a.dtype)) == backwards
    assert refused("dir_name_end", lambda a: np.array([a[1] + 1, a[1]], a.dtype)) == \
        "directory name ends go backwards or past the names"
    assert refused("size", lambda a: set_last(a, -1)) == "a member's size or offset is out of range"
    assert refused("offset", lambda a: set_last(a, -2)) == "a member's size or offset is out of range"
    assert refused("offset", lambda a: set_last(a, 2**63 - 1)) == "a member's size or offset is out of range"


def test_a_table_holds_the_buffers_it_reads_for_its_life(tmp_path, monkeypatch):
    """The table keeps pointers into its arrays' memory: that memory can be neither moved (a
    bytearray resized) nor unmapped (a saved view's mmap closed) while the table lives."""
    import gc
    import mmap

    args, kw = _table_arguments(tmp_path, monkeypatch)
    arrays = dict(args[0])
    names = arrays["names"] = bytearray(arrays["names"])
    mapped = mmap.mmap(-1, max(1, len(arrays["dir_names"])))
    mapped[:len(arrays["dir_names"])] = arrays["dir_names"]
    arrays["dir_names"] = mapped
    t = _lowlevel.Table(arrays, *args[1:], **kw)
    with pytest.raises(BufferError):
        names.extend(b"x" * 4096)  # would move the names the table reads
    with pytest.raises(BufferError):
        mapped.close()  # would unmap the directory names
    assert t.lookup(inode_number(b"x"), b"b.txt") == inode_number(b"x/b.txt")
    del t
    gc.collect()
    names.extend(b"x")  # let go with the table
    mapped.close()


def test_a_slot_refuses_a_buffer_smaller_than_its_shard():
    slot = _lowlevel.Slot()
    with pytest.raises(ValueError):
        slot.publish(bytearray(10), 11, bytearray(1), 1 << 20)
    slot.publish(bytearray(10), 10, bytearray(1), 1 << 20)
    slot.withdraw()
    assert slot.hits == 0


def test_refused_shards_are_read_from_the_disk_tier_in_c(tar_shards, sample_tree, mount, tmp_path):
    tier = tmp_path / "tier"
    options = ("--disk-cache", str(tier), "--cache-size", "1")  # RAM holds nothing: every shard refused
    m = mount(tar_shards, options=options)
    files = _walk(m.path)
    want = {p: _sha(os.path.join(sample_tree, os.path.relpath(p, m.path))) for p in files}
    assert {p: _sha(p) for p in files} == want  # fills the tier, in the background too
    total = sum(f.stat().st_size for f in tar_shards.glob("*.tar"))
    wait_for(lambda: m.stats()["disk"]["bytes_written"] >= total, lambda: m.stats()["disk"])
    before = m.stats()
    for p in files:
        drop_page_cache(p)
    assert {p: _sha(p) for p in files} == want
    stats = m.stats()
    grew = {k: stats[k] - before[k] for k in ("reads_in_c_from_disk", "pushed_with_open")}
    reads = stats["fuse_ops"]["read"] - before["fuse_ops"]["read"]
    assert reads == grew["reads_in_c_from_disk"], (reads, stats)  # none of this pass's reads in Python
    assert grew["reads_in_c_from_disk"] + grew["pushed_with_open"] >= len(files), (grew, stats)  # (pushed: as above)
    assert stats["disk"]["hits"] >= len(files)



def test_tier_bytes_still_in_the_page_cache_are_copied_from_it_then_dropped(tmp_path, mount):
    """The first epoch: the disk tier wrote the bytes moments ago and the kernel still holds them,
    where an O_DIRECT read would wait for the disk: they are copied from the page cache. Once the
    kernel has let them go (a later epoch), O_DIRECT serves the same bytes."""
    src = tmp_path / "src"
    src.mkdir()
    rng, want = random.Random(7), {}
    with tarfile.open(src / "a.tar", "w", format=tarfile.GNU_FORMAT) as tar:
        for i in range(12):
            data = rng.randbytes(200_000 + i * 4099)
            info = tarfile.TarInfo(f"d/{i:02d}.bin")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            want[f"d/{i:02d}.bin"] = hashlib.sha256(data).hexdigest()
    tier = tmp_path / "tier"
    m = mount(src, options=("--disk-cache", str(tier), "--cache-size", "1"))  # RAM refuses the shard
    files = {name: os.path.join(m.path, name) for name in want}
    with open(files["d/00.bin"], "rb") as f:  # the first read admits the shard to the tier and fills it
        f.read(1)
    wait_for(lambda: m.stats()["disk"]["bytes_written"] >= (src / "a.tar").stat().st_size, lambda: m.stats()["disk"])
    with open(tier / tierfile.file_name(str(src / "a.tar")), "rb") as f:  # all of it cached, as after a fill
        while f.read(1 << 20):
            pass
    before = m.stats()
    for p in files.values():
        drop_page_cache(p)
    assert {name: _sha(p) for name, p in files.items()} == want
    after = m.stats()
    assert after["disk_tier_page_cache_reads"] - before["disk_tier_page_cache_reads"] >= len(files)

    if os.geteuid() != 0:
        pytest.skip("emptying the page cache (a later epoch) needs root")
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1")
    assert {name: _sha(p) for name, p in files.items()} == want
    last = m.stats()
    assert last["disk_tier_page_cache_reads"] == after["disk_tier_page_cache_reads"]
    served = last["reads_in_c_from_disk"] + last["pushed_with_open"]
    assert served - after["reads_in_c_from_disk"] - after["pushed_with_open"] >= len(files)

def _loaded(m, shards) -> None:
    """Waits until every shard is in the RAM cache (--prefetch all)."""
    total = sum(f.stat().st_size for f in shards.glob("*.tar"))
    wait_for(lambda: m.stats()["cache"]["storage_bytes_read"] >= total, lambda: m.stats()["cache"])


def _relpaths(tree: str) -> list[str]:
    return [os.path.relpath(p, tree) for p in _walk(tree)]


def test_a_file_looked_up_then_opened_gets_its_bytes_with_the_isatty_answer(tar_shards, sample_tree, mount):
    m = mount(tar_shards, options=("--prefetch", "all", "--cache-size", "1G"))
    _loaded(m, tar_shards)
    before = m.stats()
    names = _relpaths(sample_tree)  # never listed: each open() looks its name up, a new inode
    for rel in names:
        with open(os.path.join(m.path, rel), "rb") as f:  # as pil_loader: isatty, then the read
            assert hashlib.sha256(f.read()).hexdigest() == _sha(os.path.join(sample_tree, rel))
    after = m.stats()
    assert after["pushed_with_open"] - before.get("pushed_with_open", 0) == len(names)
    assert after["push_failures"] == 0
    # the kernel read them from its page cache: no READ request reached the daemon
    assert after["fuse_ops"].get("read", 0) == before["fuse_ops"].get("read", 0)


def test_a_listed_file_opened_first_gets_its_bytes_with_the_isatty_answer(tar_shards, sample_tree, mount):
    m = mount(tar_shards, options=("--prefetch", "all", "--cache-size", "1G"))
    _loaded(m, tar_shards)
    files = _walk(m.path)  # as ImageFolder lists: READDIRPLUS makes every inode, no lookups follow
    before = m.stats()
    for path in files:
        with open(path, "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == _sha(os.path.join(sample_tree, os.path.relpath(path, m.path)))
    after = m.stats()
    assert after["fuse_ops"].get("lookup", 0) == before["fuse_ops"].get("lookup", 0)
    assert after["pushed_with_open"] - before.get("pushed_with_open", 0) == len(files)
    assert after["fuse_ops"].get("read", 0) == before["fuse_ops"].get("read", 0)
    for path in files:  # pushed once: pages dropped since come back by a READ, never a second push
        drop_page_cache(path)
        with open(path, "rb") as f:
            f.read()
    assert m.stats()["pushed_with_open"] == after["pushed_with_open"]
    assert m.stats()["fuse_ops"]["read"] >= after["fuse_ops"].get("read", 0) + len(files)


def test_without_a_lookup_or_with_pushes_off_reads_are_requests(tar_shards, sample_tree, mount, monkeypatch):
    m = mount(tar_shards, options=("--prefetch", "all", "--cache-size", "1G"))
    _loaded(m, tar_shards)
    names = _relpaths(sample_tree)
    for rel in names:  # os.open: no isatty, so nothing is pushed; the READ brings the bytes
        fd = os.open(os.path.join(m.path, rel), os.O_RDONLY)
        os.read(fd, 1 << 20)
        os.close(fd)
    for rel in names:  # read since the lookup: the pages are there, nothing is pushed
        with open(os.path.join(m.path, rel), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == _sha(os.path.join(sample_tree, rel))
    stats = m.stats()
    assert stats["fuse_ops"]["read"] >= len(names) and stats["pushed_with_open"] == 0
    monkeypatch.setenv("SHARDFS_PUSH_ON_OPEN", "0")
    off = mount(tar_shards, options=("--prefetch", "all", "--cache-size", "1G"), name="off")
    _loaded(off, tar_shards)
    for rel in names:
        with open(os.path.join(off.path, rel), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == _sha(os.path.join(sample_tree, rel))
    stats = off.stats()
    assert stats["pushed_with_open"] == 0 and stats["fuse_ops"]["read"] >= len(names)

