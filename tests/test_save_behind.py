"""The indexes a first view builds are saved on a thread of their own while the tree is merged
(view/dataset.py _SaveBehind): nothing is lost, the view knows where each went, and a view made
before they are saved says so only once they are (Dataset.settle)."""

from __future__ import annotations

import os

from tarcraft import archive, member

from shardfs.index import index_file
from shardfs.index import store as index_store
from shardfs.view import dataset


def _shards(folder, count: int) -> list[str]:
    folder.mkdir()
    paths = []
    for s in range(count):
        path = folder / f"part-{s:03d}.tar"
        path.write_bytes(archive(*(member(f"c{s % 3}/f{s}-{i}.bin".encode(), bytes([s, i]) * 50) for i in range(20))))
        paths.append(str(path))
    return paths


def test_builds_left_unsaved_are_saved_by_settle(tmp_path):
    paths = _shards(tmp_path / "shards", 6)
    got = dataset.index_shards(paths, None, 2, save=False)
    assert [how for _, _, how in got] == [index_store.TO_BE_SAVED] * 6
    assert not any(os.path.exists(p + index_store.INDEX_SUFFIX) for p in paths)

    view = dataset.open_dataset([str(tmp_path / "shards")], save_behind=True)
    assert view.built == 6
    view.settle()
    for shard, ident in zip(view.shards, view.index_ids):
        assert shard.index_path == shard.path + index_store.INDEX_SUFFIX
        assert list(ident) == list(index_file.file_id(os.stat(shard.index_path)))
        assert len(index_file.load(shard.index_path)) == 20
    again = dataset.open_dataset([str(tmp_path / "shards")])
    assert again.built == 0 and again.index_ids == view.index_ids
    assert again.tree.names[:] == view.tree.names[:]


def test_an_index_that_cannot_be_saved_leaves_the_view_without_ids(tmp_path, caplog):
    """One shard's index has nowhere to go (a folder stands at both of its places): the view
    serves every file all the same, but a saved view cannot be made of it."""
    paths = _shards(tmp_path / "shards", 3)
    places = tmp_path / "index-dir"
    for place in index_store.candidate_paths(paths[1], str(places)):
        os.makedirs(place)
    view = dataset.open_dataset([str(tmp_path / "shards")], str(places), save_behind=True)
    assert view.index_ids is not None  # (not known yet: the saves may be under way)
    view.settle()
    assert view.index_ids is None
    assert [s.index_path is not None for s in view.shards] == [True, False, True]
    assert view.tree.nfiles == 60
    assert "could not save its index anywhere" in caplog.text



def test_indexes_coming_out_of_order_join_the_tree_in_order(tmp_path):
    """A first view's indexes, as the builds give them (view/dataset.py _InTreeOrder): the tree
    builder takes the served ones in the tree's order, each once those before it came; a shard
    that failed or has nothing before its damage is left out; the tree is the one merged at once."""
    from shardfs.index import shard_index
    from shardfs.view.tree import Tree, TreeBuilder

    paths = _shards(tmp_path / "shards", 5)
    ixs = {p: shard_index.build(p) for p in paths}
    (tmp_path / "shards" / "part-002.tar").write_bytes(b"\1" * 1024)  # not a tar: an error and no member
    ixs[paths[2]] = shard_index.build(paths[2])
    assert ixs[paths[2]].error and not len(ixs[paths[2]])

    coming = dataset._InTreeOrder(paths, TreeBuilder())
    for p in (paths[3], paths[1], paths[4]):
        coming(p, ixs[p], index_store.TO_BE_SAVED)
    assert coming.added == []  # the first is still to come
    coming(paths[0], None, f"{paths[0]}: cannot read")
    assert coming.added == [paths[1]]
    coming(paths[2], ixs[paths[2]], "built")
    assert coming.added == [paths[1], paths[3], paths[4]]
    names = [os.path.basename(p) for p in coming.added]
    grown, at_once = coming.builder.tree(names), Tree(names, [ixs[p] for p in coming.added])
    assert grown.names[:] == at_once.names[:] and grown.lookup_id.tolist() == at_once.lookup_id.tolist()
    assert grown.shard.tolist() == at_once.shard.tolist() == [0] * 20 + [1] * 20 + [2] * 20
