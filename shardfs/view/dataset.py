"""Open a set of shards as one dataset: find them, load or build their indexes, merge the tree.

Used by the daemon (at mount, and again on SIGHUP to pick up added or removed shards)
and by the commands that work without mounting (index, ls).
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import signal
import threading
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from shardfs import processes
from shardfs.errors import ShardfsError, UsageError
from shardfs.formats import DATA_FORMATS, ShardFormatError, format_for
from shardfs.formats.base import DataLayout
from shardfs.formats.datafile import Columns
from shardfs.index import index_file, shard_index
from shardfs.index.member_columns import MemberColumns
from shardfs.index import store as index_store
from shardfs.storage import deadline
from shardfs.storage.base import Shard, ShardIOError, is_url
from shardfs.storage.local import LocalShard
from shardfs.view import layouts
from shardfs.view.sources import find_shards
from shardfs.view.tree import Tree, TreeBuilder

log = logging.getLogger(__name__)


SOURCES_TIMEOUT = 300.0  # listing the sources at a rescan (a remote listing has its own deadline)


class RescanPostponed(ShardfsError):
    """Storage did not answer during a rescan: nothing was changed, the previous view stays."""


@dataclass
class Dataset:
    """One consistent view: the tree and the shards its member ids point into."""

    tree: Tree
    shards: list[Shard]
    problems: list[str]  # one line per bad shard, refused member or conflict
    seconds: float
    built: int  # indexes built in this run (0 on a remount with persisted indexes)
    damaged: int = 0  # shards served up to or around damage (truncated, a bad header): their index has an error
    from_peers: int = 0  # indexes received from peers in this run (built by the shards' owners)
    # Per shard, the file_id of the index file it was read from or saved to: when the view was made
    # from every shard the sources have, all local, each from an index file (else None); see snapshot.py.
    index_ids: list[tuple] | None = None
    _saving: _SaveBehind | None = field(default=None, repr=False)

    def settle(self) -> None:
        """Wait until the indexes built for this view are saved (``save_behind``), then record
        where each is (``Shard.index_path``, ``index_ids``)."""
        saving, self._saving = self._saving, None
        if saving is None:
            return
        saving.thread.join()
        saved = saving.saved
        for shard in self.shards:
            if shard.path in saved:
                shard.index_path = saved[shard.path][0]
        if self.index_ids is not None:
            ids = [saved[s.path][1] if s.path in saved else i for s, i in zip(self.shards, self.index_ids)]
            self.index_ids = None if None in ids else ids

    def layout(self, shard: Shard) -> DataLayout:
        """Where the shard's logical stream lives in its bytes (tar: as is; lz4: blocks), read
        from the shard once (lz4 tables) and kept with it."""
        found = self._layouts.get(shard.path)
        if found is None:
            try:
                found = format_for(shard.path).open_layout(shard, shard.size)
            except ShardFormatError as exc:
                raise shard.mark_broken(f"cannot read its tables: {exc}") from None
            self._layouts[shard.path] = found
        return found

    def as_stored(self) -> np.ndarray:
        """Per shard, whether its members in the tree are byte ranges of it as stored (the compiled
        loop copies those from the cached shard; the others go through their layout in Python)."""
        tree = self.tree  # its members come shard after shard (Tree._merge)
        starts = np.searchsorted(tree.shard, np.arange(len(self.shards) + 1))
        return np.array([format_for(s.path).as_stored(tree.offset[starts[i]:starts[i + 1]])
                         for i, s in enumerate(self.shards)], bool)

    def __post_init__(self) -> None:
        self._layouts: dict[str, DataLayout] = {}


def _index_worker(parent: int | None) -> None:
    """A build worker ends with the daemon (``parent``, where it forked us directly: see
    processes.pool): killed mid-build (stopped, unmounted by its service), it would leave its
    workers waiting forever on their queue. And it keeps its scan's large
    buffers on its heap: forked from the daemon, it inherits a fixed mmap threshold of 256 KiB
    (service/daemon.py), under which every 4 MiB read of the scan would be mapped afresh and its
    pages faulted in again (measured: 25x the page faults, 1.5-1.8x the time)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if hasattr(libc, "mallopt"):  # glibc
        libc.mallopt(_M_MMAP_THRESHOLD, 64 << 20)
    if not hasattr(libc, "prctl"):  # not Linux
        return
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent is not None and os.getppid() != parent:  # it died before we asked
        os._exit(1)


