"""Differential harness over an edge-case suite (tar_corpus.EDGE_WRITERS and cut or damaged copies):
sparse files in every encoding, absolute and denormal names, incremental dumps, links to links,
members replaced or appended later, truncated and damaged archives; each archive indexed by
shardfs on its own and extracted by GNU tar. Targets: at least 98% of the regular files tar
extracts served byte-identical, nothing served that tar does not extract (0 wrong), and every
file left out named by a warning or by the archive's damage line."""

from __future__ import annotations

import os
import random
import re

import pytest

import tar_corpus
from conftest import needs_fuse
from shardfs.index import names
from shardfs.index import index_file, store
from shardfs.index import shard_index as index
from shardfs.pack.verify import verify
from shardfs.view import dataset, layouts, reader
from tar_corpus import reference_entries, served_entries
from tarcraft import archive, member

TARGET = 0.98


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    if tar_corpus.missing_tool("tar") is not None:
        pytest.skip("needs GNU tar")
    return tar_corpus.edge_cases(tmp_path_factory.mktemp("edge"))


def compare(case: tar_corpus.Case) -> tuple[int, list[bytes], list[str], str]:
    """(regular files tar extracted, those served differently or not at all, served entries tar
    did not make that way, the notes)."""
    reference = reference_entries(case.reference)
    served, notes = served_entries(case)
    files = [name for name, (kind, _) in reference.items() if kind == "file"]
    missed = [name for name in files if served.get(name) != reference[name]]
    wrong = [f"{names.show(name)}: served {entry[0]}, tar -x made {reference.get(name, ('nothing',))[0]}"
             for name, entry in served.items() if reference.get(name) != entry and not _climbed(name, notes)]
    return len(files), missed, wrong, notes


def _climbed(name: bytes, notes: str) -> bool:
    """A member tar >= 1.29 refuses for its '..' and the mount serves at the path it resolves to
    (test_names_with_dots_are_served_where_they_resolve compares their bytes)."""
    return any(f" as {names.show(name)}" in line for line in notes.splitlines() if "member names with '..': " in line)


def test_edge_suite_is_served_as_tar_extracts_it(suite):
    total = served = 0
    wrong, unexplained, lines = [], [], []
    for case in suite:
        count, missed, bad, notes = compare(case)
        total, served = total + count, served + count - len(missed)
        wrong += [f"{case.name}: {line}" for line in bad]
        damaged = re.search(r"(truncated|damaged header).* at offset \d+", notes) is not None
        unexplained += [f"{case.name}: {names.show(m)}" for m in missed if names.show(m) not in notes and not damaged]
        left_out = f" (left out: {', '.join(map(names.show, missed))})" if missed else ""
        lines.append(f"  {case.name}: {count - len(missed)}/{count}{left_out}")
    ratio = served / total
    print(f"\nedge suite: {len(suite)} archives, {served} of {total} regular files tar -x extracts served "
          f"byte-identical ({ratio:.1%}), {len(wrong)} wrong\n" + "\n".join(lines))
    assert len(suite) >= 40 and total > 500
    assert not wrong, "\n".join(wrong)
    assert ratio >= TARGET
    assert not unexplained, "left out without a warning naming it: " + ", ".join(unexplained)


@pytest.mark.parametrize("kind", ["sparse-gnutar-gnu", "sparse-gnutar-oldgnu", "sparse-gnutar-posix-0.0",
                                  "sparse-gnutar-posix-0.1", "sparse-gnutar-posix-1.0", "sparse-bsdtar-pax"])
def test_every_sparse_encoding_is_kept_as_runs(suite, kind):
    case = next(c for c in suite if c.name == kind)
    ix = index.build(str(case.archives[0]))
    by_name = {ix.name(i): i for i in range(len(ix))}
    runs = {name: len(ix.sparse[i]) for name, i in by_name.items() if i in ix.sparse}
    # bsdtar stores a file that is all hole as a plain empty-data member too; tar makes the rest sparse
    assert runs.get(b"sparse/forty.bin") == 40 and runs.get(b"sparse/holes.bin") == 9 and b"sparse/tail.bin" in runs
    assert ix.error is None and not [w for w in ix.warnings if "sparse" in w]


