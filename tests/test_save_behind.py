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
    assert again.tree.names == view.tree.names


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