_PR_SET_PDEATHSIG, _M_MMAP_THRESHOLD = 1, -3


def _load_or_build(args):
    path, index_dir, rebuild, columns, keep, save = args
    try:
        return index_store.load_or_build(path, index_dir, rebuild, columns, keep, save)
    except OSError as exc:  # ShardIOError too: a shard unreachable (after retries), gone or changed
        return None, f"{path}: cannot read: {exc.strerror or exc}"


def _current(path: str, index_dir: str | None, columns: Columns, into: MemberColumns | None = None):
    try:
        return index_store.find_current(path, index_dir, columns, into)
    except OSError:
        return None  # the shard cannot be stat'ed: its job below says so


def index_shards(paths: list[str], index_dir: str | None, workers: int, rebuild: bool = False, progress=None,
                 columns: Columns = Columns(), fetch_index=None, keep=None,
                 into: MemberColumns | None = None, save: bool = True, ready=None):
    """(path, ShardIndex or None, how) for each shard, building missing indexes in parallel
    (threads for tar shards and remote ones, see builds_in_threads; processes for the others).
    ``progress``: a progress.IndexProgress, told as each index is ready. ``fetch_index(path)``: the
    shard's index from a peer (its owner built it), or None; tried before building one.
    ``keep(shard)``: a context around each build that keeps what it reads in this process's caches
    (storage/buildfill.py): builds then run in threads here (the scanner lets go of the GIL). ``into``:
    where the member columns of the indexes read from disk go (member_columns.py). ``save=False``:
    local shards' indexes built here are returned unsaved (how: index_store.TO_BE_SAVED). ``ready(path,
    index or None, how)``: called on this thread as each is ready, in no set order."""
    done: dict[str, tuple] = {}

    def collect(pairs) -> None:
        for path, result in pairs:
            done[path] = result
            if progress is not None:
                progress.add(*result)
            if ready is not None:
                ready(path, *result)

    loaded = []
    if not rebuild:
        # Current local indexes are read here: a read and a few numpy views each, far less than
        # what a worker process would spend pickling them back to us (a remount reads them all).
        # (Read in 4 threads, a 4M-member remount kept 50-75 MB more resident: glibc's per-thread
        # heaps, for no measurable gain at 2 cores.)
        local = [p for p in paths if not is_url(p)]
        if hasattr(os, "posix_fadvise"):
            index_store.prefetch(local, index_dir)
        loaded = [(p, (ix, "loaded")) for p, ix in zip(local, (_current(p, index_dir, columns, into) for p in local))
                  if ix is not None]
    have = {p for p, _ in loaded}
    todo = [p for p in paths if p not in have]
    if progress is not None:
        progress.begin(len(paths), todo)
    collect(loaded)
    if fetch_index is not None and not rebuild and todo:
        collect(_from_peers(todo, fetch_index))
        todo = [p for p in paths if p not in done]
    # A local shard left over has no current index (it was just looked for): built without looking again,
    # unless asking peers may have stored one meanwhile (the shard fell to this node: built for all).
    jobs = [(p, index_dir, rebuild or (not is_url(p) and fetch_index is None), columns, keep, save) for p in todo]
    # a build that keeps what it reads in this process's caches runs here, whatever the format
    in_process, forked = [], []
    for job in jobs:
        (in_process if keep is not None or is_url(job[0]) or builds_in_threads(job[0]) else forked).append(job)
    for group, build_in_threads in ((in_process, True), (forked, False)):
        _build(group, workers, build_in_threads, collect)
    return [(p, *done[p]) for p in paths]


def builds_in_threads(path: str) -> bool:
    """Tar shards are indexed on threads of this process: their scan runs compiled and reads
    storage, both without the GIL (index/plain.py's column work too), and what Python does per shard
    is ~0.5 ms, most of it saving the index;
    measured at 400,000 members in 200 shards, two threads took less time and CPU than two worker
    processes (no fork, no index pickled back), and a build in the daemon's process can keep
    what it reads (the RAM cache). So are the formats that say so (``builds_in_threads``: SquashFS,
    which reads only its tables). Others (Parquet, HDF5, lz4) scan in Python: processes."""
    fmt = format_for(path)
    return fmt is not None and getattr(fmt, "builds_in_threads", getattr(fmt, "gives_columns", False))