def test_names_are_normalised_as_tar_does(suite):
    served, notes = served_entries(next(c for c in suite if c.name == "names-tarfile"))
    assert served[b"abs/x.txt"][0] == served[b"two/slashes.txt"][0] == served[b"a/b/c.txt"][0] == "file"
    assert b"up.txt" not in served  # ../up.txt resolves outside the tree
    assert served[b"down.txt"] == ("file", tar_corpus.sha256(b"dotdot")) and b"a/down.txt" not in served
    assert ("a.tar: member names with '..': 1 served at the path they resolve to (a/../down.txt as down.txt); "
            "1 refused: they resolve outside the tree (../up.txt)") in notes


def test_names_with_dots_are_served_where_they_resolve(tmp_path):
    """`folder/../ufo` is served as `ufo`, `a/b/../c` as `a/c` (Python's tarfile `data` filter
    extracts them there); `../root/bar`, `a/../../b/c` and `/../x` resolve outside the tree and are
    never served, nor is a file that resolves to the top (`q/..`); one line for the shard. GNU tar
    extracts none of them ("Member name contains '..'"), so the reference is tarfile's filter."""
    shard = tmp_path / "a.tar"
    shard.write_bytes(archive(member(b"folder/../ufo", b"ufo\n"), member(b"../root/bar", b"bar\n"),
                              member(b"a/../../b/c", b"c\n"), member(b"q/..", b"nothing\n"),
                              member(b"/../x", b"x\n"), member(b"a/b/../c", b"ac\n"),
                              member(b"kept.txt", b"kept\n")))
    case = tar_corpus.Case("dots", [shard], tar_corpus.extract([shard], tmp_path / "reference"))
    assert reference_entries(case.reference) == {b"kept.txt": ("file", tar_corpus.sha256(b"kept\n"))}
    served, notes = served_entries(case)
    expected = {b"ufo": b"ufo\n", b"a/c": b"ac\n", b"kept.txt": b"kept\n"}
    assert {name: entry for name, entry in served.items() if entry[0] == "file"} == {
        name: ("file", tar_corpus.sha256(data)) for name, data in expected.items()}
    assert set(served) == set(expected) | {b"a"}  # and its folder: nothing else, no "..", no root/ nor b/
    lines = [line for line in notes.splitlines() if "'..'" in line]
    assert lines == ["a.tar: member names with '..': 2 served at the path they resolve to (folder/../ufo as ufo, "
                     "a/b/../c as a/c); 3 refused: they resolve outside the tree (../root/bar, a/../../b/c, /../x); "
                     "1 files left out: they resolve to the top of the tree (q/..)"], notes
    assert _data_filter_names(shard) == {"ufo", "a/c", "kept.txt"}


def _data_filter_names(shard) -> set[str]:
    """Where Python's tarfile `data` filter puts each member it does not refuse."""
    import posixpath
    import tarfile

    kept = set()
    with tarfile.open(shard) as tar:
        for info in tar.getmembers():
            try:
                tarfile.data_filter(info, "/dest")
            except tarfile.FilterError:
                continue
            kept.add(posixpath.relpath(posixpath.normpath(posixpath.join("/dest", info.name.lstrip("/"))), "/dest"))
    return kept - {"."}


