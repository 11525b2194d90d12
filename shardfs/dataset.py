"""Open a set of shards as one dataset: find them, load or build their indexes, merge the tree.

Used by the daemon and by the commands that work without mounting (index, ls).
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from . import index as shard_index
from .errors import UsageError
from .shards import Shard
from .sources import find_shards
from .tree import Tree

log = logging.getLogger(__name__)


@dataclass
class Dataset:
    tree: Tree
    shards: list[Shard]
    problems: list[str]  # one line per bad shard, refused member or conflict
    seconds: float
    built: int  # indexes built in this run (0 on a remount with persisted indexes)


def _load_or_build(args):
    path, index_dir, rebuild = args
    try:
        return shard_index.load_or_build(path, index_dir, rebuild)
    except OSError as exc:
        return None, f"{path}: cannot read: {exc.strerror or exc}"


def index_shards(paths: list[str], index_dir: str | None, workers: int, rebuild: bool = False):
    """(path, ShardIndex or None, how) for each shard, building missing indexes in parallel."""
    jobs = [(p, index_dir, rebuild) for p in paths]
    if workers > 1 and len(paths) > 1:
        with ProcessPoolExecutor(max_workers=min(workers, len(paths))) as pool:
            results = list(pool.map(_load_or_build, jobs, chunksize=1))
    else:
        results = [_load_or_build(job) for job in jobs]
    return [(p, ix, how) for p, (ix, how) in zip(paths, results)]


def open_dataset(sources: list[str], index_dir: str | None = None, workers: int | None = None) -> Dataset:
    started = time.monotonic()
    paths = find_shards(sources)
    workers = workers or min(8, os.cpu_count() or 1)
    problems: list[str] = []
    kept, indexes, built = [], [], 0
    for path, ix, how in index_shards(paths, index_dir, workers):
        if ix is None:
            problems.append(how)
            continue
        built += how.startswith("built")
        problems.extend(ix.warnings)
        if ix.error:
            problems.append(ix.error + (f" (its first {len(ix)} members are served)" if len(ix) else ""))
            if not len(ix):
                continue
        kept.append(path)
        indexes.append(ix)
    if not kept:
        raise UsageError("no readable shard: " + "; ".join(problems[:3]))
    newest = max(os.stat(p).st_mtime for p in kept)
    tree = Tree([os.path.basename(p) for p in kept], indexes, default_mtime=newest)
    problems.extend(tree.problems)
    shards = [Shard(p, ix.shard_size, ix.shard_mtime_ns) for p, ix in zip(kept, indexes)]
    return Dataset(tree, shards, problems, time.monotonic() - started, built)
