"""A first mount's index build: it says how far it is (shards, members, MB/s, time left) in the
daemon's log and to a waiting `shardfs mount` (a remount that loads every index says nothing); a
daemon stopped midway leaves no worker and no half index behind; a shard that changes while it is
scanned gets no index."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from benchlib.cli import REPO
from conftest import force_unmount, needs_fuse, wait_for
from shardfs.formats import tar
from shardfs.index import fingerprint, index_file, shard_index, store
from shardfs.storage.local import LocalShard
from shardfs.view import dataset
from tarcraft import archive, member
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


def _tiny_members_shard(path, count: int, tag: int = 0) -> None:
    """A shard of ``count`` tiny files in 100 folders, its bytes made directly (tarfile is slow)."""
    with open(path, "wb") as out:
        out.write(b"".join(member(b"c%02d/f%02d-%07d.jpg" % (i % 100, tag, i), b"%07d" % i) for i in range(count)))
        out.write(b"\0" * 1024)


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for init to reap it has finished)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def finished(folder) -> list:
    """The indexes saved in a folder (atomic_file's temporary files are ".tmp-*NAME")."""
    return [folder / n for n in os.listdir(folder) if n.endswith(".shardfs-idx") and not n.startswith(".tmp-")]


@needs_fuse
def test_a_build_stopped_midway_leaves_no_process_and_no_half_index(tmp_path, mount):
    """The daemon stopped (SIGTERM: an unmount by its service, scancel) while it builds indexes
    (on its own threads: tar shards start no worker process): it ends, no index is left half
    written, and the next mount serves."""
    src, idx = tmp_path / "src", tmp_path / "idx"
    src.mkdir()
    shards = 30
    for i in range(shards):
        _tiny_members_shard(src / f"s{i:02d}.tar", 40_000, i)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    # (a RAM budget that does not hold the shards, and no disk tier: the builds run in worker
    # processes, not in the daemon's threads as when they fill the caches; test_buildfill stops those)
    daemon = subprocess.Popen([sys.executable, "-m", "shardfs", "mount", str(src), str(mnt), "-f", "--workers", "2",
                               "--cache-size", "1M",
                               "--index-dir", str(idx), "--log-file", str(tmp_path / "d.log")], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children: list[int] = []
    try:
        def building() -> bool:
            return bool(finished(src)) or daemon.poll() is not None  # (saved beside the shards)
        wait_for(building, "the daemon's first index")
        children[:] = [int(p) for p in open(f"/proc/{daemon.pid}/task/{daemon.pid}/children").read().split()]
        assert daemon.poll() is None, "the daemon ended before it was stopped"
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        if str(mnt) in open("/proc/mounts").read():  # mounted before it was stopped (the test fails below)
            force_unmount(str(mnt))
        for pid in children:  # (what the test is about: none is left when it passes)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert children == []  # built on threads
    assert not os.path.ismount(mnt)
    saved = finished(src) + (finished(idx) if idx.exists() else [])
    assert 0 < len(saved) < shards  # stopped midway
    for path in saved:  # each whole: never a half index under an index's name
        assert len(index_file.load(str(path))) == 40_000

    m = mount(src, options=("--index-dir", str(idx)))
    assert m.stats()["files"] == shards * 40_000
    for i in range(shards):
        assert open(os.path.join(m.path, f"c07/f{i:02d}-0000007.jpg"), "rb").read() == b"0000007"


class _ChangesAfterItsFirstRead(LocalShard):
    """A real shard file (changing.tar) that is rewritten (appended to) just after the scan's first read."""

    def _pread_now(self, offset: int, length: int) -> bytes:
        data = super()._pread_now(offset, length)
        self._change_once()
        return data

    def _read_at_now(self, buf: memoryview, offset: int, length: int) -> None:  # the scan's reads
        super()._read_at_now(buf, offset, length)
        self._change_once()

    def _change_once(self) -> None:
        if self.name == "changing.tar" and not getattr(self, "appended", False):
            self.appended = True
            with open(self.path, "ab") as f:
                f.write(b"\0" * 512)
            os.utime(self.path, ns=(self.mtime_ns + 10**9, self.mtime_ns + 10**9))


def test_a_shard_that_changes_during_its_build_gets_no_index(tmp_path, monkeypatch):
    """The scan reads the shard in large pieces, each checked against the file it started from:
    a shard rewritten midway is not indexed (no index saved for bytes that are gone); another
    shard is, and the next build sees the shard as it is."""
    changing, other = tmp_path / "changing.tar", tmp_path / "other.tar"
    _tiny_members_shard(changing, 20_000)  # ~20 MB: several reads
    _tiny_members_shard(other, 100)
    assert os.path.getsize(changing) > 2 * tar.CHUNK
    monkeypatch.setattr(store, "LocalShard", _ChangesAfterItsFirstRead)
    results = dataset.index_shards([str(changing), str(other)], str(tmp_path / "idx"), workers=1)
    (_, ix, how), (_, ix2, how2) = results
    assert ix is None and "changed since its index was built" in how, how
    assert how2 == "built" and len(ix2) == 100
    assert os.path.exists(ix2.stored_at)
    assert not [p for p in store.candidate_paths(str(changing), str(tmp_path / "idx")) if os.path.exists(p)]
    monkeypatch.undo()
    [(_, ix, how)] = dataset.index_shards([str(changing)], str(tmp_path / "idx"), workers=1)
    assert how == "built" and len(ix) == 20_000 and ix.shard_size == os.path.getsize(changing)


@pytest.mark.parametrize("count", [10, 2_500, 9_000])
def test_a_build_fingerprints_the_shard_as_fingerprint_of(tmp_path, count):
    """The build takes the fingerprint's windows from the scan's own reads where one holds a
    window whole, and reads the others: the fingerprint is that of the shard's bytes either way
    (a shard under 192 KiB; ~2.5 MB: one read; ~9 MB: the windows in several 4 MiB reads)."""
    path = tmp_path / "s.tar"
    _tiny_members_shard(path, count)
    read = []
    shard = LocalShard.open(str(path))
    pread, read_at = shard.pread, shard.read_at
    shard.pread = lambda offset, length: read.append((offset, length)) or pread(offset, length)
    shard.read_at = lambda buf, offset, length: read.append((offset, length)) or read_at(buf, offset, length)
    ix = shard_index.build(shard)
    assert ix.shard_fingerprint == fingerprint.of(LocalShard.open(str(path)))
    assert len(read) == -(-os.path.getsize(path) // tar.CHUNK)  # the scan's reads, no other
