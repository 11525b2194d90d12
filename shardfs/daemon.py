"""The daemon: open the dataset, serve it over FUSE in the foreground until unmounted."""

from __future__ import annotations

import json
import logging
import os
import resource
import time
from dataclasses import dataclass

from .cache import ShardCache, default_budget, parse_size
from .dataset import open_dataset
from .reader import MemberReader
from .stats import Stats

log = logging.getLogger("shardfs")

# Threads of the FUSE loop: enough that readers waiting on a shard load do not block the
# others (the GIL makes more pointless).
MAX_THREADS = 32


@dataclass
class MountOptions:
    allow_other: bool = False
    index_dir: str | None = None
    workers: int | None = None
    cache_size: str | None = None  # "64G", "50%"; None: half of the available memory
    prefetch: str = "touched"
    loaders: int = 2


def _raise_fd_limit() -> None:
    # One descriptor per shard in use: thousands of shards need more than the usual 1024.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def serve(sources: list[str], mountpoint: str, opts: MountOptions, ready_fd: int | None = None,
          on_detach=None) -> int:
    from .fs import ShardFS, fuse  # imports libfuse: keep `shardfs index` etc. usable without it

    _raise_fd_limit()
    dataset = open_dataset(sources, opts.index_dir, opts.workers)
    tree = dataset.tree
    for line in dataset.problems:
        log.warning("%s", line)
    log.info(
        "%d shards, %d files in %d directories, %.1f GB; index ready in %.2f s (%d built, rest loaded)",
        len(dataset.shards), tree.nfiles, tree.ndirs, tree.total_size / 1e9, dataset.seconds, dataset.built,
    )
    stats = Stats()
    if opts.cache_size:
        budget, why = parse_size(opts.cache_size), f"--cache-size {opts.cache_size}"
    else:
        budget, why = default_budget()
    cache = ShardCache(dataset.shards, budget, opts.prefetch, opts.loaders)
    log.info("cache budget %.2f GiB (%s) for %.2f GiB of shards; prefetch: %s",
             budget / 2**30, why, sum(s.size for s in dataset.shards) / 2**30, opts.prefetch)
    reader = MemberReader(tree, dataset.shards, cache)
    summary = {
        "pid": os.getpid(),
        "sources": sources,
        "mountpoint": os.path.abspath(mountpoint),
        "shards": len(dataset.shards),
        "files": tree.nfiles,
        "directories": tree.ndirs,
        "bytes": tree.total_size,
        "problems": len(dataset.problems),
        "index_seconds": round(dataset.seconds, 3),
        "indexes_built": dataset.built,
    }

    def extra_stats() -> dict:
        return {**summary, "rss_peak_bytes": peak_rss_bytes(), "cache": cache.snapshot()}

    def on_ready() -> None:
        log.info("mounted at %s", mountpoint)
        if ready_fd is not None:
            os.write(ready_fd, json.dumps(summary).encode() + b"\n")
            os.close(ready_fd)
        if on_detach is not None:
            on_detach()

    ops = ShardFS(tree, dataset.shards, reader, stats, extra_stats=extra_stats, on_ready=on_ready)
    fsname = sources[0].replace(",", "_") if sources else "shardfs"
    started = time.monotonic()
    try:
        fuse.FUSE(
            ops,
            mountpoint,
            foreground=True,
            ro=True,
            default_permissions=True,
            allow_other=opts.allow_other,
            fsname=fsname,
            subtype="shardfs",
            max_threads=MAX_THREADS,
            max_idle_threads=8,  # also silences libfuse 3.14 warning about its own default
        )
    except RuntimeError as exc:
        # libfuse's fuse_main returns 8 when its loop ends on SIGTERM/SIGINT/SIGHUP; it has
        # unmounted by then, so that is a clean stop. Anything else is a real failure.
        if exc.args != (8,):
            raise
        log.info("stopped by a signal")
    cache.close()
    snap, figures = stats.snapshot(), cache.snapshot()
    log.info(
        "unmounted %s after %.0f s: %d reads, %.1f MB served, %d read errors, peak RSS %.0f MB; "
        "cache: %d hits, %d misses (%d direct), %.1f MB read from storage at %.0f MB/s, %d shards evicted",
        mountpoint, time.monotonic() - started, snap["fuse_ops"].get("read", 0), snap["bytes_served"] / 1e6,
        snap["read_errors"], peak_rss_bytes() / 1e6, figures["hits"], figures["misses"], figures["direct_reads"],
        figures["storage_bytes_read"] / 1e6, figures["storage_read_rate_MBps"], figures["shards_evicted"],
    )
    for shard in dataset.shards:
        shard.close()
    return 0
