"""SIGHUP: shards added and removed under a live mount, without unmounting."""

import errno
import os

import pytest

from conftest import needs_fuse
from tarcraft import archive, member

pytestmark = needs_fuse


def test_sighup_adds_new_shards_and_removed_ones_answer_eio(tmp_path, mount):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.tar").write_bytes(archive(member(b"cls/a.txt", b"from a\n")))
    (src / "b.tar").write_bytes(archive(member(b"cls/b.txt", b"from b\n")))
    m = mount(src)
    root = m.path
    assert sorted(os.listdir(os.path.join(root, "cls"))) == ["a.txt", "b.txt"]
    assert not os.path.exists(os.path.join(root, "cls", "c.txt"))  # now a cached negative lookup

    (src / "c.tar").write_bytes(archive(member(b"cls/c.txt", b"from c\n"), member(b"new/d.txt", b"d\n")))
    os.unlink(src / "b.tar")
    m.rescan()
    assert (m.stats()["shards"], m.stats()["shards_broken"]) == (3, 1)

    assert os.path.ismount(root)
    assert sorted(os.listdir(os.path.join(root, "cls"))) == ["a.txt", "b.txt", "c.txt"]
    assert open(os.path.join(root, "new", "d.txt"), "rb").read() == b"d\n"
    assert open(os.path.join(root, "cls", "a.txt"), "rb").read() == b"from a\n"
    try:
        open(os.path.join(root, "cls", "b.txt"), "rb").read()
        raise AssertionError("a vanished shard must answer EIO")
    except OSError as exc:
        assert exc.errno == errno.EIO
    log = m.log()
    assert "b.tar: disappeared" in log and "rescan:" in log
    # c.txt was looked up (missing) before the rescan: visible once the negative entry expires
    # (NEGATIVE_TIMEOUT); a listing shows it at once, as asserted above.


def test_sighup_with_a_shard_rewritten_in_place_answers_eio(tmp_path, mount):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.tar").write_bytes(archive(member(b"a.txt", b"A" * 100)))
    m = mount(src)
    (src / "a.tar").write_bytes(archive(member(b"a.txt", b"B" * 300)))
    m.rescan()
    assert m.stats()["shards_broken"] == 1
    try:
        data = open(os.path.join(m.path, "a.txt"), "rb").read()
        raise AssertionError(f"read {data[:5]!r} from a rewritten shard")
    except OSError as exc:
        assert exc.errno == errno.EIO
    assert "remount to serve its new contents" in m.log()


def test_a_rescan_tells_of_each_broken_shard_as_it_marks_it(tmp_path):
    """Each shard's ``when_broken`` hooks (the daemon's slots add one: fuse/table.py) are told when the
    rescan marks it: the compiled loop stops serving a changed shard's cached bytes then, not once
    the whole new view is built and served."""
    from shardfs.view import dataset

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.tar").write_bytes(archive(member(b"a.txt", b"A" * 100)))
    (src / "b.tar").write_bytes(archive(member(b"b.txt", b"B")))
    view = dataset.open_dataset([str(src)], index_dir=str(tmp_path / "idx"))
    (src / "a.tar").write_bytes(archive(member(b"a.txt", b"C" * 300)))
    told = []
    for shard in view.shards:
        shard.when_broken(lambda shard=shard: told.append((shard.path, shard.broken)))
    new = dataset.rescan(view, [str(src)], index_dir=str(tmp_path / "idx"))
    assert told == [(str(src / "a.tar"), "changed on disk; remount to serve its new contents")]
    assert [s.path for s in new.shards if s.broken] == [str(src / "a.tar")]


def test_a_read_that_finds_its_shard_changed_tells_it_once_through_every_wrapper(tmp_path):
    """Not only a rescan: a storage read that finds the file changed marks the shard, and the
    shard the caches and the compiled loop know (the file itself, its decompressed tar, a peer
    shard around either) is told once; the slots then stop serving it in C (``direct`` off)."""
    import gzip

    from shardfs.formats.ctar import StreamShard
    from shardfs.fuse.table import Slots
    from shardfs.storage.base import ShardIOError
    from shardfs.storage.local import LocalShard
    from shardfs.storage.peers.shard import PeerShard

    tar = archive(member(b"a.txt", b"A" * 5000))
    for compressed in (False, True):
        path = tmp_path / ("a.tar.gz" if compressed else "a.tar")
        path.write_bytes(gzip.compress(tar) if compressed else tar)
        st = path.stat()
        stored = LocalShard(str(path), st.st_size, st.st_mtime_ns)
        served = PeerShard(StreamShard(stored, len(tar)) if compressed else stored, net=None)
        slots = Slots()
        # as the caches' first publication makes them: the inner one's by an index build's fill
        slot, inner_slot = slots.slot(served), slots.slot(served.inner)
        slot.direct = inner_slot.direct = True
        told = []
        served.when_broken(lambda: told.append(served.broken))
        storage = served.inner  # what the peer shard reads where no peer gives the bytes
        path.write_bytes(path.read_bytes() + b"\0" * 512)  # rewritten: another size
        for _ in range(2):
            with pytest.raises(ShardIOError):
                storage.pread(512, 512)
        assert told == ["changed since its index was built (size or mtime differ)"], compressed
        assert served.broken == stored.broken == told[0]
        assert slot.direct is inner_slot.direct is False  # slots.forget ran: the compiled loop answers neither


def test_a_wrapper_marked_from_above_tells_the_shard_it_wraps_too(tmp_path):
    """A rescan marks the shard the view holds (a peer shard around a decompressed tar): the
    slots of the shards under it (an index build's fill publishes the inner one) are told as well."""
    from shardfs.formats.ctar import StreamShard
    from shardfs.fuse.table import Slots
    from shardfs.storage.local import LocalShard
    from shardfs.storage.peers.shard import PeerShard

    path = tmp_path / "a.tar.gz"
    path.write_bytes(b"\x1f\x8b" + bytes(100))
    st = path.stat()
    stored = LocalShard(str(path), st.st_size, st.st_mtime_ns)
    served = PeerShard(StreamShard(stored, 10240), net=None)
    slots = Slots()
    held = [slots.slot(s) for s in (served, served.inner, stored)]
    for slot in held:
        slot.direct = True
    told = []
    for shard in (served, served.inner, stored):
        shard.when_broken(lambda shard=shard: told.append(type(shard).__name__))
    served.mark_broken("changed on disk")
    assert sorted(told) == ["LocalShard", "PeerShard", "StreamShard"]
    assert served.broken == served.inner.broken == stored.broken == "changed on disk"
    assert [slot.direct for slot in held] == [False] * 3
    served.mark_broken("again")  # once only
    assert len(told) == 3 and stored.broken == "changed on disk"