@needs_fuse
def test_a_mount_serves_dots_inside_and_nothing_outside(tmp_path, mount):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.tar").write_bytes(archive(member(b"../one.txt", b"one\n"), member(b"x/../two.txt", b"two\n"),
                                        member(b"bars-evil-dir/../../x", b"evil\n")))
    (src / "b.tar").write_bytes(archive(member(b"d/e/../f.txt", b"f\n")))
    m = mount(src)
    assert sorted(os.listdir(m.path)) == ["d", "two.txt"]
    assert open(os.path.join(m.path, "two.txt"), "rb").read() == b"two\n"
    assert open(os.path.join(m.path, "d/f.txt"), "rb").read() == b"f\n" and os.listdir(m.path + "/d") == ["f.txt"]
    for gone in ("one.txt", "x", "x/two.txt", "bars-evil-dir"):
        assert not os.path.lexists(os.path.join(m.path, gone))
    assert not (tmp_path / "one.txt").exists() and not (tmp_path / "x").exists()
    assert m.output.count("member names with '..': ") == 2
    assert ("a.tar: member names with '..': 1 served at the path they resolve to (x/../two.txt as two.txt); "
            "2 refused: they resolve outside the tree (../one.txt, bars-evil-dir/../../x)") in m.output
    assert "b.tar: member names with '..': 1 served at the path they resolve to (d/e/../f.txt as d/f.txt)" in m.output


@pytest.mark.parametrize("old_line", ["a.tar: member ../one.txt refused: name climbs out of the tree (..)",
                                      "a.tar: 1 member names with '..' served without their leading `../', as GNU tar "
                                      "names them (../one.txt as one.txt)"])
def test_an_index_of_the_old_rules_for_dots_is_rebuilt(tmp_path, old_line):
    """An index an older version built, which refused names with '..' or served them without their
    leading part, is built again under this version's rule."""
    shard = tmp_path / "a.tar"
    shard.write_bytes(archive(member(b"../one.txt", b"one\n"), member(b"x/../two.txt", b"two\n"),
                              member(b"kept.txt", b"kept\n")))
    old = index.build(str(shard))
    old.warnings = [old_line]
    index_file.save(old, store.candidate_paths(str(shard), str(tmp_path / "cache"))[0])
    found, how = store.load_or_build(str(shard), str(tmp_path / "cache"))
    assert how == "built" and sorted(found.name(i) for i in range(len(found))) == [b"kept.txt", b"two.txt"]
    assert store.load_or_build(str(shard), str(tmp_path / "cache"))[1] == "loaded"  # once


def test_damage_is_one_line_with_the_offset(suite):
    for case in suite:
        if "-cut-" in case.name or case.name.endswith("-damaged-header"):
            ix = index.build(str(case.archives[0]))
            assert ix.error and re.search(r"at offset \d+", ix.error), case.name
            assert ix.error.startswith("a.tar: ") and "\n" not in ix.error