def _build(jobs: list, workers: int, in_threads: bool, collect) -> None:
    paths = [job[0] for job in jobs]
    remote = any(is_url(p) for p in paths)
    if len(jobs) > 1 and (in_threads and (remote or workers > 1)):
        with build_pool(len(jobs), workers, in_threads=True, remote=remote) as pool:
            collect(zip(paths, pool.map(_load_or_build, jobs)))
    elif len(jobs) > 1 and workers > 1:
        with build_pool(len(jobs), workers, in_threads=False) as pool:
            collect(zip(paths, pool.map(_load_or_build, jobs, chunksize=1)))
    else:
        collect(zip(paths, map(_load_or_build, jobs)))


def build_pool(builds: int, workers: int, in_threads: bool, remote: bool = False) -> Executor:
    """Where ``builds`` index builds run, ``workers`` (--workers) at a time: threads for tar and
    remote shards (builds_in_threads), else worker processes that end with this one."""
    if in_threads:
        # More threads than cores: remote shards wait on the network; a local shard's scan waits on
        # its reads (O_DIRECT, no readahead) while others parse (measured at 400,000 tiny members,
        # 2 cores: 4 threads took 0.85x the time of 2; at 4,000,000, build minus load over a
        # sequential read: 4 threads 1.22x [1.20-1.23], 6 threads 1.11x [1.07-1.14], 8 1.16x).
        threads = max(workers, 8) if remote else 3 * workers
        return ThreadPoolExecutor(max_workers=min(threads, builds), thread_name_prefix="shardfs-index")
    return processes.pool(min(workers, builds), _index_worker, preload=(__name__,))


FETCHES = 16  # indexes asked of peers at once (each may wait for its owner's build)


def _from_peers(paths: list[str], fetch_index):
    """(path, (index, "from a peer")) for the shards whose index a peer gave."""
    with ThreadPoolExecutor(max_workers=min(FETCHES, len(paths))) as pool:
        got = list(zip(paths, pool.map(fetch_index, paths)))
    return [(path, (ix, "from a peer")) for path, ix in got if ix is not None]


def open_dataset(sources: list[str], index_dir: str | None = None, workers: int | None = None,
                 layout: layouts.ImageFolderLayout | None = None, progress=None,
                 columns: Columns = Columns(), found: list[str] | None = None, fetch_index=None,
                 keep=None, save_behind: bool = False) -> Dataset:
    """``layout``: None shows members as stored; see layouts.py for the imagefolder view.
    ``progress``: a progress.IndexProgress, told as each shard's index is ready. ``columns``: dataset
    files' image and label columns (formats/datafile.py). ``found``: the sources' shards, if
    listed already. ``fetch_index``, ``keep``: see index_shards. The indexes built (of local
    shards, without peers) are saved on a thread of their own while the tree is merged;
    ``save_behind``: the Dataset is returned before they are all saved (Dataset.settle waits)."""
    return _assemble(find_shards(sources) if found is None else found, index_dir, workers, previous=None,
                     layout=layout, progress=progress, columns=columns, fetch_index=fetch_index, keep=keep,
                     save_behind=save_behind)


def rescan(previous: Dataset, sources: list[str], index_dir: str | None = None,
           workers: int | None = None, layout: layouts.ImageFolderLayout | None = None,
           columns: Columns = Columns(), fetch_index=None) -> Dataset:
    """The dataset as the sources are now, keeping what readers may still hold.

    Added shards join the tree. A shard that disappeared or changed on disk keeps its
    files in the tree, answering EIO (never silently dropped from under a reader, never
    other bytes); a remount serves its new contents. Unchanged shards keep their Shard
    object, so what the cache holds of them stays valid.

    Only a definite answer (listed without it, 404, another size, mtime or tag) counts as a
    change: when storage fails to answer (a listing, a stat or HEAD that times out or fails
    otherwise), the rescan raises RescanPostponed and the previous view stays as it is.
    Each shard is marked broken as it is found (``Shard.when_broken``: the compiled loop stops
    serving its cached bytes then, not when the new view is served).
    """
    try:
        # On the storage pool: a listing of a hung mount leaves one pool thread stuck, not the rescan.
        paths = deadline.local_pool.run(deadline.place("the sources"), find_shards, sources,
                                        timeout=SOURCES_TIMEOUT)
    except (UsageError, OSError) as exc:
        raise RescanPostponed(f"cannot list the sources: {exc}") from None
    return _assemble(paths, index_dir, workers, previous, layout, columns=columns, fetch_index=fetch_index)


