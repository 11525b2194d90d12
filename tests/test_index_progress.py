"""A first mount says how far its index build is (shards, members, MB/s, time left) in the
daemon's log and to a waiting `shardfs mount`; a remount that loads every index says nothing."""

from __future__ import annotations

import re

from conftest import needs_fuse
from tarcraft import archive, member

from shardfs.index import shard_index
from shardfs.view import dataset
from shardfs.view.progress import IndexProgress, describe


def test_figures_count_shards_members_and_the_bytes_built(tmp_path):
    paths = []
    for i in range(3):
        path = tmp_path / f"s{i}.tar"
        path.write_bytes(archive(*(member(b"d/f%d-%d" % (i, j), b"x" * 100) for j in range(10))))
        paths.append(str(path))
    shard_index.build(paths[0])  # not stored: every shard is built below
    reports = []
    progress = IndexProgress(reports.append, every=0)
    results = dataset.index_shards(paths, str(tmp_path / "idx"), workers=1, progress=progress)
    assert [how.split()[0] for _, _, how in results] == ["built"] * 3
    assert [(r["shards"], r["of"], r["built"], r["members"]) for r in reports] == [(1, 3, 1, 10), (2, 3, 2, 20),
                                                                                  (3, 3, 3, 30)]
    assert reports[0]["seconds_left"] is not None and reports[-1]["seconds_left"] == 0
    assert describe(reports[-1]).startswith("indexes: 3/3 shards ready (3 built), 30 members, ")

    again = []
    dataset.index_shards(paths, str(tmp_path / "idx"), workers=1, progress=IndexProgress(again.append, every=0))
    assert [(r["shards"], r["built"], r["members"]) for r in again] == [(1, 0, 10), (2, 0, 20), (3, 0, 30)]


@needs_fuse
def test_a_first_mount_logs_how_far_its_index_build_is(tar_shards, mount, tmp_path):
    first = mount(tar_shards, options=("--index-dir", str(tmp_path / "idx")))
    [members] = re.findall(r"indexes: 4/4 shards ready \(4 built\), (\d+) members, \d+ MB/s", first.log())
    paths = sorted(str(p) for p in tar_shards.iterdir() if p.suffix == ".tar")
    loaded = dataset.index_shards(paths, str(tmp_path / "idx"), workers=1)
    assert [how for _, _, how in loaded] == ["loaded"] * 4
    assert int(members) == sum(len(ix) for _, ix, _ in loaded) > 0
    second = mount(tar_shards, options=("--index-dir", str(tmp_path / "idx")), name="mnt2")
    assert "indexes:" not in second.log()
