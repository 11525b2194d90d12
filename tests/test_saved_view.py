"""Saved views (view/snapshot.py): a remount maps the view a mount saved, only while it is current."""

import hashlib
import json
import os

import numpy as np
from conftest import needs_fuse, shardfs_cmd, wait_for
from tarcraft import archive, member, old_sparse_member

from shardfs.formats.datafile import Columns
from shardfs.view import layouts, snapshot
from shardfs.view.dataset import open_dataset
from shardfs.view.sources import find_shards

pytestmark = needs_fuse

SAVED, MAPPED = "view saved in", "view mapped from"


def _shards(src) -> None:
    """Small shards with what the tree keeps besides plain files: a link, an explicit directory,
    a sparse member, labels, and one path in two shards (a problem line)."""
    src.mkdir()
    (src / "a.tar").write_bytes(archive(
        member(b"cls/a.txt", b"from a\n"), member(b"cls/link", typeflag=b"2", linkname=b"a.txt"),
        member(b"d/", typeflag=b"5", mode=0o700), member(b"k1.jpg", b"J1" * 300), member(b"k1.cls", b"3"),
        member(b"both.txt", b"old\n")))
    (src / "b.tar").write_bytes(archive(
        member(b"cls/b.txt", b"from b\n"), old_sparse_member(b"sp.bin", [(0, b"x" * 512), (4096, b"y" * 512)], 8192),
        member(b"k2.jpg", b"J2" * 200), member(b"k2.cls", b"1"), member(b"both.txt", b"new\n")))
    (src / "c.tar").write_bytes(archive(*(member(b"many/%04d.bin" % i, b"%d" % i * 7) for i in range(300))))


