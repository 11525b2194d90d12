"""The daemon: open the dataset, serve it over FUSE in the foreground until unmounted.

Signals: libfuse itself turns SIGTERM and SIGINT into a clean unmount (the loop then
returns and we exit 0). SIGHUP rescans the sources. The main thread sits inside the
FUSE loop for the whole mount, so Python signal handlers would never run there: SIGHUP
is delivered through ``signal.set_wakeup_fd`` to a thread that does the rescan.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import resource
import shutil
import signal
import socket
import threading
import time
from shardfs.view import dataset as datasets
from shardfs.view import layouts
from shardfs.view.progress import IndexProgress
from shardfs.view.progress import describe as describe_progress
from shardfs.view.sources import find_shards
from shardfs.formats import compressed, format_for
from shardfs.formats.datafile import Columns
from shardfs.storage import deadline, remote
from shardfs.storage.base import is_url
from shardfs.storage.buildfill import Keeper
from shardfs.storage.memory import default_budget, share_budget
from shardfs.storage.disk import DiskTier
from shardfs.storage.pressure import PressureWatcher
from shardfs.storage.placement import filesystem_type, is_local_disk
from shardfs.storage.readers_first import ReadersFirst
from shardfs.storage.ram import ShardCache
from shardfs.service.config import MountConfig, check_storage_folders
from shardfs.service.notify import Notifier
from shardfs.service.saved_view import SavedView, saved_views_wanted
from shardfs.fuse import devfd
from shardfs.fuse.stats import Stats
from shardfs.errors import ShardfsError, UsageError

log = logging.getLogger("shardfs")

# Threads of the FUSE loop: enough that readers waiting on storage do not block the
# others (the GIL makes more pointless). A reader waits at most storage.deadline.TIMEOUT
# (30 s) for storage, well under the unit's WatchdogSec=120, whose statfs needs a free one.
MAX_THREADS = 32
# Shards streamed in at once: local storage wants a few large sequential readers; object
# stores and HTTP servers give more throughput to more parallel ranged GETs.
LOCAL_LOADERS, REMOTE_LOADERS = 2, 8
CAP_SYS_ADMIN = 21  # its bit in /proc/self/status's CapEff


def _raise_fd_limit() -> None:
    # One descriptor per shard in use: thousands of shards need more than the usual 1024.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _fixed_mmap_threshold() -> None:
    """Large buffers (storage runs of 8 MiB, large replies) are mapped and unmapped, never kept:
    glibc would otherwise raise its mmap threshold after the first such free, and from then on
    keep freed megabytes in each worker thread's arena (measured: ~70 MB over the cache budget)."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 256 << 10)  # M_MMAP_THRESHOLD: fixed, not dynamic
    except (OSError, AttributeError):
        pass  # not glibc


def _return_freed_memory() -> None:
    """Merging the indexes, then building the request loop's table, each leave freed heap that
    glibc keeps (measured at 1M members in 1,000 shards: 155 MB, then 52 MB); give it back
    before serving for hours."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _describe(view: datasets.Dataset) -> str:
    tree = view.tree
    return (f"{len(view.shards)} shards, {tree.nfiles} files in {tree.ndirs} directories, "
            f"{tree.total_size / 1e9:.1f} GB")


def _compressed(path: str) -> bool:
    fmt = format_for(path)
    return fmt is not None and getattr(fmt, "decompresses", False)


def _local_bytes(found: list[str]) -> int:
    """The size of the local shards (remote ones count as too large: their size is not known yet)."""
    total = 0
    for path in found:
        try:
            total += os.path.getsize(path) if not is_url(path) else 1 << 62
        except OSError:
            pass
    return total


def _disk_tier(opts: MountConfig, loaders: int, publisher, keep_first, readers_first: ReadersFirst) -> DiskTier | None:
    """The disk tier asked for, or the service's own (systemd CacheDirectory=), or none."""
    where = opts.disk_cache
    if where is None and os.environ.get("CACHE_DIRECTORY"):
        where = os.path.join(os.environ["CACHE_DIRECTORY"].split(":")[0], "tier")
    if not where or where == "off":
        return None
    try:
        tier = DiskTier(where, opts.disk_cache_size, loaders, publisher, keep_first, readers_first)
    except OSError as exc:  # a mount without its tier still serves every byte
        log.warning("disk tier %s: %s; not used", where, exc.strerror or exc)
        return None
    if not is_local_disk(tier.dir):
        log.warning("disk tier %s is on %s, not on a local disk filesystem: it may gain nothing", tier.dir,
                    filesystem_type(tier.dir))
    snap = tier.snapshot()
    log.info("disk tier %s: bound %.1f GiB, %d shards (%.1f GiB) there already", where, tier.bound / 2**30,
             snap["shards"], snap["held_bytes"] / 2**30)
    return tier