def _open_shard(path: str, ix: shard_index.ShardIndex) -> Shard:
    if is_url(path):
        from shardfs.storage.remote import RemoteShard

        stored = RemoteShard(path, ix.shard_size, ix.shard_mtime_ns, ix.shard_tag)
    else:
        stored = LocalShard(path, ix.shard_size, ix.shard_mtime_ns)
    return serving(stored, ix.format, ix.logical_size)


def serving(stored: Shard, fmt: str, logical_size: int) -> Shard:
    """The shard the caches serve: a compressed tar's decompressed tar (formats/ctar.py), else itself."""
    if fmt != "ctar":
        return stored
    from shardfs.formats.ctar import StreamShard

    return StreamShard(stored, logical_size)


def _stale_index(shard: Shard) -> shard_index.ShardIndex | None:
    """The index a shard was served from: to keep the files of a vanished or changed one visible."""
    if shard.index_path:
        try:
            ix = index_file.load(shard.index_path)
            ix.stored_at = shard.index_path
            return ix
        except (OSError, ValueError) as exc:
            log.warning("%s: its index %s is unreadable (%s): its files leave the tree", shard.path,
                        shard.index_path, exc)
    return None


def _assemble(paths: list[str], index_dir: str | None, workers: int | None, previous: Dataset | None,
              layout: layouts.ImageFolderLayout | None = None, progress=None,
              columns: Columns = Columns(), fetch_index=None, keep=None, save_behind: bool = False) -> Dataset:
    started = time.monotonic()
    workers = workers or min(8, os.cpu_count() or 1)
    problems: list[str] = []
    old = {shard.path: shard for shard in previous.shards} if previous else {}
    entries = _broken_since_mount(old, paths, problems)

    fresh = [p for p in paths if p not in entries]
    stored = index_store.stored_bytes([p for p in fresh if not is_url(p)], index_dir)
    into = MemberColumns(stored)
    # A first view's builds do not save (not with peers: others may ask for those files at once).
    # Never indexed before, its tree is filled as the indexes come.
    save_later = previous is None and fetch_index is None
    coming = _InTreeOrder(fresh, TreeBuilder()) if previous is None and layout is None and not stored else None
    built, from_peers, unsaved = _index_fresh(fresh, old, entries, problems, index_dir=index_dir, workers=workers,
                                              progress=progress, columns=columns, fetch_index=fetch_index, keep=keep,
                                              into=into, save=not save_later, ready=coming)

    if not entries:
        raise UsageError("no readable shard: " + "; ".join(problems[:3]))
    pending = {p for p, _ in unsaved}
    # Saved behind the builds, not during them: files written alongside slowed the builds (4M
    # members: 8.1-8.8 s instead of 6.0-6.8 s, with the same reads).
    saving = _SaveBehind(unsaved, index_dir) if unsaved else None
    order = sorted(entries)
    tree = _tree_of(order, entries, coming, layout, into, problems)
    del into, coming  # (the tree keeps the columns it took over)
    damaged = sum(1 for p in order if entries[p][0].error)
    ids = [entries[p][0].stored_id for p in order]
    shards = [entries[p][1] for p in order]
    del entries, unsaved  # (the built indexes: let go of by the writer as each is saved)
    whole = (previous is None and len(order) == len(paths) and not any(map(is_url, order))
             and all(i is not None or p in pending for p, i in zip(order, ids)))
    view = Dataset(tree, shards, problems, time.monotonic() - started, built, damaged,
                   from_peers=from_peers, index_ids=ids if whole else None, _saving=saving)
    if not save_behind:
        view.settle()
    return view


def _broken_since_mount(old: dict[str, Shard], paths: list[str], problems: list[str]) -> dict:
    """A rescan: the shards that vanished or changed since the mount, marked broken (EIO from now
    on) and kept in the view with the index they had: path -> (index, shard)."""
    entries: dict[str, tuple[shard_index.ShardIndex, Shard]] = {}
    try:  # decided for every shard before any is marked: one that cannot be asked stops the rescan
        changed = [(path, shard) for path, shard in old.items() if path not in paths or shard.changed()]
    except ShardIOError as exc:
        raise RescanPostponed(str(exc)) from None
    for path, shard in changed:
        why = "disappeared" if path not in paths else "changed on disk; remount to serve its new contents"
        shard.mark_broken(why)
        problems.append(f"{path}: {why}; its files answer EIO")
        ix = _stale_index(shard)
        if ix is not None:
            entries[path] = (ix, shard)
    return entries


