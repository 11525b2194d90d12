"""Differential test: every tar that real writers produce, indexed by shardfs and extracted by GNU tar.

Rule: each member shardfs serves has exactly the bytes `tar -x` extracts (sha256), and each
file, symlink or directory the extraction has that shardfs leaves out is named by a warning."""

from __future__ import annotations

import os

import pytest

import tar_corpus
from conftest import needs_fuse
from shardfs.index import names
from shardfs.index import shard_index as index
from tar_corpus import reference_entries, served_entries, sha256

SHOWN_IN_MOUNT = ["gnutar-gnu", "gnutar-posix-sparse-1.0", "gnutar-incremental-level1", "bsdtar-pax",
                  "tarfile-pax", "webdataset-shardwriter"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return tar_corpus.make_tree(tmp_path_factory.mktemp("writers") / "src")


@pytest.fixture(scope="module")
def cases(tree, tmp_path_factory):
    """Each writer's case, built on first use."""
    built: dict[str, tar_corpus.Case] = {}

    def get(name: str) -> tar_corpus.Case:
        if (why := tar_corpus.missing_tool(name)) is not None:
            pytest.skip(why)
        if name not in built:
            built[name] = tar_corpus.build(name, tree, tmp_path_factory.mktemp(name))
        return built[name]
    return get


def explained(name: bytes, notes: str) -> bool:
    """A warning or error names the member."""
    return names.show(name) in notes


@pytest.mark.parametrize("name", list(tar_corpus.WRITERS))
def test_served_bytes_equal_tar_extraction(cases, name):
    case = cases(name)
    reference = reference_entries(case.reference)
    served, notes = served_entries(case)
    assert served, f"{name}: nothing served\n{notes}"
    # Only a multi-volume set has shards that stop early (a file cut at a volume's end); what
    # follows such a stop in that shard is named by the stop's error line as a whole.
    stopped = "multivolume" in name and ": truncated" in notes or "damaged header" in notes
    assert "multivolume" in name or not stopped, notes
    for member, (kind, value) in served.items():
        assert member in reference, f"{name}: serves {member!r}, which tar -x did not make\n{notes}"
        assert (kind, value) == reference[member], f"{name}: {member!r} differs from tar -x"
    left_out = [m for m in reference if m not in served]
    unexplained = [m for m in left_out if not explained(m, notes) and not stopped]
    assert not unexplained, f"{name}: left out without a warning: {unexplained}\n{notes}"


@pytest.mark.parametrize("name", ["gnutar-gnu", "gnutar-oldgnu", "gnutar-posix", "gnutar-posix-sparse-0.0",
                                  "gnutar-posix-sparse-0.1", "gnutar-posix-sparse-1.0", "bsdtar-pax"])
def test_sparse_members_are_served_by_their_real_name(cases, name):
    case = cases(name)
    served, notes = served_entries(case)
    reference = reference_entries(case.reference)
    assert served[tar_corpus.SPARSE.encode()] == reference[tar_corpus.SPARSE.encode()]
    assert "GNUSparseFile" not in notes and not any(b"GNUSparseFile" in m for m in served)
    assert served[b"sparse/after.txt"] == reference[b"sparse/after.txt"]
    ix = index.build(str(case.archives[0]))
    assert len(ix.sparse) == 1 and len(next(iter(ix.sparse.values()))) == 9  # its nine runs


def test_incremental_dumpdirs_are_directories(cases):
    served, notes = served_entries(cases("gnutar-incremental-level1"))
    assert served[b"newdir"] == ("dir", None) and served[b"emptydir"] == ("dir", None)
    assert served[b"plain/small.txt"] == ("file", sha256(b"changed after level 0\n"))
    assert b"plain/big.bin" not in served  # deleted before level 1: only named in the dumpdir


def test_multivolume_parts_are_left_out(cases):
    for fmt in ("gnu", "posix"):
        case = cases(f"gnutar-multivolume-{fmt}")
        assert len(case.archives) >= 3
        served, notes = served_entries(case)
        assert "multi-volume continuation" in notes and ": truncated at offset" in notes
        assert served[b"plain/block.bin"][0] == "file"


@needs_fuse
def test_mounted_bytes_equal_tar_extraction(cases, mount, tmp_path):
    """Through a real FUSE mount: every served file of a few cases, compared with tar -x by sha256."""
    compared = 0
    for name in SHOWN_IN_MOUNT:
        case = cases(name)
        shards = tmp_path / f"shards-{name}"
        shards.mkdir()
        for path in case.archives:
            os.link(path, shards / path.name)
        m = mount(shards, name=f"mnt-{name}")
        reference = reference_entries(case.reference)
        mounted = reference_entries(m.path)
        served, _ = served_entries(case)
        assert mounted == served, f"{name}: the mount shows another tree than the index"
        for member, (kind, value) in mounted.items():
            if kind == "file":
                assert value == reference[member][1], f"{name}: {member!r} read through FUSE differs from tar -x"
                compared += 1
        if name in ("gnutar-gnu", "gnutar-posix-sparse-1.0"):
            assert mounted[tar_corpus.SPARSE.encode()] == reference[tar_corpus.SPARSE.encode()]
    assert compared > 50
