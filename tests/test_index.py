"""Persisted indexes: a remount loads them instead of reading shard headers; a changed shard rebuilds."""

import dataclasses
import hashlib
import io
import json
import os
import time

import numpy as np
import pytest
from conftest import needs_fuse, shardfs_cmd
from remote_servers import tree_digests
from tarcraft import archive, member, old_sparse_member

from shardfs.index import index_file
from shardfs.index import shard_index as index
from shardfs.index import store
from shardfs.index.member_columns import MemberColumns


@needs_fuse
def test_index_command_then_mount_builds_nothing(tar_shards, sample_tree, mount):
    done = shardfs_cmd("index", str(tar_shards), check=True)
    assert "4 shards, 72 members; 4 indexes built" in done.stdout
    for shard in tar_shards.glob("*.tar"):
        assert os.path.exists(str(shard) + index.INDEX_SUFFIX)
    again = shardfs_cmd("index", str(tar_shards), check=True)
    assert "0 indexes built, 4 current" in again.stdout
    m = mount(tar_shards)
    assert m.stats()["indexes_built"] == 0  # every index loaded from beside its shard
    assert tree_digests(m.path) == tree_digests(sample_tree)


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


# ---- the index file (index_file.py) -------------------------------------------------------------


def _odd_shard(tmp_path) -> str:
    """A shard with what an index records besides plain files: a directory member, a symlink, a
    label, a name that is not UTF-8, a name given twice (a warning)."""
    path = tmp_path / "odd.tar"
    path.write_bytes(archive(
        member(b"train/", typeflag=b"5", mode=0o700),
        member(b"train/a/\xff.jpg", b"J" * 700),
        member(b"train/a/k.cls", b"4"),
        member(b"train/link", typeflag=b"2", linkname=b"a/k.cls"),
        member(b"top.txt", b"first"),
        member(b"top.txt", b"second"),
    ))
    return str(path)


def _assert_same(a: index.ShardIndex, b: index.ShardIndex) -> None:
    for f in dataclasses.fields(index.ShardIndex):
        if f.name in ("stored_at", "stored_id", "legacy"):
            continue  # not persisted
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), f.name
        elif f.name == "dirs":
            assert list(x) == list(y)
        else:
            assert x == y, f.name


def test_index_file_round_trip_keeps_every_field(tmp_path):
    ix = index.build(_odd_shard(tmp_path))
    ix.shard_tag = '"etag-1"'
    assert ix.symlinks and len(ix.cls_member) == 1 and ix.warnings and len(ix.dirs) == 3
    path = str(tmp_path / "odd.idx")
    index_file.save(ix, path)
    with open(path, "rb") as f:
        assert f.read(len(index_file.MAGIC)) == index_file.MAGIC
    _assert_same(ix, index_file.load(path))
    with open(path, "rb") as f:  # as fetched from beside a remote object
        _assert_same(ix, index_file.load(io.BytesIO(f.read())))
    empty = dataclasses.replace(ix, names=b"", dirs=[], symlinks={}, warnings=[], error="truncated",
                                cls_member=np.empty(0, np.int32), cls_value=np.empty(0, np.int64),
                                **{name: getattr(ix, name)[:0] for name in index_file.ARRAYS[:8]})
    index_file.save(empty, path)
    _assert_same(empty, index_file.load(path))


def _save_npz(ix: index.ShardIndex, path: str) -> None:
    """An index as shardfs wrote them before the flat file (version 2)."""
    meta = {"version": 2, "format": ix.format, "shard_size": ix.shard_size, "shard_mtime_ns": ix.shard_mtime_ns,
            "shard_tag": ix.shard_tag, "shard_fingerprint": ix.shard_fingerprint,
            "dirs": [d.decode("utf-8", "surrogateescape") for d in ix.dirs],
            "symlinks": {str(i): t.decode("utf-8", "surrogateescape") for i, t in ix.symlinks.items()},
            "warnings": ix.warnings, "error": ix.error}
    arrays = {name: getattr(ix, name) for name in index_file.ARRAYS}
    arrays["names"] = np.frombuffer(ix.names, dtype=np.uint8)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with open(path, "wb") as out:
        np.savez(out, **arrays)


