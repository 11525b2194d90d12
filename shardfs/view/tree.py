"""The merged directory tree of all shards: lookups, listings, attributes.

Every member lives in flat numpy arrays (about 100 bytes a member with its name),
looked up by a sorted array of 64-bit path hashes, so there is no Python object
per file. Directories are few and live in plain dicts.

Node ids (internal, what ``lookup`` returns): directory ``d`` is ``1 + d`` (the root
is 1); member ``m`` is ``1 + ndirs + m``. Inode numbers shown to users are derived from
the path instead (``inode_number``), so they stay the same across remounts and rescans
even when shards are added or removed.
"""

from __future__ import annotations

import logging
import mmap
from bisect import bisect_left
from dataclasses import dataclass

import numpy as np

from shardfs.index import index_file, names
from shardfs.formats.base import Kind
from shardfs.index import member_columns
from shardfs.index.member_columns import MemberColumns
from shardfs.index.shard_index import ShardIndex, SplitOnUse, path_hash

log = logging.getLogger(__name__)

MAX_REPORTED = 20  # conflict lines logged one by one; the rest are counted


def _by_hash(ids: np.ndarray, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(``ids`` in the order of their hashes, those hashes). Each id is packed under its hash's top
    bits into one 64-bit key and the keys sorted by value: 5-8x faster than an argsort of the
    hashes at 4M members. Ids whose hashes share those top bits (a few) come in id order; one
    stable sort of the nearly sorted result puts them right."""
    if not len(ids):
        return ids, hashes[ids]
    id_bits = max(int(ids[-1]).bit_length(), 1)  # ids ascend (flatnonzero)
    keys = (hashes[ids] >> np.uint64(id_bits)) << np.uint64(id_bits) | ids.astype(np.uint64)
    keys.sort()
    ordered = (keys & np.uint64((1 << id_bits) - 1)).astype(np.uint32)
    found = hashes[ordered]
    if (found[1:] < found[:-1]).any():
        fix = np.argsort(found, kind="stable")
        ordered, found = ordered[fix], found[fix]
    return ordered, found


@dataclass
class Dir:
    path: bytes
    mode: int = 0o755
    mtime: float = 0.0
    explicit: bool = False


@dataclass(frozen=True)
class Columns:
    """Views of the member arrays for the per-request path: an item is a plain Python int (or
    float), about 40 ns, where a numpy scalar costs 100 ns and every operation on it more
    (a lookup through numpy took 14 µs, through these 2 µs)."""

    size: memoryview
    offset: memoryview
    shard: memoryview
    mode: memoryview
    kind: memoryview
    mtime: memoryview
    lookup_hash: memoryview
    lookup_id: memoryview


# The tree's member columns, shard after shard: each member's shard, and the indexes' own columns
# (their name ends and parents made the tree's, the others copied as they are).
_COLUMNS = (("shard", np.uint32), *member_columns.COLUMNS)
_COPIED = tuple(name for name, _ in member_columns.COLUMNS if name not in ("name_end", "parent"))


class _Members:
    """The members of the shards added so far, in arrays grown as shards come (to twice their
    size), and their names, grown in place (mremap) and, once done, sliced as bytes like the
    saved view's map of them. All are private anonymous maps: what was reserved and never
    written is given back when done, also the part of a huge page past the last member (up to
    2 MB a column, 2 B a member at 4M)."""

    def __init__(self, members: int = 1 << 16, name_bytes: int = 1 << 22):
        self.count = self.name_bytes = 0
        self.columns: dict[str, np.ndarray] = {}
        self._areas: dict[str, mmap.mmap] = {}  # the map each column lives in
        for name, dtype in _COLUMNS:
            self._areas[name], self.columns[name] = _mapped(max(members, 1), dtype)
        self.names = mmap.mmap(-1, max(name_bytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)

    def append(self, ix: ShardIndex, shard: int, dir_ids: np.ndarray) -> None:
        """``ix``'s members as shard number ``shard``, whose directories are ``dir_ids`` in the tree."""
        n, name_bytes = len(ix), len(ix.names)
        self._room(n, name_bytes)
        at, end, columns = self.count, self.count + n, self.columns
        columns["shard"][at:end] = shard
        np.add(ix.name_end, self.name_bytes, out=columns["name_end"][at:end])
        np.take(dir_ids, ix.parent, out=columns["parent"][at:end])
        for name in _COPIED:
            columns[name][at:end] = getattr(ix, name)
        self.names[self.name_bytes:self.name_bytes + name_bytes] = ix.names
        self.count, self.name_bytes = end, self.name_bytes + name_bytes

    def _room(self, members: int, name_bytes: int) -> None:
        capacity = len(self.columns["kind"])
        if self.count + members > capacity:
            capacity = max(2 * capacity, self.count + members)
            for name, column in self.columns.items():
                self._areas[name], grown = _mapped(capacity, column.dtype)
                grown[:self.count] = column[:self.count]
                self.columns[name] = grown
        if self.name_bytes + name_bytes > len(self.names):
            self.names.resize(max(2 * len(self.names), self.name_bytes + name_bytes))

    def done(self) -> tuple[dict[str, np.ndarray], mmap.mmap | bytes]:
        """(the columns, the names) as filled."""
        for name, column in self.columns.items():
            used = -(-self.count * column.itemsize // mmap.PAGESIZE) * mmap.PAGESIZE
            if used < column.nbytes:
                self._areas[name].madvise(mmap.MADV_DONTNEED, used, column.nbytes - used)
        self._areas.clear()
        names, self.names = self.names, None
        if self.name_bytes:
            names.resize(self.name_bytes)
        else:
            names.close()
            names = b""
        return {name: column[:self.count] for name, column in self.columns.items()}, names


def _mapped(count: int, dtype) -> tuple[mmap.mmap, np.ndarray]:
    """(a private anonymous map, an array of ``count`` items in it), in huge pages where the kernel
    has them (as numpy asks for its own large arrays)."""
    area = mmap.mmap(-1, count * np.dtype(dtype).itemsize, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        area.madvise(mmap.MADV_HUGEPAGE)
    return area, np.frombuffer(area, dtype)


class Tree:
    def __init__(self, shard_names: list[str], indexes: list[ShardIndex], default_mtime: float = 0.0,
                 columns: MemberColumns | None = None):
        """``columns``: the arrays the indexes' member columns were read into (a remount), taken over
        as the tree's when they hold exactly these indexes' members in this order."""
        self._begin(shard_names, default_mtime)
        taken = columns is not None and columns.covers(indexes)
        self._finish(*self._gather(indexes, columns.column if taken else None))

    # ---- saved and restored (view/snapshot.py) ---------------------------

    # The member arrays a tree is made of, beside its names and directories.
    SAVED = ("shard", "name_end", "kind", "offset", "size", "mode", "mtime", "lookup_hash", "lookup_id", "listing",
             "listing_start")

    def saved(self) -> tuple[dict, dict]:
        """(arrays, plain values): all a tree is, for ``restore``."""
        arrays = {name: getattr(self, name) for name in self.SAVED}
        paths = [d.path for d in self.dirs]
        targets = sorted(self.symlinks.items())
        members, ends, runs = index_file.sparse_tables(self.sparse)
        arrays.update(
            names=self.names,
            dir_paths=np.frombuffer(b"".join(paths), np.uint8),
            dir_path_end=np.cumsum([len(p) for p in paths], dtype=np.int64),
            dir_mode=np.array([d.mode for d in self.dirs], np.uint32),
            dir_mtime=np.array([d.mtime for d in self.dirs], np.float64),
            dir_explicit=np.array([d.explicit for d in self.dirs], np.uint8),
            symlink_member=np.array([m for m, _ in targets], np.int64),
            symlink_targets=np.frombuffer(b"".join(t for _, t in targets), np.uint8),
            symlink_end=np.cumsum([len(t) for _, t in targets], dtype=np.int64),
            sparse_member=members, sparse_end=ends, sparse_runs=runs,
        )
        values = {"shard_names": self.shard_names, "problems": self.problems, "default_mtime": self._default_mtime,
                  "total_size": self.total_size}
        return arrays, values

    @classmethod
    def restore(cls, arrays: dict, values: dict) -> Tree:
        """The tree ``saved`` gave these of (the arrays as they were, or read-only maps of them;
        ``names`` anything bytes-like whose slices are bytes)."""
        self = cls.__new__(cls)
        self.shard_names, self.problems = values["shard_names"], values["problems"]
        self._default_mtime, self.total_size = values["default_mtime"], values["total_size"]
        for name in cls.SAVED:
            setattr(self, name, arrays[name])
        self.names = arrays["names"]
        self._name_ends = memoryview(self.name_end)
        paths = _split(bytes(arrays["dir_paths"]), arrays["dir_path_end"])
        self.dirs = [Dir(p, mode, mtime, bool(explicit)) for p, mode, mtime, explicit in
                     zip(paths, arrays["dir_mode"].tolist(), arrays["dir_mtime"].tolist(),
                         arrays["dir_explicit"].tolist())]
        self.dir_id = {p: d for d, p in enumerate(paths)}
        self.subdirs = [[] for _ in paths]
        for d, p in enumerate(paths[1:], 1):  # in the order _add_dir made them
            self.subdirs[self.dir_id[names.parent_of(p)]].append(d)
        self.symlinks = dict(zip(arrays["symlink_member"].tolist(),
                                 _split(bytes(arrays["symlink_targets"]), arrays["symlink_end"])))
        self.sparse = index_file.sparse_maps(arrays["sparse_member"], arrays["sparse_end"], arrays["sparse_runs"])
        self.ndirs = len(self.dirs)
        self.nfiles = len(self.listing)
        self.dir_nlink = [2 + len(sub) for sub in self.subdirs]
        self.col = Columns(*map(memoryview, (self.size, self.offset, self.shard, self.mode, self.kind, self.mtime,
                                             self.lookup_hash, self.lookup_id)))
        return self

    # ---- building -------------------------------------------------------

    def _add_dir(self, path: bytes) -> int:
        found = self.dir_id.get(path)
        if found is not None:
            return found
        parent = self._add_dir(names.parent_of(path)) if path else None
        d = self.dir_id[path] = len(self.dirs)
        self.dirs.append(Dir(path, mtime=self._default_mtime))
        self.subdirs.append([])
        if parent is not None:
            self.subdirs[parent].append(d)
        return d

    def _dir_ids(self, dirs) -> np.ndarray:
        """The tree's ids of a shard's directories. Most shards name the same directories in the same
        order (a thousand class folders each): found once per distinct list, not once per shard."""
        key = (len(dirs), dirs.blob if isinstance(dirs, SplitOnUse) else b"\0".join(dirs))
        found = self._known_dirs.get(key)
        if found is None:
            ids = list(map(self.dir_id.get, dirs))  # in C, for folders seen already
            if None in ids:
                ids = [self._add_dir(d) for d in dirs]
            found = self._known_dirs[key] = np.array(ids, dtype=np.uint32)
        return found

    def _begin(self, shard_names: list[str], default_mtime: float) -> None:
        self.shard_names = shard_names
        self.problems: list[str] = []
        self.dirs: list[Dir] = [Dir(b"")]
        self.dir_id: dict[bytes, int] = {b"": 0}
        self.subdirs: list[list[int]] = [[]]  # child directory ids
        self._default_mtime = default_mtime
        self._known_dirs: dict = {}
        self._shards_in = 0
        self.symlinks: dict[int, bytes] = {}
        self.sparse: dict[int, np.ndarray] = {}  # member -> its runs (formats/sparse.py); few have one

    def _append(self, members: _Members, ix: ShardIndex) -> None:
        """The next shard's members, after the last ones."""
        base = members.count
        members.append(ix, self._shards_in, self._dir_ids(ix.dirs))
        self._shards_in += 1
        self._add_links_and_maps(ix, base)

    def _add_links_and_maps(self, ix: ShardIndex, base: int) -> None:
        """A shard's links and sparse maps, its members numbered from ``base`` in the tree."""
        self.symlinks.update({base + i: t for i, t in ix.symlinks.items()})
        self.sparse.update({base + i: runs for i, runs in ix.sparse.items()})

    def _gather(self, indexes: list[ShardIndex], column=None) -> tuple[np.ndarray, np.ndarray]:
        """The tree's member columns from all the indexes at once: each shard's name ends and
        folder numbers moved into the tree's for all shards together (numpy over all members, not a
        pass per shard). ``column(name)``: the indexes' columns one after another already (a
        remount's MemberColumns, taken over), else they are concatenated. (The members' hashes,
        parents.)"""
        def cat(name: str, dtype) -> np.ndarray:
            if column is not None:
                return column(name)
            return np.concatenate([getattr(ix, name) for ix in indexes]) if indexes else np.empty(0, dtype)
        counts = [len(ix) for ix in indexes]
        self.shard = np.repeat(np.arange(len(indexes), dtype=np.uint32), counts)
        self.names = b"".join(ix.names for ix in indexes)
        dir_maps = [self._dir_ids(ix.dirs) for ix in indexes]
        dir_base = np.cumsum([0] + [len(d) for d in dir_maps[:-1]], dtype=np.uint32)
        parent = cat("parent", np.uint32) + np.repeat(dir_base, counts)
        parent = np.concatenate(dir_maps)[parent] if len(parent) else parent
        self.name_end = cat("name_end", np.int64)  # (changed in place when taken over: the indexes are not used after)
        self.name_end += np.repeat(np.cumsum([0] + [len(ix.names) for ix in indexes[:-1]], dtype=np.int64), counts)
        for name, dtype in (("kind", np.uint8), ("offset", np.int64), ("size", np.int64), ("mode", np.uint16),
                            ("mtime", np.float64)):
            setattr(self, name, cat(name, dtype))
        for base, ix in zip(np.cumsum([0] + counts).tolist(), indexes):
            self._add_links_and_maps(ix, base)
        return cat("hash", np.uint64), parent

    def _use(self, members: _Members) -> tuple[np.ndarray, np.ndarray]:
        """The columns ``members`` were filled with become the tree's. (The members' hashes, parents.)"""
        columns, self.names = members.done()
        for name in ("shard", "name_end", "kind", "offset", "size", "mode", "mtime"):
            setattr(self, name, columns[name])
        return columns["hash"], columns["parent"]

    def _finish(self, hashes: np.ndarray, parent: np.ndarray) -> None:
        """Directories' attributes, lookups by path hash, conflicts, listings: what needs every shard."""
        self._name_ends = memoryview(self.name_end)  # plain ints for name(), as Columns below
        for d in self.dirs:  # made before the newest shard's mtime was known (TreeBuilder)
            d.mtime = self._default_mtime

        # Explicit directory members give their directory a mode and mtime.
        for m in np.flatnonzero(self.kind == Kind.DIR):
            d = self.dirs[self._add_dir(self.name(int(m)))]
            d.mode, d.mtime, d.explicit = int(self.mode[m]) or 0o755, float(self.mtime[m]), True

        live = (self.kind == Kind.FILE) | (self.kind == Kind.SYMLINK)
        # Files and links by path hash, sorted once for the checks below and for lookups. Not a
        # stable sort (numpy's quicksort is 6x faster on a million hashes): equal hashes of
        # different names come in no particular order, and every use compares the names.
        ids = np.flatnonzero(live).astype(np.uint32)
        by_hash, sorted_hashes = _by_hash(ids, hashes)
        del hashes
        # (What is left out below is rare: the members' arrays are gathered again only then.)
        before = len(ids)
        self._hide_files_shadowed_by_dirs(live, by_hash, sorted_hashes)
        if np.count_nonzero(live) != before:
            kept = live[by_hash]
            by_hash, sorted_hashes = by_hash[kept], sorted_hashes[kept]
        self._resolve_duplicates(live, by_hash, sorted_hashes)
        if np.count_nonzero(live) != len(by_hash):
            kept = live[by_hash]
            by_hash, sorted_hashes = by_hash[kept], sorted_hashes[kept]
            ids = np.flatnonzero(live).astype(np.uint32)
        elif len(by_hash) != before:
            ids = np.flatnonzero(live).astype(np.uint32)
        self.lookup_hash = sorted_hashes
        self.lookup_id = by_hash

        key = parent if len(ids) == len(parent) else parent[ids]
        if len(self.dirs) <= 1 << 16:
            key = key.astype(np.uint16)  # numpy's stable sort of 16-bit keys is a radix sort: 6x faster
        self.listing = ids[np.argsort(key, kind="stable")]  # live members grouped by directory, in member order
        self.listing_start = np.searchsorted(parent[self.listing], np.arange(len(self.dirs) + 1))
        self.ndirs = len(self.dirs)
        self.nfiles = len(ids)
        self.total_size = int(self.size[ids].sum()) if len(ids) else 0
        self.dir_nlink = [2 + len(sub) for sub in self.subdirs]
        self.col = Columns(*map(memoryview, (self.size, self.offset, self.shard, self.mode, self.kind, self.mtime,
                                             self.lookup_hash, self.lookup_id)))

    def _report(self, line: str) -> None:
        self.problems.append(line)

    def _hide_files_shadowed_by_dirs(self, live: np.ndarray, by_hash: np.ndarray, sorted_hashes: np.ndarray) -> None:
        dir_hashes = np.array([path_hash(d.path) for d in self.dirs], dtype=np.uint64)
        lo, hi = np.searchsorted(sorted_hashes, dir_hashes, "left"), np.searchsorted(sorted_hashes, dir_hashes, "right")
        same_hash = [by_hash[a:b] for a, b in zip(lo.tolist(), hi.tolist()) if a < b]
        for m in np.sort(np.concatenate(same_hash)) if same_hash else ():
            path = self.name(int(m))
            if path in self.dir_id:
                live[m] = False
                self._report(
                    f"{names.show(path)}: a file in {self.shard_names[self.shard[m]]} and a directory "
                    "elsewhere; the directory is served"
                )

    def _resolve_duplicates(self, live: np.ndarray, order: np.ndarray, sorted_hashes: np.ndarray) -> None:
        """Same path in several shards: the shard whose path sorts last wins (like layers).
        ``order``: the live members sorted by their hashes ``sorted_hashes``."""
        same = np.flatnonzero(sorted_hashes[1:] == sorted_hashes[:-1])
        if not len(same):
            return
        groups: dict[int, list[int]] = {}
        for i in same:
            group = groups.setdefault(int(sorted_hashes[i]), [int(order[i])])
            group.append(int(order[i + 1]))
        duplicates = 0
        for group in groups.values():
            by_name: dict[bytes, list[int]] = {}
            for m in group:
                by_name.setdefault(self.name(m), []).append(m)
            for path, members in by_name.items():
                if len(members) < 2:
                    continue  # a 64-bit hash collision of different names: both are served
                members.sort()
                winner = members[-1]
                for m in members[:-1]:
                    live[m] = False
                duplicates += 1
                if duplicates <= MAX_REPORTED:
                    where = ", ".join(self.shard_names[self.shard[m]] for m in members)
                    self._report(
                        f"{names.show(path)} is in several shards ({where}); serving the one in "
                        f"{self.shard_names[self.shard[winner]]} (the last in name order)"
                    )
        if duplicates > MAX_REPORTED:
            self._report(f"... and {duplicates - MAX_REPORTED} more paths found in several shards")

    # ---- queries ----------------------------------------------------------

    def name(self, m: int) -> bytes:
        ends = self._name_ends
        return self.names[ends[m - 1] if m else 0 : ends[m]]

    def lookup(self, path: bytes) -> int:
        """Node id of ``path`` (no leading slash), 0 if absent."""
        d = self.dir_id.get(path)
        if d is not None:
            return d + 1
        h = path_hash(path)
        hashes, ids = self.col.lookup_hash, self.col.lookup_id
        i = bisect_left(hashes, h)
        while i < len(hashes) and hashes[i] == h:
            m = ids[i]
            if self.name(m) == path:
                return self.ndirs + 1 + m
            i += 1
        return 0

    def is_dir(self, node: int) -> bool:
        return node <= self.ndirs

    def member(self, node: int) -> int:
        return node - self.ndirs - 1

    def children(self, node: int) -> tuple[list[int], np.ndarray]:
        """(subdirectory ids, member ids of the files and links) of directory ``node``."""
        d = node - 1
        files = self.listing[self.listing_start[d] : self.listing_start[d + 1]]
        return self.subdirs[d], files


class TreeBuilder:
    """A tree made shard by shard as their indexes come, in the tree's order (a first mount feeds
    it while later shards are still being indexed): what is left for ``tree`` is what needs every
    shard (the sorts by hash and by directory, the conflicts). Measured at 4,000,000 members in
    2,000 shards: 0.6 s after the last build, where merging all the indexes then took 0.9-1.4 s."""

    def __init__(self):
        self._tree = Tree.__new__(Tree)
        self._tree._begin([], 0.0)
        self._members = _Members()

    def add(self, ix: ShardIndex) -> None:
        self._tree._append(self._members, ix)

    def tree(self, shard_names: list[str], default_mtime: float = 0.0) -> Tree:
        """The tree of the indexes added, shard ``i`` named ``shard_names[i]``."""
        tree, self._tree = self._tree, None
        tree.shard_names, tree._default_mtime = shard_names, default_mtime
        tree._finish(*tree._use(self._members))
        return tree


def _split(blob: bytes, ends: np.ndarray) -> list[bytes]:
    starts = [0] + ends[:-1].tolist()
    return [blob[a:b] for a, b in zip(starts, ends.tolist())]


_INODE_SPACE = (1 << 63) - 2


def inode_number(path: bytes) -> int:
    """A stable inode number from the path (the root is 1). Equal numbers for different
    paths need a 63-bit hash collision: about one chance in 10^13 at a million files."""
    return 1 if not path else 2 + path_hash(path) % _INODE_SPACE