def _random_ranges(size: int, rng: random.Random, count: int) -> list[tuple[int, int]]:
    spans = [(0, size), (max(size - 1, 0), 1), (size // 2, 4096)]
    for _ in range(count):
        start = rng.randrange(size + 1)
        spans.append((start, rng.choice([1, 511, 4096, 65536, 200_000])))
    return spans


@needs_fuse
def test_mounted_sparse_and_cut_archives(suite, mount, tmp_path):
    """Through real mounts: every file equal to tar -x's, random ranges of the sparse files read
    with seeks (through Python: the compiled loop must not serve them as one byte range), and a
    cut archive counted as damaged in the stats and by verify."""
    rng = random.Random(5)
    for name in ["sparse-gnutar-posix-1.0", "sparse-gnutar-oldgnu", "sparse-bsdtar-pax",
                 "sparse-gnutar-posix-1.0-cut-half", "appended-gnutar-damaged-header"]:
        case = next(c for c in suite if c.name == name)
        shards = tmp_path / f"shards-{name}"
        shards.mkdir()
        os.link(case.archives[0], shards / "a.tar")
        m = mount(shards, name=f"mnt-{name}")
        reference, mounted = reference_entries(case.reference), reference_entries(m.path)
        served, _ = served_entries(case)
        assert mounted == served, f"{name}: the mount shows another tree than the index"
        for member, entry in mounted.items():
            assert reference.get(member) == entry, f"{name}: {member!r} through FUSE differs from tar -x"
        for member in [b"sparse/holes.bin", b"sparse/forty.bin", b"sparse/tail.bin", b"sparse/allholes.bin"]:
            if member not in mounted:
                continue
            want = (case.reference / os.fsdecode(member)).read_bytes()
            with open(os.path.join(m.path, os.fsdecode(member)), "rb") as f:
                for start, length in _random_ranges(len(want), rng, 60):
                    f.seek(start)
                    assert f.read(length) == want[start : start + length], f"{name}: {member!r} [{start}:+{length}]"
        damaged = "-cut-" in name or "damaged" in name
        assert m.stats()["shards_damaged"] == int(damaged)
        if damaged:
            assert len(re.findall(r"a\.tar: (truncated|damaged header)[^\n]* at offset \d+", m.log())) == 1
            lines = []
            result = verify([str(shards)], report=lines.append, progress=False)
            assert result.damaged_shards == 1 and "1 damaged" in result.line()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_cut_and_damaged_header_is_served_as_tar_extracts_it(suite, tmp_path):
    """CUT_FROM's archives cut at every header, 100 and 700 bytes past it, and each header damaged
    in turn: nothing served that tar -x does not extract alike, every file left out explained."""
    checked = 0
    for base in tar_corpus.CUT_FROM:
        data = next(c for c in suite if c.name == base).archives[0].read_bytes()
        for at in tar_corpus.headers(data):
            damaged = bytearray(data)
            damaged[at + 5] ^= 0x55
            for how, blob in [("cut", data[:at]), ("cut100", data[: at + 100]), ("cut700", data[: at + 700]),
                              ("damaged", bytes(damaged))]:
                where = tmp_path / f"{base}-{how}-{at}"
                where.mkdir()
                (where / "a.tar").write_bytes(blob)
                case = tar_corpus.Case(where.name, [where / "a.tar"],
                                       tar_corpus.extract([where / "a.tar"], where / "reference"))
                _count, missed, wrong, notes = compare(case)
                assert not wrong, f"{case.name}: " + "; ".join(wrong)
                hit = re.search(r"(truncated|damaged header|not a tar archive).* at offset \d+", notes) is not None
                assert hit or all(names.show(m) in notes for m in missed), f"{case.name}: {missed}\n{notes}"
                checked += 1
    assert checked > 500


class ShardReads:
    """A Fetcher that reads shards straight from their files (view/reader.py's other half)."""

    def fetch(self, shard, offset: int, length: int) -> bytes:
        with open(shard.path, "rb") as f:
            f.seek(offset)
            return f.read(length)


def test_sparse_image_of_a_webdataset_sample_through_the_imagefolder_layout(tmp_path):
    """The imagefolder layout renames members and keeps a subset: a sparse one keeps its runs."""
    src = tmp_path / "src"
    src.mkdir()
    image = bytearray(300_000)
    image[:4] = b"\xff\xd8\xff\xe0"
    image[200_000:200_100] = bytes(range(100))
    (src / "a.txt").write_bytes(b"not part of a sample")
    with open(src / "s0.jpg", "wb") as f:  # written with holes, so that tar --sparse finds them
        f.write(image[:4])
        f.seek(200_000)
        f.write(image[200_000:200_100])
        f.truncate(len(image))
    (src / "s0.cls").write_bytes(b"3")
    shards = tmp_path / "shards"
    shards.mkdir()
    tar_corpus._run(["tar", "-c", "--sparse", "--format=posix", "-f", str(shards / "w.tar"), "-C", str(src),
                     "a.txt", "s0.jpg", "s0.cls"])
    view = dataset.open_dataset([str(shards)], index_dir=str(tmp_path / "idx"), workers=1,
                                layout=layouts.from_options("imagefolder", None))
    node = view.tree.lookup(b"3/s0.jpg")
    m = view.tree.member(node)
    assert node and m in view.tree.sparse
    assert reader.read_member(view, ShardReads(), m, 0, len(image)) == bytes(image)
    assert reader.read_member(view, ShardReads(), m, 199_990, 50) == bytes(image[199_990:200_040])