def test_a_version_2_index_whose_member_is_not_an_array_is_damaged_not_a_crash(tmp_path):
    """numpy gives an .npz member without the .npy magic as raw bytes (found by fuzzing: the loader
    raised AttributeError on them, which no caller takes for damage)."""
    import zipfile

    built, _ = store.load_or_build(_odd_shard(tmp_path))
    _save_npz(built, built.stored_at)
    damaged = str(tmp_path / "damaged.idx")
    with zipfile.ZipFile(built.stored_at) as src, zipfile.ZipFile(damaged, "w") as out:
        for info in src.infolist():
            out.writestr(info.filename, b"not an array" if info.filename == "offset.npy" else src.read(info))
    with pytest.raises(ValueError, match="not an array"):
        index_file.load(damaged)


def test_an_index_of_version_2_is_used_and_rewritten_in_the_flat_format(tmp_path, monkeypatch):
    shard = _odd_shard(tmp_path)
    built, _ = store.load_or_build(shard)
    _save_npz(built, built.stored_at)

    def fail(*_a, **_k):
        raise AssertionError("the shard was scanned although its version 2 index is current")

    monkeypatch.setattr(index, "build", fail)
    monkeypatch.setattr(store, "build", fail)
    with open(built.stored_at, "rb") as f:  # as fetched from beside a remote object
        _assert_same(built, index_file.load(io.BytesIO(f.read())))
    ix, how = store.load_or_build(shard)
    assert how == "loaded" and not ix.legacy
    _assert_same(built, ix)
    with open(built.stored_at, "rb") as f:
        assert f.read(len(index_file.MAGIC)) == index_file.MAGIC  # converted, not rebuilt
    _assert_same(built, index_file.load(built.stored_at))


def test_sparse_maps_round_trip_through_the_index_file(tmp_path):
    runs = [(i * 5000, bytes([i]) * (10 + i)) for i in range(1, 30)]
    path = tmp_path / "s.tar"
    path.write_bytes(archive(member(b"plain", b"p"), old_sparse_member(b"one", runs, 200_000),
                             member(b"hard", typeflag=b"1", linkname=b"one"),
                             old_sparse_member(b"two", runs[:2], 20_000)))
    ix = index.build(str(path))
    assert sorted(ix.sparse) == [1, 2, 3] and len(ix.sparse[1]) == 29 and len(ix.sparse[3]) == 2
    index_file.save(ix, str(tmp_path / "s.idx"))
    back = index_file.load(str(tmp_path / "s.idx"))
    assert sorted(back.sparse) == sorted(ix.sparse)
    assert all(np.array_equal(back.sparse[m], ix.sparse[m]) for m in ix.sparse)
    assert np.array_equal(back.size, ix.size) and int(back.size[2]) == 200_000  # the hard link: the real size


def _save_version_3(ix: index.ShardIndex, path: str, monkeypatch) -> None:
    """An index as shardfs wrote it before sparse maps (the flat file, version 3)."""
    with monkeypatch.context() as patch:
        patch.setattr(index_file, "INDEX_VERSION", 3)
        patch.setattr(index_file, "SPARSE_ARRAYS", ())
        index_file.save(ix, path)


def _blake2b(path: bytes) -> int:
    """The path hash of index versions up to 4."""
    return int.from_bytes(hashlib.blake2b(path, digest_size=8).digest(), "little")


def test_an_index_of_version_4_is_loaded_with_its_hashes_made_again(tmp_path, monkeypatch):
    """Version 4 hashed names with BLAKE2b: its file is read, the hashes computed again from its
    names (the shard not read), and written back as version 5; the mount finds every file."""
    shard = _odd_shard(tmp_path)
    built, _ = store.load_or_build(shard)
    want = built.hash.copy()
    ends = built.name_end.tolist()
    built.hash = np.array([_blake2b(built.names[a:b]) for a, b in zip([0] + ends[:-1], ends)], np.uint64)
    assert not np.array_equal(built.hash, want)
    with monkeypatch.context() as patch:
        patch.setattr(index_file, "INDEX_VERSION", 4)
        index_file.save(built, built.stored_at)
    for columns in (None, MemberColumns(os.path.getsize(built.stored_at))):
        back = index_file.load(built.stored_at, columns)
        assert back.legacy and back.hash.tolist() == want.tolist()
    ix, how = store.load_or_build(shard)
    assert how == "loaded" and not ix.legacy and ix.hash.tolist() == want.tolist()
    with open(built.stored_at, "rb") as f:
        assert int.from_bytes(f.read(12)[8:12], "little") == index_file.INDEX_VERSION == 5