def _served(root) -> dict:
    """Every path under the mount: files by sha256 of the bytes read, links by target, and modes."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                out[rel] = ("link", os.readlink(path))
            elif name in files:
                with open(path, "rb") as f:
                    out[rel] = (hashlib.sha256(f.read()).hexdigest(), st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino)
            else:
                out[rel] = ("dir", st.st_mode, st.st_ino, st.st_nlink)
    return out


def _mounted(mount, src, name, *options):
    """A mount, its tree as served, its log once any view it made is saved; then unmounted."""
    m = mount(src, options=("--index-dir", str(src.parent / "idx"), *options), name=name)
    seen = _served(m.path)
    if MAPPED not in m.log():
        wait_for(lambda: SAVED in m.log() or "could not save" in m.log(), m.log)
    shardfs_cmd("umount", m.path, check=True)
    return seen, m.log()


def _view_file(src) -> str:
    found = [p for p in os.listdir(src.parent / "idx") if p.endswith(snapshot.SUFFIX)]
    assert len(found) == 1, found
    return str(src.parent / "idx" / found[0])


def test_remount_maps_the_saved_view_and_serves_the_same_tree(tmp_path, mount):
    src = tmp_path / "src"
    _shards(src)
    first, log = _mounted(mount, src, "first")
    assert SAVED in log and MAPPED not in log
    again, log = _mounted(mount, src, "again")
    assert MAPPED in log and SAVED not in log
    assert again == first
    assert first["cls/link"] == ("link", "a.txt") and first["sp.bin"][2] == 8192
    assert first["both.txt"][0] == hashlib.sha256(b"new\n").hexdigest()
    assert "both.txt is in several shards" in log  # the problem lines come with the saved view


def test_saved_view_restores_every_array(tmp_path):
    from shardfs.fuse import table

    src = tmp_path / "src"
    _shards(src)
    index_dir, found = str(tmp_path / "idx"), find_shards([str(src)])
    path, key = snapshot.place([str(src)], index_dir, None, Columns())
    made = open_dataset([str(src)], index_dir, found=found)
    made_table, derived = table.build_keeping(made, table.Slots())
    assert snapshot.save(path, key, made, derived, index_dir)
    view, saved = snapshot.load(path, key, found, index_dir)

    tree, other = view.tree, made.tree
    for name in tree.SAVED:
        assert np.array_equal(getattr(tree, name), getattr(other, name)), name
    assert tree.names[:] == other.names[:] and len(other.names) > 0
    assert tree.dirs == other.dirs and tree.dir_id == other.dir_id and tree.subdirs == other.subdirs
    assert tree.symlinks == other.symlinks and len(other.symlinks) == 1
    assert list(tree.sparse) == list(other.sparse) and len(other.sparse) == 1
    assert all(np.array_equal(tree.sparse[m], other.sparse[m]) for m in other.sparse)
    assert (tree.ndirs, tree.nfiles, tree.total_size, tree.dir_nlink) == \
        (other.ndirs, other.nfiles, other.total_size, other.dir_nlink)
    assert view.problems == made.problems and len(made.problems) > 0
    assert [(s.path, s.size, s.mtime_ns, s.index_path) for s in view.shards] == \
        [(s.path, s.size, s.mtime_ns, s.index_path) for s in made.shards]
    assert set(saved) == set(derived)
    for name in derived:
        assert np.array_equal(np.frombuffer(saved[name], np.uint8), np.frombuffer(derived[name], np.uint8)), name
    # The table made from the saved arrays answers every lookup as the one that sorted them.
    mapped_table = table.from_saved(view, table.Slots(), saved)
    ino = {d.path: table.inode_number(d.path) for d in other.dirs}
    asked = 0
    for d in other.dirs:
        subdirs, files = other.children(other.dir_id[d.path] + 1)
        for child in [other.dirs[s].path for s in subdirs] + [other.name(int(m)) for m in files]:
            base = child.rsplit(b"/", 1)[-1]
            assert mapped_table.lookup(ino[d.path], base) == made_table.lookup(ino[d.path], base) is not None
            asked += 1
        assert mapped_table.lookup(ino[d.path], b"absent") is None
    assert asked == len(other.dirs) - 1 + other.nfiles


def test_a_shard_changed_added_or_removed_since_is_not_served_from_the_saved_view(tmp_path, mount):
    src = tmp_path / "src"
    _shards(src)
    _mounted(mount, src, "first")

    (src / "b.tar").write_bytes(archive(member(b"cls/b.txt", b"rewritten b, longer\n")))
    seen, log = _mounted(mount, src, "changed")
    assert "b.tar changed since" in log and MAPPED not in log and SAVED in log
    assert seen["cls/b.txt"][0] == hashlib.sha256(b"rewritten b, longer\n").hexdigest()
    assert "sp.bin" not in seen

    (src / "d.tar").write_bytes(archive(member(b"added.txt", b"added\n")))
    seen, log = _mounted(mount, src, "added")
    assert "the shards are not those it was made from" in log and MAPPED not in log
    assert seen["added.txt"][0] == hashlib.sha256(b"added\n").hexdigest()

    os.unlink(src / "a.tar")
    seen, log = _mounted(mount, src, "removed")
    assert "the shards are not those it was made from" in log and MAPPED not in log
    assert "cls/a.txt" not in seen and "cls/b.txt" in seen

    seen_again, log = _mounted(mount, src, "current")  # saved by the mount before: current again
    assert MAPPED in log and seen_again == seen


def test_an_index_file_written_again_since_is_not_served_from_the_saved_view(tmp_path, mount):
    src = tmp_path / "src"
    _shards(src)
    first, _ = _mounted(mount, src, "first")
    shardfs_cmd("index", "--rebuild", str(src), check=True)
    seen, log = _mounted(mount, src, "rebuilt")
    assert "was written again since" in log and MAPPED not in log
    assert seen == first


def test_a_damaged_or_truncated_saved_view_is_ignored_and_written_again(tmp_path, mount):
    src = tmp_path / "src"
    _shards(src)
    first, _ = _mounted(mount, src, "first")
    path = _view_file(src)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:  # one byte of the arrays (past the header, before the names)
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    seen, log = _mounted(mount, src, "damaged")
    assert "not used: unreadable or damaged (its checksum does not match" in log and MAPPED not in log
    assert SAVED in log and seen == first

    os.truncate(_view_file(src), size - 100)
    seen, log = _mounted(mount, src, "truncated")
    assert "not used: unreadable or damaged" in log and MAPPED not in log
    assert SAVED in log and seen == first

    seen, log = _mounted(mount, src, "written again")
    assert MAPPED in log and seen == first


def test_other_view_options_do_not_use_the_saved_view(tmp_path, mount):
    src = tmp_path / "src"
    _shards(src)
    plain, _ = _mounted(mount, src, "plain")
    folders, log = _mounted(mount, src, "imagefolder", "--layout", "imagefolder")
    assert MAPPED not in log and SAVED in log
    assert "3/k1.jpg" in folders and "k1.jpg" not in folders and "k1.jpg" in plain
    again, log = _mounted(mount, src, "plain again")  # each set of options keeps its own
    assert MAPPED in log and again == plain
    assert snapshot.place([str(src)], None, None, Columns())[0] != \
        snapshot.place([str(src)], None, layouts.from_options("imagefolder", None), Columns())[0]


def test_saved_views_turned_off_are_neither_written_nor_mapped(tmp_path, mount, monkeypatch):
    src = tmp_path / "src"
    _shards(src)
    on, _ = _mounted(mount, src, "on")
    view_file = _view_file(src)
    monkeypatch.setenv("SHARDFS_SAVED_VIEW", "0")
    os.unlink(view_file)
    m = mount(src, options=("--index-dir", str(tmp_path / "idx")), name="off")
    assert _served(m.path) == on
    shardfs_cmd("umount", m.path, check=True)
    log = m.log()
    assert "index ready in" in log and SAVED not in log and MAPPED not in log and "saved view" not in log
    assert not os.path.exists(view_file)


def test_an_index_kept_in_the_index_dir_maps_while_what_is_beside_the_shard_stays(tmp_path, mount):
    src = tmp_path / "src"
    _shards(src)
    beside = str(src / "a.tar") + ".shardfs-idx"
    os.mkdir(beside)  # not an index: a.tar's goes to the index directory
    first, log = _mounted(mount, src, "first")
    assert any(n.startswith("a.tar.") for n in os.listdir(tmp_path / "idx"))
    again, log = _mounted(mount, src, "again")
    assert MAPPED in log and again == first
    os.rmdir(beside)  # the index beside the shard would now be looked for first
    seen, log = _mounted(mount, src, "moved")
    assert "a.tar: the places its index is looked for first hold something else now" in log and MAPPED not in log
    assert seen == first


def _saved_again_with(src, change) -> None:
    """The saved view written again by its own writer, changed by ``change(table_arrays, tree)``
    (the table's arrays by name, and the tree whose arrays are saved): every checksum good."""
    path = _view_file(src)
    with open(path, "rb") as f:
        _, _, _, length = snapshot._HEADER.unpack(f.read(snapshot._HEADER.size))
        key = json.loads(f.read(length))["key"]
    index_dir = str(src.parent / "idx")
    view, derived = snapshot.load(path, key, find_shards([str(src)]), index_dir)
    arrays = {name: np.array(a) for name, a in derived.items()}
    change(arrays, view.tree)
    assert snapshot.save(path, key, view, arrays, index_dir)


def test_a_saved_view_whose_arrays_do_not_hold_together_is_refused_and_made_again(tmp_path, mount):
    """A saved view's arrays are trusted behind their CRCs alone: arrays that point outside
    themselves (an edited file, a writer's bug) are refused by the table's checks before the loop
    follows them, and the view is merged from the indexes and saved again."""
    src = tmp_path / "src"
    _shards(src)
    first, _ = _mounted(mount, src, "first")

    def parent_past_the_directories(arrays, tree):
        arrays["dir_parent"][-1] = len(arrays["dir_parent"]) + 1000

    def children_backwards(arrays, tree):
        arrays["child_start"][1] = arrays["child_start"][-1] + 1

    for change in (parent_past_the_directories, children_backwards):
        _saved_again_with(src, change)
        seen, log = _mounted(mount, src, change.__name__)
        assert "not used: its arrays do not hold together" in log and MAPPED not in log
        assert SAVED in log and seen == first
        seen, log = _mounted(mount, src, change.__name__ + " again")  # the view saved anew is mapped
        assert MAPPED in log and seen == first


def test_mtimes_past_what_nanoseconds_hold_are_served_at_the_end_of_the_range(tmp_path, mount):
    """Seconds as doubles (a saved view's, or an index's) cast to int64 nanoseconds would be
    undefined past 2**63 ns: served at the end of the range instead (NaN as 0)."""
    src = tmp_path / "src"
    _shards(src)
    _mounted(mount, src, "first")

    def far_mtimes(arrays, tree):
        tree.mtime = np.full(len(tree.mtime), float("nan"))
        tree.mtime[:2] = [2.0**70, -2.0**70]

    _saved_again_with(src, far_mtimes)
    m = mount(src, options=("--index-dir", str(src.parent / "idx")), name="far")
    assert MAPPED in m.log()
    mtimes = sorted(os.lstat(os.path.join(folder, name)).st_mtime_ns
                    for folder, dirs, files in os.walk(m.path) for name in files)
    assert mtimes[0] == -9_200_000_000 * 10**9 and mtimes[-1] == 9_200_000_000 * 10**9 and mtimes[1] == 0


def test_the_code_that_makes_a_view_includes_the_formats_subpackages():
    """A change to what a squashfs offset means (formats/squashfs/) makes views anew, as one to
    formats/*.py does."""
    files = {os.path.relpath(p, os.path.dirname(os.path.dirname(snapshot.__file__))) for p in snapshot.code_files()}
    assert {"formats/squashfs/layout.py", "formats/squashfs/inodes.py", "formats/tar.py", "view/tree.py"} <= files
