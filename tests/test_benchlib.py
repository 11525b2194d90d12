"""benchlib, the library the benchmarks and these tests share: the listing is ImageFolder's, the
reader pools read every byte, mounts are undone, targets are judged on the right side."""

import multiprocessing
import os
import signal

import pytest
from benchlib import tables
from benchlib.mounts import Mounts, process_alive
from benchlib.readers import imagefolder_files, read_all
from benchlib.rounds import read_pass, sample_paths

from conftest import needs_fuse


def test_listing_is_imagefolders(sample_tree):
    datasets = pytest.importorskip("torchvision.datasets")
    root = str(sample_tree / "train")
    assert imagefolder_files(root) == [path for path, _label in datasets.ImageFolder(root).samples]


@pytest.mark.parametrize("how", ["open", "os"])
def test_reader_pool_reads_every_byte(sample_tree, how):
    paths = imagefolder_files(str(sample_tree / "train"))
    res = read_all(paths, readers=2, how=how, seed=1)
    assert (res["files"], res["errors"]) == (len(paths), 0)
    assert res["bytes"] == sum(os.path.getsize(p) for p in paths)


def test_a_pass_over_a_few_files_takes_positive_time(tmp_path):
    """The readers may finish before the parent is scheduled again: time comes from their clocks."""
    paths = []
    for i in range(2):
        (tmp_path / f"f{i}").write_bytes(b"x")
        paths.append(str(tmp_path / f"f{i}"))
    for _ in range(30):
        res = read_all(paths, readers=2)
        assert res["files"] == 2 and res["seconds"] > 0 and res["files_per_s"] > 0


def test_a_reader_pool_stops_at_its_budget_and_names_what_it_read(sample_tree):
    paths = imagefolder_files(str(sample_tree / "train"))
    whole = read_all(paths, readers=2, seed=1, budget_s=60)
    assert (whole["files"], whole["budget_hit"]) == (len(paths), False) and "read" not in whole
    cut = read_all(paths, readers=2, seed=1, budget_s=1e-9)
    assert cut["budget_hit"] and len(cut["read"]) == cut["files"] < len(paths)
    assert set(cut["read"]) <= set(paths)


def test_the_sample_is_the_same_files_under_every_root(sample_tree, tmp_path):
    """Every method lists the same sorted tree, so one seed picks the same files through each."""
    paths = imagefolder_files(str(sample_tree / "train"))
    elsewhere = [os.path.join(str(tmp_path), os.path.relpath(p, str(sample_tree))) for p in paths]
    picked = sample_paths(paths, 10, seed=3)
    assert len(set(picked)) == 10
    assert [os.path.relpath(p, str(sample_tree)) for p in picked] == \
        [os.path.relpath(p, str(tmp_path)) for p in sample_paths(elsewhere, 10, seed=3)]
    assert sample_paths(paths, 0, seed=3) == paths == sample_paths(paths, 10_000, seed=3)


def test_read_passes_of_a_round_read_its_sample_then_what_a_budget_left(sample_tree):
    paths = imagefolder_files(str(sample_tree / "train"))
    out = {"paths": paths, "readers": 2, "round": 0}
    first = read_pass("open", 0, sample=20, sample_seed=5)(str(sample_tree), out)
    assert (first["files"], first["of"], len(out["read_set"])) == (20, 20, 20)
    sample = list(out["read_set"])
    cut = read_pass("os", 1, sample=20, sample_seed=5, budget_s=1e-9)(str(sample_tree), out)
    assert cut["budget_hit"] and cut["of"] == 20 and "read" not in cut
    assert len(out["read_set"]) == cut["files"] and set(out["read_set"]) <= set(sample)


def test_an_interrupted_reader_pool_ends_its_readers(tmp_path):
    """A signal to the benchmark alone (SIGTERM) ends the pass at once: readers that would never
    finish (blocked opening a FIFO that has no writer) are ended, not waited for."""
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)

    def interrupt(_signum, _frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)  # not inherited by the forked readers
    try:
        with pytest.raises(KeyboardInterrupt):
            read_all([fifo, fifo], readers=2, how="open")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert multiprocessing.active_children() == []


@needs_fuse
def test_mounts_are_undone_on_the_way_out(tar_shards, tmp_path):
    mnt = str(tmp_path / "mnt")
    with Mounts() as mounts:
        m = mounts.shardfs([str(tar_shards)], mnt, log=str(tmp_path / "mnt.log"))
        assert os.path.ismount(mnt) and process_alive(m.pid)
        assert len(imagefolder_files(os.path.join(mnt, "train"))) == 6 * 12
    assert not os.path.ismount(mnt)
    assert not process_alive(m.pid)


def test_targets_judge_ratios():
    assert tables.target("t", "m", 95, 100, ">= 0.9")["result"] == "PASS"
    assert tables.target("t", "m", 85, 100, ">= 0.9")["result"] == "FAIL"
    assert tables.target("t", "m", 3, 1, "<= 2")["result"] == "FAIL"
    assert tables.target("t", "m", None, 1, "<= 2")["result"] == "n/a"
    assert tables.absolute("t", "m", 20, "<= 25", " us")["result"] == "PASS"
    assert tables.cell([3, 1, 2], "{:.0f}", base=4) == "2 [1-3] 0.50x"
    assert tables.cell([44], "{:.0f}", base=25105) == "44 0.0018x"  # not 0.00x
