#!/usr/bin/env python3
"""What a full ImageFolder listing costs, and where (a by-hand benchmark, not a test).

Lists the same tree, the way torchvision's ImageFolder does (benchlib.readers.imagefolder_files),
through a plain directory and through shardfs mounts of its tar shards, fresh (the kernel's
dentries and inodes dropped: drop_caches 3; a shardfs mount new as well) and then warm, in
--rounds rounds. For each shardfs listing it records the daemon's CPU seconds (/proc/PID/stat) and
the listing requests it answered (its stats), and how much the kernel's FUSE inodes and dentries
grew (/proc/slabinfo), so that the wall time splits into what the daemon spends and what the kernel
does per entry. shardfs is mounted twice per round: as it serves
(READDIRPLUS: each entry carries its attributes and the kernel makes an inode for it) and with
SHARDFS_READDIRPLUS=0 (plain READDIR: no inode per entry; a file opened later costs a LOOKUP).

Uses bench_scale's dataset (the tar shards with their indexes, and its plain tree)::

    .venv/bin/python tools/bench_listing.py --files 4000000 --shards 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from benchlib import machine
from benchlib.caches import drop_caches
from benchlib.mounts import Mounts
from benchlib.readers import imagefolder_files
from benchlib.tables import cell, median

CLK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK  # utime + stime


def slab_mb() -> dict[str, float]:
    """The kernel's memory in FUSE inodes and dentries (/proc/slabinfo, root only), MB."""
    out = {}
    try:
        with open("/proc/slabinfo") as f:
            for line in f:
                name, active, _total, size = (line.split() + ["0"] * 4)[:4]
                if name in ("fuse_inode", "dentry"):
                    out[name] = int(active) * int(size) / 1e6
    except (OSError, ValueError):
        pass
    return out


def listing(root: str) -> tuple[float, int]:
    t = time.perf_counter()
    n = len(imagefolder_files(root))
    return time.perf_counter() - t, n


def shardfs_round(mounts: Mounts, args, plus: bool) -> dict:
    os.environ["SHARDFS_READDIRPLUS"] = "1" if plus else "0"
    m = mounts.shardfs([args.shards_dir], args.mnt, "--index-dir", args.index_dir, log=args.log)
    try:
        out = {}
        for kind in ("fresh", "warm"):
            if kind == "fresh":
                drop_caches()
            before_ops, before_cpu, before_slab = m.stats()["fuse_ops"], cpu_s(m.pid), slab_mb()
            secs, n = listing(os.path.join(args.mnt, "train"))
            ops, cpu, slab = m.stats()["fuse_ops"], cpu_s(m.pid), slab_mb()
            out[kind] = {"seconds": secs, "files": n, "daemon_cpu_s": cpu - before_cpu,
                         "requests": {k: v - before_ops.get(k, 0) for k, v in ops.items() if v != before_ops.get(k, 0)},
                         "kernel_slab_mb": {k: round(v - before_slab.get(k, 0)) for k, v in slab.items()}}
        return out
    finally:
        mounts.unmount(m)
        os.environ.pop("SHARDFS_READDIRPLUS", None)


def plain_round(args) -> dict:
    out = {}
    for kind in ("fresh", "warm"):
        if kind == "fresh":
            drop_caches()
        secs, n = listing(os.path.join(args.plain_dir, "train"))
        out[kind] = {"seconds": secs, "files": n}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=4_000_000)
    p.add_argument("--shards", type=int, default=2000)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--workdir", default="/tmp/shardfs-bench-scale", help="bench_scale's --workdir")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    name = f"f{args.files}-s{args.shards}-c{args.classes}"
    args.shards_dir = os.path.join(args.workdir, name, "shards")
    args.plain_dir = os.path.join(args.workdir, name, "plain")
    args.index_dir = os.path.join(args.workdir, "index-dir", name)
    args.mnt = os.path.join(args.workdir, "mnt", "shardfs-listing")
    args.log = os.path.join(args.workdir, "logs", "listing.log")
    for d in (args.mnt, os.path.dirname(args.log)):
        os.makedirs(d, exist_ok=True)
    print(f"machine: {machine.describe(machine.facts(args.workdir))}\nload before: {open('/proc/loadavg').read().strip()}")
    rounds = {"plain": [], "shardfs": [], "shardfs READDIR": []}
    with Mounts() as mounts:
        for r in range(args.rounds):
            rounds["plain"].append(plain_round(args))
            rounds["shardfs"].append(shardfs_round(mounts, args, plus=True))
            rounds["shardfs READDIR"].append(shardfs_round(mounts, args, plus=False))
            for meth, rs in rounds.items():
                print(f"round {r + 1} {meth}: " + ", ".join(
                    f"{k} {v['seconds']:.2f} s ({v['files']:,} files"
                    + (f", daemon CPU {v['daemon_cpu_s']:.2f} s, requests {v['requests']}, kernel slab grew by "
                       f"{v['kernel_slab_mb']} MB" if "requests" in v else "")
                    + ")" for k, v in rs[-1].items()), flush=True)
    print(f"load after: {open('/proc/loadavg').read().strip()}\n")
    print(f"| listing of {args.files:,} files, {args.rounds} rounds | fresh s | warm s | fresh / plain | "
          "warm / plain | daemon CPU s fresh |\n|---|---:|---:|---:|---:|---:|")
    base = {k: median(r[k]["seconds"] for r in rounds["plain"]) for k in ("fresh", "warm")}
    for meth, rs in rounds.items():
        f, w = [r["fresh"]["seconds"] for r in rs], [r["warm"]["seconds"] for r in rs]
        cpu = [r["fresh"].get("daemon_cpu_s") for r in rs]
        print(f"| {meth} | {cell(f, '{:.2f}')} | {cell(w, '{:.2f}')} | {median(f) / base['fresh']:.2f}x | "
              f"{median(w) / base['warm']:.2f}x | {cell(cpu, '{:.2f}') if cpu[0] is not None else '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
