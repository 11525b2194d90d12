"""The merged tree: merging, conflicts, and lookups that stay right even when hashes collide."""

import numpy as np

from shardfs.index import shard_index as index
from shardfs.view import tree
from tarcraft import archive, member


def _indexes(tmp_path, shards):
    out = []
    for i, members in enumerate(shards):
        path = tmp_path / f"s{i}.tar"
        path.write_bytes(archive(*(member(n, d) for n, d in members)))
        out.append(index.build(str(path)))
    return out


def test_classes_merge_across_shards_and_duplicates_resolve_to_last(tmp_path):
    ixs = _indexes(tmp_path, [
        [(b"train/a/1.jpg", b"a1"), (b"train/b/1.jpg", b"b1"), (b"dup.txt", b"first")],
        [(b"train/a/2.jpg", b"a2"), (b"dup.txt", b"second"), (b"train/b", b"file named like a dir")],
    ])
    t = tree.Tree(["s0.tar", "s1.tar"], ixs)
    assert t.lookup(b"train/a") and t.is_dir(t.lookup(b"train/a"))
    subdirs, files = t.children(t.lookup(b"train/a"))
    assert sorted(t.name(int(m)) for m in files) == [b"train/a/1.jpg", b"train/a/2.jpg"]
    dup = t.member(t.lookup(b"dup.txt"))
    assert t.shard[dup] == 1
    assert t.is_dir(t.lookup(b"train/b"))  # the directory wins over a file of the same path
    assert any("dup.txt is in several shards (s0.tar, s1.tar); serving the one in s1.tar" in p for p in t.problems)
    assert any("train/b: a file in s1.tar and a directory elsewhere" in p for p in t.problems)
    assert t.lookup(b"train/c") == 0 and t.lookup(b"") == 1
    assert t.nfiles == 4 and t.total_size == len(b"a1b1a2second")


def test_lookups_are_exact_when_every_hash_collides(tmp_path, monkeypatch):
    monkeypatch.setattr(index, "path_hash", lambda path: 42)
    monkeypatch.setattr(tree, "path_hash", lambda path: 42)
    names = [f"d/{i}.bin".encode() for i in range(50)]
    ixs = _indexes(tmp_path, [[(n, n) for n in names[:25]], [(n, n) for n in names[25:]]])
    for ix in ixs:  # the compiled scanner hashes the names itself
        ix.hash = np.full(len(ix), 42, np.uint64)
    t = tree.Tree(["s0.tar", "s1.tar"], ixs)
    assert t.problems == []  # equal hashes of different names are not duplicates
    for n in names:
        m = t.member(t.lookup(n))
        assert t.name(m) == n and int(t.size[m]) == len(n)
    assert t.lookup(b"d/50.bin") == 0
    assert np.all(t.lookup_hash == 42)


def test_members_by_hash_are_sorted_also_when_top_bits_tie():
    rng = np.random.default_rng(7)
    hashes = rng.integers(0, 2**64, 5000, dtype=np.uint64)
    hashes[:2000] &= np.uint64(0xFFFF_0000_0000_0FFF)  # the key's top bits tie often, the low ones differ
    ids = np.flatnonzero(rng.random(5000) < 0.8).astype(np.uint32)
    ordered, found = tree._by_hash(ids, hashes)
    assert sorted(ordered.tolist()) == ids.tolist()
    assert (hashes[ordered][1:] >= hashes[ordered][:-1]).all()
    assert found.tolist() == hashes[ordered].tolist()


def test_a_remount_reads_the_members_into_the_trees_arrays_and_serves_the_same_tree(tmp_path, monkeypatch):
    """A remount reads the indexes' member columns into one set of arrays that the tree takes over
    (member_columns.py); what it serves is the first mount's tree, duplicates and directories too."""
    from shardfs.index import member_columns
    from shardfs.view import dataset

    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        members = [(f"train/c{c}/{i}_{k}.jpg".encode(), bytes([i, c, k]) * (k + 1)) for c in range(3) for k in range(4)]
        members += [(b"dup.txt", f"from {i}".encode()), (f"only{i}/x.bin".encode(), b"x" * i)]
        (src / f"s{i}.tar").write_bytes(archive(*(member(n, d) for n, d in members)))
    covered = []
    real_covers = member_columns.MemberColumns.covers
    monkeypatch.setattr(member_columns.MemberColumns, "covers",
                        lambda self, ixs: covered.append(real_covers(self, ixs)) or covered[-1])
    first = dataset.open_dataset([str(src)], str(tmp_path / "ix"))
    again = dataset.open_dataset([str(src)], str(tmp_path / "ix"))
    assert (first.built, again.built) == (5, 0)
    assert covered == [True]  # built indexes were merged as they came (TreeBuilder); loaded ones read in place
    a, b = first.tree, again.tree
    assert a.names[:] == b.names[:] and a.problems == b.problems and [d.path for d in a.dirs] == [d.path for d in b.dirs]
    for name in ("name_end", "kind", "offset", "size", "mode", "mtime", "shard", "lookup_hash", "lookup_id",
                 "listing", "listing_start"):
        assert getattr(a, name).tolist() == getattr(b, name).tolist(), name
    assert a.nfiles == 5 * 13 + 1  # dup.txt once
    dup = b.member(b.lookup(b"dup.txt"))
    assert b.shard[dup] == 4 and b.name(dup) == b"dup.txt"
    assert b.name(b.member(b.lookup(b"train/c2/3_1.jpg"))) == b"train/c2/3_1.jpg"


