"""A view as the compiled request loop answers from it: the tree's arrays plus a few derived ones
(inode numbers sorted for lookup by node id, each directory's children), and one Slot per shard
through which the RAM cache publishes the bytes it holds."""

from __future__ import annotations

import logging
import os
import threading

import numpy as np

from shardfs.formats.base import VIRTUAL, Kind
from shardfs.fuse import _lowlevel
from shardfs.index import names
from shardfs.storage import tierfile
from shardfs.storage.base import Shard
from shardfs.view.dataset import Dataset
from shardfs.view.tree import _INODE_SPACE, inode_number

log = logging.getLogger(__name__)


class Slots:
    """One Slot per shard, kept across rescans (a shard that stays keeps its slot). The RAM
    cache calls ``resident``/``gone``/``direct`` (storage.ram.Publisher), the disk tier
    ``on_disk``/``off_disk`` (storage.disk.Publisher); the tables read them."""

    def __init__(self):
        self._slots: dict[Shard, _lowlevel.Slot] = {}
        self._direct_fds: dict[Shard, int] = {}
        self._lock = threading.Lock()

    def slot(self, shard: Shard) -> _lowlevel.Slot:
        with self._lock:
            found = self._slots.get(shard)
            if found is not None:
                return found
            found = self._slots[shard] = _lowlevel.Slot()
        # Once it is broken, not one read of it more in C. (Not under our lock: a shard may be
        # marked, and tell us, with its own lock held.)
        shard.when_broken(lambda: self.forget(shard))
        if shard.broken:  # marked just before
            self.forget(shard)
        return found

    def _known(self, shard: Shard) -> _lowlevel.Slot | None:
        with self._lock:
            return self._slots.get(shard)

    def resident(self, shard: Shard, buf, size: int, states: bytearray, chunk: int) -> None:
        self.slot(shard).publish(buf, size, states, chunk)

    def gone(self, shard: Shard) -> None:
        found = self._known(shard)
        if found is not None:
            found.withdraw()  # returns once no reader copies from the buffer

    def last_used(self, shard: Shard) -> float:
        found = self._known(shard)
        return found.last_used if found is not None else 0.0

    def hits(self) -> int:
        with self._lock:
            return sum(s.hits for s in self._slots.values())

    def direct(self, shard: Shard, refused: bool) -> None:
        self.slot(shard).direct = refused

    def on_disk(self, shard: Shard, file: tierfile.TierFile, states: bytearray, valid: int) -> None:
        # Our own descriptor, with O_DIRECT where the filesystem has it: the bytes go from the disk
        # straight into the reply buffer, not also into the page cache (the mounted file's pages
        # hold them after the reply: twice would be one copy and one page of memory too many).
        try:
            fd = os.open(file.path, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
        except OSError:
            fd = os.open(file.path, os.O_RDONLY | os.O_CLOEXEC)
        with self._lock:
            old = self._direct_fds.pop(shard, None)
        self.slot(shard).publish_file(fd, file.fd, file.size, file.data_at, states, valid, tierfile.HEADER,
                                      tierfile.RECORD.size, tierfile.RECORD_MAGIC, tierfile.BLOCK, tierfile.CHUNK)
        with self._lock:
            self._direct_fds[shard] = fd
        if old is not None:
            os.close(old)

    def off_disk(self, shard: Shard) -> None:
        found = self._known(shard)
        if found is not None:
            found.withdraw_file()  # no reader uses the descriptor after this
        with self._lock:
            fd = self._direct_fds.pop(shard, None)
        if fd is not None:
            os.close(fd)

    def forget(self, shard: Shard) -> None:
        """A broken shard (changed or gone): its reads go to Python, which answers EIO."""
        found = self._known(shard)
        if found is not None:
            found.direct = False
            found.withdraw()
        self.off_disk(shard)

    def disk_hits(self) -> tuple[int, int]:
        """(reads, bytes) answered from disk-tier files."""
        with self._lock:
            pairs = [s.disk_hits for s in self._slots.values()]
        return sum(p[0] for p in pairs), sum(p[1] for p in pairs)


def _member_ino(path_hashes: np.ndarray) -> np.ndarray:
    """inode_number for many members at once (the same formula, in uint64)."""
    return np.uint64(2) + path_hashes % np.uint64(_INODE_SPACE)


def _children(ndirs: int, dir_parent: np.ndarray, listing: np.ndarray, listing_start: np.ndarray):
    """(children, child_start): directory d's children are children[child_start[d]:child_start[d + 1]],
    its subdirectories then its files and links as the tree lists them (their node ids). The tree's
    listing is grouped by directory already: its members are placed, not sorted again."""
    subdirs = np.argsort(dir_parent[1:], kind="stable").astype(np.uint32) + np.uint32(1)
    nsub = np.bincount(dir_parent[1:], minlength=ndirs)
    nfiles = np.diff(listing_start)
    child_start = np.zeros(ndirs + 1, np.int64)
    np.cumsum(nsub + nfiles, out=child_start[1:])
    children = np.empty(int(child_start[-1]), np.uint32)
    sub_start = np.concatenate([[0], np.cumsum(nsub)])
    sub_pos = child_start[:-1] - sub_start[:-1]  # + the subdirectory's place among all, grouped by parent
    children[np.repeat(sub_pos, nsub) + np.arange(len(subdirs))] = subdirs
    file_pos = child_start[:-1] + nsub - listing_start[:-1]
    children[np.repeat(file_pos, nfiles) + np.arange(len(listing))] = listing + np.uint32(ndirs)
    return children, child_start.astype(np.uint32)


# The table's arrays that are not the tree's own: what a saved view (view/snapshot.py) keeps beside the tree's.
DERIVED = ("ino", "by_ino", "by_ino_node", "dir_names", "dir_name_end", "dir_mode", "dir_nlink", "dir_mtime_ns",
           "dir_parent", "child_start", "children", "shard_raw")


def build(view: Dataset, slots: Slots) -> _lowlevel.Table:
    return _table(view, slots, _arrays(view))


def build_keeping(view: Dataset, slots: Slots) -> tuple[_lowlevel.Table, dict]:
    """(the table, its DERIVED arrays with the children in the order the table sorted them): to be
    saved. The children are the table's own memory: the arrays are good while the table is held."""
    arrays = _arrays(view)
    table = _table(view, slots, arrays)
    arrays["children"] = np.frombuffer(table.sorted_children(), np.uint32)
    return table, {name: arrays[name] for name in DERIVED}


def from_saved(view: Dataset, slots: Slots, derived: dict) -> _lowlevel.Table:
    """The table of ``view`` from the DERIVED arrays a table of the same view had (build_keeping),
    read from a saved view: nothing computed again. Every index is checked as in any table (a
    ValueError for arrays that point outside themselves, behind good CRCs); the children's name
    order is not (0.25 s at 4M): a child out of order could only make a lookup miss (names are
    compared whole), never answer for another file."""
    return _table(view, slots, {**derived, **_tree_arrays(view.tree)}, children_sorted=True)


def _tree_arrays(tree) -> dict:
    # A sparse member is not one byte range of the shard, nor one at a VIRTUAL offset (formats/base.py:
    # Parquet pages, zip members, SquashFS blocks): an offset of -1 sends its reads to Python.
    offset = np.ascontiguousarray(tree.offset, np.int64)
    virtual = np.flatnonzero(offset >= VIRTUAL) if offset.max(initial=0) >= VIRTUAL else ()  # no pass: tar
    if tree.sparse or len(virtual):
        offset = offset.copy()
        offset[list(tree.sparse)] = -1
        offset[virtual] = -1
    return {
        "names": tree.names,
        "name_end": np.ascontiguousarray(tree.name_end, np.int64),
        "size": np.ascontiguousarray(tree.size, np.int64),
        "offset": offset,
        "shard": np.ascontiguousarray(tree.shard, np.uint32),
        "mode": np.ascontiguousarray(tree.mode, np.uint16),
        "kind": np.ascontiguousarray(tree.kind, np.uint8),
        "mtime": np.ascontiguousarray(tree.mtime, np.float64),
    }


def _table(view: Dataset, slots: Slots, arrays: dict, children_sorted: bool = False) -> _lowlevel.Table:
    tree = view.tree
    return _lowlevel.Table(arrays, view, tuple(slots.slot(s) for s in view.shards), ndirs=tree.ndirs,
                           nmembers=len(tree.size), nsorted=len(arrays["by_ino"]), symlink_kind=int(Kind.SYMLINK),
                           uid=os.getuid(), gid=os.getgid(), files=tree.nfiles, total_size=tree.total_size,
                           children_sorted=children_sorted)


def _arrays(view: Dataset) -> dict:
    tree = view.tree
    ndirs, nmembers = tree.ndirs, len(tree.size)
    dir_paths = [d.path for d in tree.dirs]
    dir_ino = np.fromiter((inode_number(p) for p in dir_paths), np.uint64, ndirs)
    live = np.asarray(tree.lookup_id, dtype=np.uint32)
    live_ino = _member_ino(np.asarray(tree.lookup_hash, dtype=np.uint64))
    ino = np.zeros(ndirs + nmembers, np.uint64)  # every node's: directories', then members'
    ino[:ndirs] = dir_ino
    ino[ndirs:][live] = live_ino

    keys = np.concatenate([dir_ino, live_ino])
    nodes = np.concatenate([np.arange(ndirs, dtype=np.uint32), live + np.uint32(ndirs)])
    order = np.argsort(keys, kind="stable")
    keys, nodes = keys[order], nodes[order]
    clash = np.flatnonzero(keys[1:] == keys[:-1]) + 1
    hidden = np.empty(0, np.uint32)
    if len(clash):  # a 63-bit inode collision: one id cannot name two paths, so one is left out
        hidden = nodes[clash]
        for n in hidden[:20]:
            log.warning("%s has the inode number of another path: left out",
                        names.show(dir_paths[n] if n < ndirs else tree.name(int(n) - ndirs)))
        keys, nodes = np.delete(keys, clash), np.delete(nodes, clash)

    # Every directory's children (subdirectories, then files and links), grouped by parent.
    dir_parent = np.array([tree.dir_id[names.parent_of(p)] if p else 0 for p in dir_paths], np.uint32)
    children, child_start = _children(ndirs, dir_parent, np.asarray(tree.listing, dtype=np.uint32),
                                      np.asarray(tree.listing_start, dtype=np.int64))
    if len(hidden):
        keep = ~np.isin(children, hidden)
        child_parent = np.repeat(np.arange(ndirs), np.diff(child_start))
        children = children[keep]
        child_start = np.searchsorted(child_parent[keep], np.arange(ndirs + 1)).astype(np.uint32)

    name_lengths = np.fromiter((len(p) for p in dir_paths), np.int64, ndirs)
    return {
        **_tree_arrays(tree),
        "ino": ino,
        "by_ino": keys,
        "by_ino_node": nodes,
        "dir_names": b"".join(dir_paths),
        "dir_name_end": np.cumsum(name_lengths),
        "dir_mode": np.array([d.mode for d in tree.dirs], np.uint32),
        "dir_nlink": np.array(tree.dir_nlink, np.uint32),
        "dir_mtime_ns": np.array([int(d.mtime * 1e9) for d in tree.dirs], np.int64),
        "dir_parent": dir_parent,
        "child_start": child_start,
        "children": children,
        # Only where a shard's members are byte ranges of it as stored (tar, Arrow, HDF5, Parquet
        # without compressed pages) can the loop copy them from the cached shard; the others (lz4
        # blocks, compressed Parquet pages) go through their layout in Python.
        "shard_raw": view.as_stored().astype(np.uint8),
    }


def directory_inos(view: Dataset) -> list[int]:
    """Every directory's inode number (what a rescan invalidates in the kernel)."""
    return [inode_number(d.path) for d in view.tree.dirs]