def _disk_status(disk: dict) -> str:
    return (f"; disk tier {disk['held_bytes'] / 2**30:.1f}/{disk['bound_bytes'] / 2**30:.1f} GiB, "
            f"{disk['shards']} shards, {disk['hits']} hits" + (f", off: {disk['disabled']}" if disk["disabled"] else ""))


def _peers_status(peers: dict) -> str:
    return (f"; peers {peers['peers_up']} up, {peers['peers_down']} down, {peers['bytes_from_peers'] / 1e9:.2f} GB "
            f"from them, {peers['bytes_to_peers'] / 1e9:.2f} GB to them, shared storage "
            f"{peers['storage_bytes_read'] / 1e9:.2f} GB")


class Daemon:
    def __init__(self, cfg: MountConfig, ready_fd: int | None = None, on_detach=None):
        # absolute now: libfuse changes the working directory to / once mounted
        self.sources, self.mountpoint, self.opts = cfg.sources, os.path.abspath(cfg.mountpoint), cfg
        self.metrics = None
        self.peers = None
        self.sharing = None  # with peers: one index build per job (peer_indexes.py)
        self.saved_view: SavedView | None = None  # the view saved for the next mount (saved_view.py)
        self.ready_fd, self.on_detach = ready_fd, on_detach
        self.began = time.monotonic()  # the start of our work (the interpreter started, our modules imported)
        self.ready_seconds = None  # from then until the mount answered
        self.notifier = Notifier()
        self.stats = Stats()
        self._rescan_lock = threading.Lock()

    def serve(self) -> int:
        """Mount and serve until unmounted, in the steps below."""
        try:
            self.layout = layouts.from_options(self.opts.layout, self.opts.class_names)  # read once: a rescan keeps it
            self.columns = Columns.parse(self.opts.columns)
            self._prepare_process()
            self._start_peers()
            self._report("finding shards")
            check_storage_folders(self.opts)
            found = find_shards(self.sources)
            self._make_caches(found)  # before the view: the index builds fill them (storage/buildfill.py)
            view = self._open_view(found)
            self._serve_from_caches(view)
            self._make_filesystem(view)
        except (ShardfsError, OSError) as exc:
            if self.ready_fd is None:  # `shardfs mount --foreground`: the command line says it
                raise
            from shardfs.service.mount import refuse

            return refuse(self.ready_fd, exc)
        started = time.monotonic()
        # Idle workers are never destroyed: a pool that shrinks after each burst creates new
        # threads (and their Python thread states) for the next one.
        if self.server.loop(MAX_THREADS, MAX_THREADS) > 0:
            log.info("stopped by a signal")  # libfuse has unmounted: a clean stop
        self._stop(time.monotonic() - started)
        # Exit now, whatever is still under way: storage reads left on daemon threads (a peer's
        # request, a disk-tier fill, on storage that does not answer) end with the process. So do
        # the shards' descriptors: closing one that such a read still uses could give its number
        # to another file.
        return 0

    def _prepare_process(self) -> None:
        _raise_fd_limit()
        _fixed_mmap_threshold()
        watchdog = self.notifier.watchdog_s
        if watchdog and watchdog < 2 * deadline.TIMEOUT:
            log.warning("the watchdog interval (%.0f s) is under twice the storage timeout (%.0f s, "
                        "SHARDFS_STORAGE_TIMEOUT): a storage outage may get the daemon killed", watchdog,
                        deadline.TIMEOUT)

    def _start_peers(self) -> None:
        opts = self.opts
        if opts.peers and len(opts.peers) > 1:  # listening first: a port in use stops the mount at once
            from shardfs.service.peer_indexes import IndexSharing
            from shardfs.storage.peers.net import PeerNet

            self.peers = PeerNet(opts.peers, opts.peer_self)
            self.sharing = IndexSharing(self.peers, opts.index_dir, self.columns,
                                        opts.workers or min(8, os.cpu_count() or 1))

    def _open_view(self, found: list[str]) -> datasets.Dataset:
        """Load or build the indexes of the shards found (saying how far it is; with peers, the
        owned shards' first, then the others' from their owners), merge the tree."""
        opts = self.opts
        began = time.monotonic()
        if self.sharing:  # the indexes of the shards we own first: the other nodes ask for them
            self.sharing.know(found)
            self.sharing.build_owned(lambda done, total: self._report(f"built {done}/{total} indexes for the peers"))
        # (Not with peers: their indexes come from the shards' owners.)
        if not self.sharing and saved_views_wanted():
            self.saved_view = SavedView(self.sources, opts.index_dir, self.layout, self.columns)
        view = self.saved_view.load(found, self.slots) if self.saved_view else None
        mapped = view is not None
        if view is None:
            view = datasets.open_dataset(self.sources, opts.index_dir, opts.workers, self.layout, columns=self.columns,
                                         progress=IndexProgress(self._index_progress),
                                         found=found, fetch_index=self.sharing.fetch if self.sharing else None,
                                         keep=self.keeper, save_behind=True)
        view.seconds = time.monotonic() - began  # the owned shards' indexes built first included
        self._join_peers(view)
        for line in view.problems:
            log.warning("%s", line)
        log.info("%s; index ready in %.2f s (%d built, %d from peers, rest loaded)", _describe(view), view.seconds,
                 view.built + (self.sharing.built if self.sharing else 0), view.from_peers)
        self._index_figures(view, mapped)
        _return_freed_memory()
        return view

    def _make_caches(self, found: list[str]) -> None:
        """The RAM cache (its budget) and the disk tier, for the shards found; and whether index
        builds fill them as they read (the disk tier; RAM too with --prefetch all where the budget
        holds the shards; never with peers)."""
        from shardfs.fuse.table import Slots  # these load libfuse: `shardfs index` etc. work without it

        opts = self.opts
        if opts.cache_size:
            budget, why = share_budget(opts.cache_size)
        else:
            budget, why = default_budget()
        self.budget_why = why
        self.remote = any(is_url(p) for p in found)
        if self.remote:
            log.info("remote shards; storage options %s", remote.redact_options(opts.storage_options) or "none")
        loaders = self.loaders = opts.loaders or (REMOTE_LOADERS if self.remote else LOCAL_LOADERS)
        self.slots = Slots()
        owns = self.peers.owns if self.peers else None
        readers_first = ReadersFirst(loaders)  # readers' storage reads before the cache's loads and the tier's fills
        self.disk = _disk_tier(opts, loaders, self.slots, owns, readers_first)
        self.cache = ShardCache([], budget, opts.prefetch, loaders, disk=self.disk, publisher=self.slots,
                                keep_first=owns, readers_first=readers_first)
        # In RAM only where the cache would load every shard anyway (--prefetch all): else it
        # keeps the shards readers touch, as without the one pass. (Not with peers: each shard's
        # owner reads it, and the others ask the owner for it.)
        in_ram = opts.prefetch == "all" and budget >= _local_bytes(found)
        # Compressed tars are kept as their builds decompress them (formats/ctar.py), whatever the prefetch.
        keep = not self.peers and (self.disk or in_ram or any(_compressed(p) for p in found))
        self.keeper = Keeper(self.disk, self.cache, in_ram) if keep else None
        self.pressure = PressureWatcher(self.cache)
        self.pressure.start()

    def _serve_from_caches(self, view: datasets.Dataset) -> None:
        """The view's shards in the caches: those the index builds read whole resident, the rest
        prefetched as asked; peers served from them."""
        if self.keeper is not None:
            adopted = self.keeper.adopt(view.shards)
            if adopted:
                log.info("%d shards kept in RAM as their indexes were built", adopted)
        self.cache.prefetch_all(view.shards)
        if self.peers:
            self.peers.ready(self.cache.fetch, self.cache.loaded, self.cache.load)
        log.info("cache budget %.2f GiB (%s) for %.2f GiB of shards; prefetch: %s; %d loaders",
                 self.cache.budget / 2**30, self.budget_why, sum(s.size for s in view.shards) / 2**30,
                 self.opts.prefetch, self.loaders)

    def _make_filesystem(self, view: datasets.Dataset) -> None:
        """The operations over the view and caches, and the FUSE session at the mountpoint."""
        from shardfs.fuse import table
        from shardfs.fuse.ops import ShardFS  # (libfuse, as above)
        from shardfs.fuse.server import Server

        opts = self.opts
        self.fs = ShardFS(view, self.cache, self.stats, extra_stats=self.figures, on_ready=self._ready,
                          on_destroy=lambda: self.notifier.send(stopping="1", status="unmounting"))
        fsname = remote.redact(self.sources[0]).replace(",", "_") if self.sources else "shardfs"
        options = ["ro", "default_permissions", f"fsname={fsname}", "subtype=shardfs"]
        options += ["allow_other"] if opts.allow_other else []
        options += ["auto_unmount"] if opts.auto_unmount and self._can_auto_unmount() else []
        first_table = self.saved_view.table(view, self.slots) if self.saved_view else table.build(view, self.slots)
        view.settle()  # the indexes built are saved while the tree and its table are made
        try:
            self.server = Server(self.fs, self.slots, self.mountpoint, options, first_table)
        except OSError as exc:  # libfuse or fusermount3 said why just above
            raise UsageError(f"{exc}{_why_mounts_are_refused()}") from None
        _return_freed_memory()
        self._listen_for_sighup()

    def _stop(self, seconds: float) -> None:
        """After the loop: stop what runs beside it, and log the summary."""
        if self.saved_view:
            self.saved_view.wait()
        self.notifier.stop()
        if self.metrics is not None:
            self.metrics.stop()
        self.pressure.stop()
        if self.peers:
            self.sharing.close()
            self.peers.close()
        self.cache.close()
        self._log_summary(seconds)

    def _can_auto_unmount(self) -> bool:
        # A /dev/fd/N mountpoint was mounted by whoever opened it: they unmount it, and our loop ends then.
        if devfd.descriptor(self.mountpoint) is not None:
            return False
        if shutil.which("fusermount3") is None:  # root without it: libfuse mounts with mount(2) alone
            log.warning("fusermount3 is missing: no auto_unmount (a killed daemon leaves its mount stale "
                        "until `shardfs umount` or the next `shardfs mount` there)")
            return False
        return True

    # ---- figures ------------------------------------------------------------

    def figures(self) -> dict:
        view = self.fs.view
        return {
            "pid": os.getpid(),
            "sources": [remote.redact(s) for s in self.sources],
            "mountpoint": self.mountpoint,
            "shards": len(view.shards),
            "shards_broken": sum(1 for s in view.shards if s.broken),
            "shards_damaged": view.damaged,
            "files": view.tree.nfiles,
            "directories": view.tree.ndirs,
            "bytes": view.tree.total_size,
            "problems": len(view.problems),
            **self._indexes(),
            "ready_seconds": self.ready_seconds,
            "rss_peak_bytes": peak_rss_bytes(),
            "cache": self.cache.snapshot(),
            "memory": self.pressure.figures(),
            **({"disk": self.disk.snapshot()} if self.disk else {}),
            "decompressed": compressed.counts(),  # compressed tars (formats/ctar.py)
            **({"remote": remote.counters()} if self.remote else {}),
            **({"peers": self.peers.figures()} if self.peers else {}),
        }

    def _index_figures(self, view: datasets.Dataset, mapped: bool = False) -> None:
        """``mapped``: the view is a saved view's (saved_view.py)."""
        self.index_figures = {"index_seconds": round(view.seconds, 3), "indexes_built": view.built,
                              "indexes_from_peers": view.from_peers, "view_mapped": mapped}

    def _indexes(self) -> dict:
        """The last index load's figures; built: also those built for the peers (owned shards first)."""
        built = self.index_figures["indexes_built"] + (self.sharing.built if self.sharing else 0)
        return {**self.index_figures, "indexes_built": built}

    def _join_peers(self, view: datasets.Dataset) -> None:
        """With peers, every shard's bytes come from its owner (see storage/peers)."""
        if self.peers:
            view.shards[:] = self.peers.place(view.shards)

    def _status_line(self) -> str:
        snap, cache = self.stats.snapshot(), self.cache.snapshot()
        return (f"{snap['fuse_ops'].get('read', 0)} reads, {snap['bytes_served'] / 1e9:.2f} GB served; "
                f"cache {cache['used_bytes'] / 2**30:.1f}/{cache['budget_bytes'] / 2**30:.1f} GiB, "
                f"{cache['shards_cached']} shards cached; storage {cache['storage_bytes_read'] / 1e9:.2f} GB "
                f"at {cache['storage_read_rate_MBps']:.0f} MB/s"
                + (_disk_status(self.disk.snapshot()) if self.disk else "")
                + (_peers_status(self.peers.figures()) if self.peers else ""))

    def _log_summary(self, seconds: float) -> None:
        snap, cache = self.stats.snapshot(), self.cache.snapshot()
        log.info(
            "unmounted %s after %.0f s: %d reads, %.1f MB served, %d read errors, peak RSS %.0f MB; "
            "cache: %d hits, %d misses (%d direct), %.1f MB read from storage at %.0f MB/s, %d shards evicted",
            self.mountpoint, seconds, snap["fuse_ops"].get("read", 0), snap["bytes_served"] / 1e6,
            snap["read_errors"], peak_rss_bytes() / 1e6, cache["hits"], cache["misses"], cache["direct_reads"],
            cache["storage_bytes_read"] / 1e6, cache["storage_read_rate_MBps"], cache["shards_evicted"],
        )

    # ---- lifecycle ----------------------------------------------------------

    def _index_progress(self, figures: dict) -> None:
        if figures["built"] or figures["shards"] < figures["of"]:  # a remount that loads them all: no lines
            log.info("%s", describe_progress(figures))
        self._report(f"indexed {figures['shards']}/{figures['of']} shards", figures)

    def _report(self, step: str, index: dict | None = None) -> None:
        """Tell a waiting `shardfs mount` that we are getting on (it gives up on silence);
        ``index``: how far the index step is (progress.IndexProgress), shown on its terminal."""
        if self.ready_fd is None:
            return
        try:
            message = {"progress": step, **({"index": index} if index else {})}
            os.write(self.ready_fd, json.dumps(message).encode() + b"\n")
        except OSError:
            pass  # `shardfs mount` is gone: nobody to tell

    def _ready(self) -> None:
        self.ready_seconds = round(time.monotonic() - self.began, 3)
        log.info("mounted at %s, %.2f s after the daemon's start", self.mountpoint, self.ready_seconds)
        if self.ready_fd is not None:
            os.write(self.ready_fd, json.dumps(self.figures()).encode() + b"\n")
            os.close(self.ready_fd)
            self.ready_fd = None
        if self.on_detach is not None:
            self.on_detach()
        self.notifier.send(ready="1", status=f"serving {_describe(self.fs.view)}")
        self.notifier.start_background(healthy=self._healthy, status=self._status_line)
        if self.opts.metrics_dir:
            from shardfs.service.metrics import TextfileWriter

            self.metrics = TextfileWriter(self.opts.metrics_dir, self.mountpoint, self.fs.figures,
                                          self.opts.metrics_interval)
            self.metrics.start()
        if self.saved_view:  # (after the ready message: the mount does not wait for it)
            self.saved_view.save_in_background()

    def _healthy(self) -> bool:
        """The watchdog's question: does the mount answer? (statfs goes through the FUSE loop.)"""
        try:
            os.statvfs(self.mountpoint)
            return True
        except OSError:
            return False

    def _listen_for_sighup(self) -> None:
        receive, send = socket.socketpair()
        send.setblocking(False)
        signal.signal(signal.SIGHUP, lambda *_: None)  # a C handler that feeds the wakeup fd
        signal.set_wakeup_fd(send.fileno(), warn_on_full_buffer=False)
        self._wakeup = (receive, send)  # keep both ends alive

        def wait() -> None:
            while True:
                for signum in receive.recv(64):
                    if signum == signal.SIGHUP:
                        self.rescan()

        threading.Thread(target=wait, name="shardfs-signals", daemon=True).start()

    def rescan(self) -> None:
        """SIGHUP: pick up shards added to or removed from the sources, without unmounting."""
        with self._rescan_lock:
            self.notifier.send(reloading="1", status="rescanning sources",
                               monotonic_usec=str(time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000))
            old = self.fs.view
            try:
                new = datasets.rescan(old, self.sources, self.opts.index_dir, self.opts.workers, self.layout,
                                      columns=self.columns)
                self._join_peers(new)
            except Exception as exc:  # keep serving the old view whatever went wrong
                log.error("rescan failed, still serving the previous view: %s", exc)
                self.notifier.send(ready="1")
                return
            known = {s.path for s in old.shards}
            added = [s for s in new.shards if s.path not in known]
            for line in new.problems:
                if line not in old.problems:
                    log.warning("%s", line)
            self.server.swap(new)
            self._index_figures(new)
            self.cache.prefetch_all(added)
            log.info("rescan: %s (%d shards added, %d broken)", _describe(new), len(added),
                     sum(1 for s in new.shards if s.broken))
            self.notifier.send(ready="1", status=f"serving {_describe(new)}")


def _why_mounts_are_refused() -> str:
    """What a refused mount most often means as root: a container started without CAP_SYS_ADMIN."""
    if os.geteuid() != 0:
        return ""
    try:
        with open("/proc/self/status") as f:
            caps = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        return ""
    if caps & (1 << CAP_SYS_ADMIN):
        return ""
    return ("; this process lacks CAP_SYS_ADMIN, which a FUSE mount needs: in a container, start it with "
            "--cap-add SYS_ADMIN --device /dev/fuse (or --privileged), or mount outside it and bind the "
            "mountpoint in (see the containers page of the documentation)")


def serve(cfg: MountConfig, ready_fd: int | None = None, on_detach=None) -> int:
    return Daemon(cfg, ready_fd, on_detach).serve()
