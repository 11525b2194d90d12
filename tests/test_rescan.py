"""SIGHUP: shards added and removed under a live mount, without unmounting."""

import errno
import os

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
    """The daemon passes its slots' ``forget``: the compiled loop stops serving a changed shard's
    cached bytes when the rescan marks it, not once the whole new view is built and served."""
    from shardfs.view import dataset

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.tar").write_bytes(archive(member(b"a.txt", b"A" * 100)))
    (src / "b.tar").write_bytes(archive(member(b"b.txt", b"B")))
    view = dataset.open_dataset([str(src)], index_dir=str(tmp_path / "idx"))
    (src / "a.tar").write_bytes(archive(member(b"a.txt", b"C" * 300)))
    told = []
    new = dataset.rescan(view, [str(src)], index_dir=str(tmp_path / "idx"),
                         on_broken=lambda shard: told.append((shard.path, shard.broken)))
    assert told == [(str(src / "a.tar"), "changed on disk; remount to serve its new contents")]
    assert [s.path for s in new.shards if s.broken] == [str(src / "a.tar")]
