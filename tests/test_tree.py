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
