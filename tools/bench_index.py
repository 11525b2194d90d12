#!/usr/bin/env python3
"""By-hand benchmark of issue 31's first target (NOT a test): building the indexes of tar shards
against one sequential read of them.

Per round, page cache dropped before each step:

  sequential  every shard read once front to back in 4 MiB reads (in this process)
  build       `shardfs index --workers W` with no index present (the indexes beside the shards
              moved aside first, see benchlib/old_indexes.py): a first mount's index build, plus the command's start
  load        the same command again, every index current: the command's start and the loading
              (as a remount), subtracted from `build`

and reports build - load over sequential (the target: at most 1.2), medians [min-max] over
--rounds, each ratio taken within its round, with the CPU the build used (user+sys) and the load
average.

Two kinds of storage:

  --shards DIR   the tar shards in DIR, where the indexes are written beside them (use a folder
                 of your own: hard links to another run's shards keep that run's files as they are)
  --capped       the shared storage of tools/bench_tier.py (an ext4 image on a loop device, reads
                 capped by a blkio cgroup: --iops, --bps) holding ~110 KB JPEGs packed into
                 shards (bench_dataset.on_capped_storage, made once and reused); this process and
                 the commands it runs are in the capped group

    .venv/bin/python tools/bench_index.py --shards /tmp/ix400k/shards --rounds 3
    .venv/bin/python tools/bench_index.py --capped --dataset-size 220M --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import resource
import sys
import time

import bench_dataset
from benchlib import capped, old_indexes
from benchlib.caches import drop_caches
from benchlib.cli import shardfs
from benchlib.tables import median

from shardfs.storage.memory import parse_size

READ = 4 << 20


def sequential(paths: list[str]) -> float:
    drop_caches(1)
    started = time.monotonic()
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.read(READ):
                pass
    return time.monotonic() - started


def timed_index(shards_dir: str, workers: int) -> tuple[float, float]:
    """(seconds, CPU seconds of the command)."""
    drop_caches(1)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    shardfs("index", "--workers", workers, shards_dir, check=True)
    seconds = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def rounds(shards_dir: str, args) -> list[dict]:
    paths = sorted(glob.glob(os.path.join(shards_dir, "*.tar")))
    if not paths:
        sys.exit(f"no .tar shard in {shards_dir}")
    size = sum(os.path.getsize(p) for p in paths)
    print(f"{len(paths)} shards, {size / 1e6:.0f} MB in {shards_dir}; {args.workers} workers")
    got = []
    aside = os.path.join(os.path.dirname(os.path.abspath(shards_dir)), ".bench-index-old-indexes")
    for i in range(args.rounds):
        old_indexes.set_aside(aside, shards_dir)
        seq = sequential(paths)
        build, cpu = timed_index(shards_dir, args.workers)
        load, _ = timed_index(shards_dir, args.workers)
        row = {"sequential_s": seq, "build_s": build, "load_s": load, "build_cpu_s": cpu,
               "ratio": (build - load) / seq, "loadavg": os.getloadavg()[0]}
        got.append(row)
        print(f"round {i + 1}: sequential {seq:.2f} s, build {build:.2f} s (CPU {cpu:.2f} s), load {load:.2f} s: "
              f"(build - load) / sequential = {row['ratio']:.2f}; load average {row['loadavg']:.2f}", flush=True)
    old_indexes.clear(aside)
    return got


def summary(got: list[dict]) -> None:
    for key in ("sequential_s", "build_s", "load_s", "build_cpu_s", "ratio", "loadavg"):
        values = [r[key] for r in got]
        print(f"{key:>13}: {median(values):.2f} [{min(values):.2f}-{max(values):.2f}]")
    print(f"target: (build - load) / sequential at most 1.2: {'PASS' if median([r['ratio'] for r in got]) <= 1.2 else 'FAIL'}"
          f" (median of {len(got)} rounds)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--shards", help="a folder of tar shards (indexes are written and removed beside them)")
    where.add_argument("--capped", action="store_true", help="tools/bench_tier.py's capped shared storage")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--workdir", default="/var/tmp/shardfs-bench-tier", help="--capped: as bench_tier.py's")
    parser.add_argument("--dataset-size", type=parse_size, default=parse_size("220M"))
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--side", default="auto")
    parser.add_argument("--shard-size", type=parse_size, default=None, help="default: as bench_tier.py")
    parser.add_argument("--cache-size", type=parse_size, default=parse_size("400M"), help="(bench_tier's shard size rule)")
    parser.add_argument("--iops", type=int, default=200)
    parser.add_argument("--bps", type=parse_size, default=150_000_000)
    parser.add_argument("--rebuild", action="store_true", help="--capped: remake the dataset")
    args = parser.parse_args()
    if args.shards:
        summary(rounds(args.shards, args))
        return 0
    work = capped.begin(parser, args)
    if args.shard_size is None:
        args.shard_size = min(args.cache_size // 4, 256 << 20)
    with contextlib.ExitStack() as stack:
        shared, dev, _marker = bench_dataset.on_capped_storage(args, work, stack)
        cap = capped.ReadCap(dev, args.iops, args.bps, name="index")
        stack.callback(cap.close)
        print(f"capped at {args.iops} IOPS, {args.bps / 1e6:.0f} MB/s")
        summary(rounds(os.path.join(shared, "shards"), args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
