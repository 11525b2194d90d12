"""Persisted indexes: a remount loads them instead of reading shard headers; a changed shard rebuilds."""

import os
import time

from conftest import needs_fuse, shardfs_cmd

from shardfs.index import shard_index as index
from shardfs.index import store


def test_index_command_then_mount_builds_nothing(tar_shards, mount):
    done = shardfs_cmd("index", str(tar_shards), check=True)
    assert "4 shards, 72 members; 4 indexes built" in done.stdout
    for shard in tar_shards.glob("*.tar"):
        assert os.path.exists(str(shard) + index.INDEX_SUFFIX)
    again = shardfs_cmd("index", str(tar_shards), check=True)
    assert "0 indexes built, 4 current" in again.stdout


@needs_fuse
def test_remount_loads_persisted_index_and_touch_invalidates(tar_shards, mount):
    m = mount(tar_shards, name="first")
    assert m.stats()["indexes_built"] == 4
    shardfs_cmd("umount", m.path, check=True)

    # Nothing was built: the headers were not scanned (test_index_reads_no_shard_bytes_when_current
    # shows that loading never calls the scanner).
    m2 = mount(tar_shards, name="second")
    assert m2.stats()["indexes_built"] == 0
    shardfs_cmd("umount", m2.path, check=True)

    shard = sorted(tar_shards.glob("*.tar"))[1]
    later = time.time() + 5
    os.utime(shard, (later, later))
    m3 = mount(tar_shards, name="third")
    assert m3.stats()["indexes_built"] == 1
    assert len(os.listdir(os.path.join(m3.path, "train"))) == 6


def test_index_falls_back_to_cache_dir_when_shard_dir_is_read_only(tar_shards, tmp_path):
    shard = str(sorted(tar_shards.glob("*.tar"))[0])
    beside, cached = store.candidate_paths(shard, str(tmp_path / "cache"))
    os.makedirs(beside, exist_ok=True)  # a directory where the index file would go: cannot save there
    ix, how = store.load_or_build(shard, str(tmp_path / "cache"))
    assert how == "built" and os.path.exists(cached)
    again, how = store.load_or_build(shard, str(tmp_path / "cache"))
    assert how == "loaded" and len(again) == len(ix)
    assert again.names == ix.names and (again.offset == ix.offset).all()


def test_index_reads_no_shard_bytes_when_current(tar_shards, monkeypatch):
    shard = str(sorted(tar_shards.glob("*.tar"))[0])
    store.load_or_build(shard)
    from shardfs.formats import tar

    def fail(*_a, **_k):
        raise AssertionError("the shard was scanned although its index is current")

    monkeypatch.setattr(tar.TarFormat, "scan", fail)
    ix, how = store.load_or_build(shard)
    assert how == "loaded" and len(ix) == 18