def test_member_columns_take_nothing_that_does_not_fit():
    from shardfs.index import member_columns

    cols = member_columns.MemberColumns(index_bytes=2 * member_columns.MIN_BYTES_PER_MEMBER)  # room for 3
    one = {name: np.arange(2, dtype=dtype) for name, dtype in member_columns.COLUMNS}
    assert cols.take(one) and cols.used == 2 and one["offset"].base is cols.arrays["offset"]
    two = {name: np.arange(2, dtype=dtype) for name, dtype in member_columns.COLUMNS}
    assert not cols.take(two) and cols.used == 2 and two["offset"].base is None
    wrong = {name: np.arange(1, dtype=np.int32) for name, _ in member_columns.COLUMNS}
    assert not cols.take(wrong) and cols.used == 2


def _same_trees(a: tree.Tree, b: tree.Tree) -> None:
    for name in tree.Tree.SAVED:
        assert getattr(a, name).tolist() == getattr(b, name).tolist(), name
    assert a.names[:] == b.names[:] and a.shard_names == b.shard_names and a.problems == b.problems
    assert a.dirs == b.dirs and a.dir_id == b.dir_id and a.subdirs == b.subdirs
    assert a.symlinks == b.symlinks and list(a.sparse) == list(b.sparse)
    assert all(a.sparse[m].tolist() == b.sparse[m].tolist() for m in a.sparse)
    assert (a.ndirs, a.nfiles, a.total_size, a.dir_nlink) == (b.ndirs, b.nfiles, b.total_size, b.dir_nlink)


def test_a_tree_made_as_the_indexes_come_is_the_tree_merged_at_once(tmp_path):
    """TreeBuilder (a first mount feeds it during the builds) against Tree over the same indexes:
    duplicates, a file shadowed by a directory, an explicit directory's mode and mtime, a link, a
    sparse member, a damaged shard's members before the damage, an empty shard, and enough
    members that its arrays and names grow several times."""
    from tarcraft import old_sparse_member

    shards = [
        archive(member(b"a/1.jpg", b"a1"), member(b"dup.txt", b"first"), member(b"d/", typeflag=b"5", mode=0o700),
                member(b"a/link", typeflag=b"2", linkname=b"1.jpg")),
        archive(member(b"a/2.jpg", b"a2"), member(b"dup.txt", b"second"), member(b"d", b"a file named like a dir"),
                old_sparse_member(b"sp.bin", [(0, b"x" * 512), (4096, b"y" * 512)], 8192)),
        archive(),
        archive(*(member(b"many/%05d-%s.bin" % (i, b"n" * (i % 90)), b"%d" % i) for i in range(3000))),
        archive(member(b"cut/1.bin", b"1" * 700), member(b"cut/2.bin", b"2" * 700))[:1536],  # cut in 2.bin's data
    ]
    paths = []
    for i, data in enumerate(shards):
        path = tmp_path / f"s{i}.tar"
        path.write_bytes(data)
        paths.append(str(path))
    ixs = [index.build(p) for p in paths]
    assert ixs[4].error and len(ixs[4]) == 1 and len(ixs[2]) == 0  # (what the shards are meant to hold)
    names = [f"s{i}.tar" for i in range(len(ixs))]

    builder = tree.TreeBuilder()
    builder._members = tree._Members(members=2, name_bytes=16)  # grown from the first shard on
    for ix in ixs:
        builder.add(ix)
    grown = builder.tree(names, default_mtime=1234.5)
    at_once = tree.Tree(names, ixs, default_mtime=1234.5)
    _same_trees(grown, at_once)
    assert grown.dirs[grown.dir_id[b"d"]].mode == 0o700 and grown.dirs[grown.dir_id[b"many"]].mtime == 1234.5
    assert grown.name(grown.member(grown.lookup(b"many/02999-" + b"n" * 29 + b".bin"))) == \
        b"many/02999-" + b"n" * 29 + b".bin"
    assert grown.shard[grown.member(grown.lookup(b"dup.txt"))] == 1 and grown.lookup(b"cut/1.bin")
    assert any("a directory elsewhere" in p for p in grown.problems)