def _index_fresh(fresh: list[str], old: dict[str, Shard], entries: dict, problems: list[str],
                 **how_to) -> tuple[int, int, list]:
    """Every fresh shard's index (``index_shards`` with ``how_to``) into ``entries``, what is
    wrong with them into ``problems``: (indexes built, received from peers, built but not saved yet)."""
    built = from_peers = 0
    unsaved: list[tuple[str, shard_index.ShardIndex]] = []
    for path, ix, how in index_shards(fresh, **how_to):
        if ix is None and path in old:  # unchanged a moment ago: storage failed, not the shard
            ix = _stale_index(old[path])
            if ix is None:
                raise RescanPostponed(how)
        if ix is None:
            problems.append(how)
            continue
        built += how.startswith("built")
        if how == index_store.TO_BE_SAVED:
            unsaved.append((path, ix))
        from_peers += how == "from a peer"
        problems.extend(ix.warnings)
        if ix.error:
            problems.append(ix.error + (f" ({len(ix)} members served, the rest left out)" if len(ix) else ""))
            if not _served(ix):
                continue
        shard = old.get(path)
        if shard is None:
            shard = _open_shard(path, ix)
        shard.index_path = ix.stored_at
        entries[path] = (ix, shard)
    return built, from_peers, unsaved


def _tree_of(order: list[str], entries: dict, coming, layout, into: MemberColumns, problems: list[str]) -> Tree:
    """The view's tree of the shards in ``order``: the one filled as the indexes came where it has
    them all in that order, else merged now (through the layout)."""
    newest = max(entries[p][0].shard_mtime_ns for p in order) / 1e9
    shown = [os.path.basename(p) for p in order]
    if coming is not None and coming.builder is not None and coming.added == order:
        tree = coming.builder.tree(shown, default_mtime=newest)
    else:
        views, notes = layouts.apply(layout, shown, [entries[p][0] for p in order])
        problems.extend(notes)
        tree = Tree(shown, views, default_mtime=newest, columns=into)
        del views
    problems.extend(tree.problems)
    return tree


def _served(ix: shard_index.ShardIndex) -> bool:
    """Whether a shard's index puts it in the view: damaged ones serve the members before the damage."""
    return not ix.error or len(ix) > 0


class _InTreeOrder:
    """The served indexes of a first view, handed to the tree builder in the tree's order (sorted
    paths) as ``index_shards`` has them ready, each as soon as those before it are. A layout that
    needs every index first (dataset files' rows in class folders) leaves the builder out: the
    tree is then merged at the end."""

    def __init__(self, paths: list[str], builder: TreeBuilder):
        self.builder: TreeBuilder | None = builder
        self.added: list[str] = []  # the paths whose indexes the builder has, in order
        self._order = iter(sorted(paths))
        self._next = next(self._order, None)
        self._waiting: dict[str, shard_index.ShardIndex | None] = {}

    def __call__(self, path: str, ix: shard_index.ShardIndex | None, how: str) -> None:
        if self.builder is None:
            return
        self._waiting[path] = ix
        while self._next in self._waiting:
            ix = self._waiting.pop(self._next)
            if ix is not None and _served(ix):
                if ix.format in DATA_FORMATS:  # shown through layouts.apply
                    self.builder = None
                    return
                self.builder.add(ix)
                self.added.append(self._next)
            self._next = next(self._order, None)


class _SaveBehind:
    """The indexes built for a first view, saved on a thread of their own once the builds are done:
    the builds do not wait on creating files (at 4M members, 340 MB of index files in 2,000: ~2 s
    of CPU, most of it the kernel's), and the writes use the core the merge leaves idle."""

    def __init__(self, built: list[tuple[str, shard_index.ShardIndex]], index_dir: str | None):
        self._todo = collections.deque(built)  # each index let go of once saved (the tree has its arrays)
        self.saved: dict[str, tuple[str | None, tuple | None]] = {}  # path: (stored_at, stored_id)
        self.thread = threading.Thread(target=self._run, args=(index_dir,), name="shardfs-index-save", daemon=True)
        self.thread.start()

    def _run(self, index_dir: str | None) -> None:
        started = time.monotonic()
        while self._todo:
            path, ix = self._todo.popleft()
            try:
                index_store.save_built(ix, path, index_dir)  # (says where it could not)
            except Exception:  # a bug: the next mount builds this index again
                log.exception("%s: saving its index failed", path)
            self.saved[path] = (ix.stored_at, ix.stored_id)
        log.info("%d indexes built saved in %.2f s", sum(at is not None for at, _ in self.saved.values()),
                 time.monotonic() - started)