def test_an_index_of_version_3_is_used_unless_it_left_members_out(tmp_path, monkeypatch):
    shard = _odd_shard(tmp_path)
    built, _ = store.load_or_build(shard)
    _save_version_3(built, built.stored_at, monkeypatch)
    assert index_file.load(built.stored_at).legacy
    ix, how = store.load_or_build(shard)
    assert how == "loaded" and not ix.legacy and ix.sparse == {}
    with open(built.stored_at, "rb") as f:  # rewritten as version 5, not rebuilt
        assert int.from_bytes(f.read(12)[8:12], "little") == index_file.INDEX_VERSION == 5
    # One whose warnings say a sparse file was left out is rebuilt: this version serves it.
    built.warnings = built.warnings + ["odd.tar: member s.bin: GNU sparse file not served"]
    _save_version_3(built, built.stored_at, monkeypatch)
    ix, how = store.load_or_build(shard)
    assert how == "built" and not any("sparse" in w for w in ix.warnings)


def _array_span(data: bytes, name: str) -> tuple[int, int]:
    """Where array ``name`` lies in an index file: (start, end)."""
    meta_len, body = int.from_bytes(data[12:16], "little"), 32  # the body follows the 32-byte header
    meta = json.loads(data[body : body + meta_len])
    pos = body + meta_len + (-meta_len % 8)
    for array, dtype, count in meta["arrays"]:
        nbytes = np.dtype(dtype).itemsize * count
        if array == name:
            return pos, pos + nbytes
        pos += nbytes + (-nbytes % 8)
    raise KeyError(name)


def _damage(path: str, how: str) -> None:
    with open(path, "rb") as f:
        data = bytearray(f.read())
    if how == "offset":  # one bit of a member's offset: its bytes would be read from elsewhere
        start, _ = _array_span(bytes(data), "offset")
        data[start + 1] ^= 0x02
    elif how == "names":  # one bit of the names, which come last
        data[-3] ^= 0x01
    elif how == "truncated":
        data = data[: len(data) - 9]
    elif how == "garbage":
        data = bytearray(b"not an index at all\n" * 10)
    elif how == "empty":
        data = bytearray()
    with open(path, "wb") as f:
        f.write(data)


@pytest.mark.parametrize("how", ["offset", "names", "truncated", "garbage", "empty"])
def test_a_damaged_index_is_rebuilt_with_a_log_line(tmp_path, caplog, how):
    shard = _odd_shard(tmp_path)
    built, _ = store.load_or_build(shard)
    _damage(built.stored_at, how)
    caplog.set_level("INFO")
    ix, how_obtained = store.load_or_build(shard)
    assert how_obtained == "built"
    assert f"ignoring unreadable index {built.stored_at}" in caplog.text
    _assert_same(built, ix)
    assert store.load_or_build(shard)[1] == "loaded"


@needs_fuse
def test_damaged_and_older_indexes_serve_the_right_bytes(tar_shards, sample_tree, mount):
    from remote_servers import tree_digests

    m = mount(tar_shards, name="first")
    shardfs_cmd("umount", m.path, check=True)
    shards = sorted(str(p) for p in tar_shards.glob("*.tar"))
    _damage(shards[0] + index.INDEX_SUFFIX, "offset")
    _save_npz(index_file.load(shards[1] + index.INDEX_SUFFIX), shards[1] + index.INDEX_SUFFIX)

    m2 = mount(tar_shards, name="second")
    assert m2.stats()["indexes_built"] == 1  # the damaged one; the version 2 one is used
    assert tree_digests(m2.path) == tree_digests(sample_tree)
    assert f"ignoring unreadable index {shards[0]}{index.INDEX_SUFFIX}: damaged" in m2.log()
    with open(shards[1] + index.INDEX_SUFFIX, "rb") as f:
        assert f.read(len(index_file.MAGIC)) == index_file.MAGIC
