"""Hostile and damaged shards: the mount serves every good member and names the bad ones."""

import os

from conftest import needs_fuse
from tarcraft import archive, member

pytestmark = needs_fuse


def test_bad_names_duplicates_truncation_and_garbage(tmp_path, mount):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.tar").write_bytes(archive(
        member(b"/etc/passwd", b"absolute\n"),
        member(b"../../escape.txt", b"climbs\n"),
        member(b"ok/../../x.txt", b"climbs too\n"),
        member(b"good/one.txt", b"one from a\n"),
        member(b"shared/dup.txt", b"dup from a\n"),
    ))
    (src / "b.tar").write_bytes(archive(
        member(b"good/two.txt", b"two\n"),
        member(b"shared/dup.txt", b"dup from b\n"),
    ))
    full = archive(member(b"good/three.txt", b"three\n"), member(b"good/cut.bin", b"x" * 5000))
    (src / "c.tar").write_bytes(full[:512 + 512 + 512 + 2000])  # cut inside cut.bin's data
    (src / "garbage.tar").write_bytes(os.urandom(4096))
    (src / "empty.tar").write_bytes(b"")
    (src / "notes.txt").write_text("not a shard, ignored\n")

    m = mount(src)
    files = sorted(os.path.relpath(os.path.join(d, f), m.path) for d, _, fs in os.walk(m.path) for f in fs)
    # /etc/passwd is served as etc/passwd inside the mount, as tar -x writes it inside its -C directory;
    # names that resolve outside the tree with '..' are never served (escape.txt, x.txt)
    assert files == ["etc/passwd", "good/one.txt", "good/three.txt", "good/two.txt", "shared/dup.txt"]
    read = lambda p: open(os.path.join(m.path, p), "rb").read()  # noqa: E731
    assert read("etc/passwd") == b"absolute\n"
    assert read("good/one.txt") == b"one from a\n"
    assert read("good/three.txt") == b"three\n"
    assert read("shared/dup.txt") == b"dup from b\n"  # documented rule: the last shard in name order wins
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "x.txt").exists()

    report = m.output  # what the user saw at mount time
    assert "a.tar: member names with '..': 2 refused: they resolve outside the tree (../../escape.txt, ok/../../x.txt)" in report
    assert "shared/dup.txt is in several shards (a.tar, b.tar); serving the one in b.tar" in report
    assert "c.tar: truncated at offset 1024: member good/cut.bin" in report
    assert m.stats()["shards_damaged"] == 1  # c.tar, served up to the cut (garbage.tar serves nothing)
    assert "garbage.tar: not a tar archive" in report
    assert m.stats()["problems"] == 4  # one line for the names with '..', the duplicate, the cut, the garbage


def test_nul_in_pax_path_is_refused(tmp_path, mount):
    src = tmp_path / "src"
    src.mkdir()
    record = b"path=bad\0name.txt\n"
    length = len(record) + 3
    pax = b"%d %s" % (length, record)
    (src / "p.tar").write_bytes(archive(
        member(b"PaxHeader", pax, typeflag=b"x"),
        member(b"placeholder", b"nul\n"),
        member(b"fine.txt", b"fine\n"),
    ))
    m = mount(src)
    assert os.listdir(m.path) == ["fine.txt"]
    assert "refused: name contains a NUL byte" in m.output


def test_shard_changed_after_mount_answers_eio_not_wrong_bytes(tmp_path, mount):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.tar").write_bytes(archive(member(b"a.txt", b"A" * 1000)))
    (src / "b.tar").write_bytes(archive(member(b"b.txt", b"B" * 1000)))
    m = mount(src)
    (src / "a.tar").write_bytes(archive(member(b"a.txt", b"Z" * 2000)))  # rewritten under the mount
    try:
        data = open(os.path.join(m.path, "a.txt"), "rb").read()
    except OSError as exc:
        assert exc.errno == 5  # EIO
    else:
        raise AssertionError(f"read returned {data[:10]!r} from a changed shard")
    assert open(os.path.join(m.path, "b.txt"), "rb").read() == b"B" * 1000
    assert "changed since its index was built" in m.log()
