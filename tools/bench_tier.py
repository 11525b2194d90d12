#!/usr/bin/env python3
"""By-hand benchmark of issue 12's disk tier (NOT a test): datasets larger than the RAM budget, on
shared storage slower than the node's own disk.

"Shared storage" is an ext4 image on a loop device (losetup --direct-io, mounted under --workdir)
holding the tar shards and a plain directory of the same JPEGs. Its reads are capped by a cgroup v1
blkio group (--iops, --bps: like an HDD-backed store). Once the dataset is made, this process joins
the group, so everything that reads (the reader processes, cp, dd, `shardfs mount` and the daemon
it starts) is capped. The disk tier and the copy "staged by hand" live on the machine's own disk,
uncapped. A dataset of real JPEGs (~110 KB, ImageNet's mean) is made once and reused (marker.json).

The indexes are built first, uncapped (not measured); with --unindexed they are removed again before
each round's first shardfs mount, which then builds them on the capped storage (issue 31's one pass
that indexes and fills: the mount's index build fills the disk tier, and its reads count in the
shared storage over the mount and the epochs; also reported: the first mount over the sequential
bound's time). One round, every pass after sync +
drop_caches, reading as training code does (ImageFolder's listing, then every file once in a random
order by --readers processes with the built-in open(path, 'rb').read(), benchlib.readers); epoch e
uses the same order for every method:

  sequential bound  every shard read once front to back in 4 MiB reads, the faster of O_DIRECT
                    (into huge pages: O_DIRECT into 4 KiB pages, as `dd iflag=direct` does, makes
                    requests of 512 KiB at most here, which an IOPS cap holds back) and reads
                    through the page cache (kernel readahead); in this process, so that 130 shards
                    do not also time 130 process starts: bytes/s / (shard bytes per file) = files/s
  plain capped      the plain directory on shared storage, --epochs epochs
  staged            cp -r of that directory to local disk (timed), then --epochs epochs there
  shardfs           one mount (--cache-size, --disk-cache on local disk when this shardfs has it),
                    --epochs epochs; then a SECOND mount (new daemon, same disk cache) for one epoch

Bytes from shared storage are the loop device's sectors read (/sys/block/loopN/stat: nobody else
reads this device; the daemon's /proc/PID/io would also count the disk tier's local reads); the
requests (and so their mean size) are the cgroup's (blkio.throttle.io_serviced, what the IOPS cap
counts). Figures are medians [min-max] over --rounds; every ratio is taken within one round.

--sweep measures only the first epoch, for every shape: the JPEGs packed into --sweep-shards
shard counts (kept on the image, made once) times RAM budgets of 1/N of the data (--sweep-budgets),
each cell a fresh mount with an empty disk tier, against that shard set's sequential bound in the
same round; it prints the ratio for each cell.

Run as root (loop devices, cgroups and drop_caches need it):

    .venv/bin/python tools/bench_tier.py --dataset-size 600M --cache-size 150M   # smoke, ~10 min
    .venv/bin/python tools/bench_tier.py                                         # 2G dataset, 400M budget
    .venv/bin/python tools/bench_tier.py --dataset-size 220M --sweep --rounds 3  # shapes: 8-128 shards, budgets 1/8-1/2
    .venv/bin/python tools/bench_tier.py --dataset-size 300M --cache-size 75M --unindexed  # first mount builds, ~8 min
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import sys
import threading
import time

import bench_dataset
from benchlib import capped
from benchlib.caches import drop_caches
from benchlib.capped import ReadCap, device_read_bytes, run, shard_files, write
from benchlib.cli import shardfs
from benchlib.machine import Others, proc_status
from benchlib.mounts import Mounts
from benchlib.readers import read_all, timed_listing
from benchlib.rounds import until_interrupted
from benchlib.tables import cell, median

from shardfs.index import store
from shardfs.storage import buffers
from shardfs.storage.memory import parse_size


# ---------------------------------------------------------------------------------------------
# the dataset (bench_dataset.on_capped_storage): JPEGs and tar shards on the shared storage


def remove_indexes(shards: list[str]) -> None:
    """The shards' indexes, wherever a mount would find them (beside them, the index cache)."""
    for shard in shards:
        for path in store.candidate_paths(shard):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def index_bytes(shared: str) -> int:
    top = os.path.join(shared, "shards")
    return sum(os.path.getsize(os.path.join(top, n)) for n in os.listdir(top) if n.endswith(".shardfs-idx"))


# ---------------------------------------------------------------------------------------------
# reading as training code reads


def epoch(root: str, readers: int, seed: int | None, expect: int, daemon: int | None = None,
          reading=lambda: None, done=None) -> dict:
    """drop_caches, ImageFolder's listing, every file once with open().read(), in a random order
    (``seed``) or ImageFolder's (None); the `daemon` pid's CPU seconds and the share of the CPU
    that processes not ours took (noise). ``reading()`` is called as the reads begin."""
    drop_caches()
    others, cpu0 = Others(daemon), proc_status(daemon).get("cpu_s", 0.0) if daemon else None
    paths, list_s = timed_listing(root)
    reading()
    got = read_all(paths, readers, "open", seed, done=done)
    if got["files"] != expect or got["errors"]:
        raise RuntimeError(f"{root}: read {got['files']} of {expect} files, {got['errors']} errors "
                           f"({got['first_error']})")
    return {"list_s": list_s, "fps": got["files_per_s"], "others_cpu": others.done()["background_cpu"],
            "daemon_cpu_s": proc_status(daemon).get("cpu_s", 0.0) - cpu0 if daemon else None}


def sequential_bound(shards: list[str], files: int, cap: ReadCap) -> dict:
    """Every shard read once, front to back, in large requests, O_DIRECT and through the page
    cache (readahead): the faster is the storage's best case, in files/s; with the requests the
    cap counted for it."""
    nbytes = sum(os.path.getsize(s) for s in shards)
    ways, buf = {}, buffers.anonymous(4 << 20)
    for name, flags in (("direct", os.O_DIRECT), ("buffered", 0)):
        drop_caches()
        req0, t0 = cap.reads()[0], time.perf_counter()
        for s in shards:
            fd = os.open(s, os.O_RDONLY | flags)
            try:
                while os.readv(fd, [buf]) > 0:
                    pass
            finally:
                os.close(fd)
        secs = time.perf_counter() - t0
        ways[name] = {"mbps": nbytes / secs / 1e6, "secs": secs, "requests": cap.reads()[0] - req0}
    buf.close()
    best = max(ways.values(), key=lambda w: w["mbps"])
    return {**best, "fps": files / best["secs"],  # = bytes/s / shard bytes per file
            "direct_mbps": ways["direct"]["mbps"], "buffered_mbps": ways["buffered"]["mbps"]}


# ---------------------------------------------------------------------------------------------
# shardfs mounts


def mount_shardfs(ctx, name: str):
    """`shardfs mount` of the shards (ctx.mount_options); its RSS once mounted (interpreter + index)."""
    m = ctx.mounts.shardfs([os.path.join(ctx.shared, "shards")], os.path.join(ctx.work, "mnt", name),
                           *ctx.mount_options, log=os.path.join(ctx.work, f"{name}.log"))
    m.rss_at_mount = proc_status(m.pid).get("VmRSS")
    return m


def tier_figures(stats: dict) -> dict:
    """Whatever the daemon reports about its disk tier (names not fixed yet: keys naming it)."""
    return {k: v for k, v in stats.items() if "disk" in k or "tier" in k}


# ---------------------------------------------------------------------------------------------
# one round


def one_round(ctx, r: int) -> dict:
    a, out = ctx.args, {}
    files, train = ctx.marker["files"], os.path.join(ctx.shared, "src", "train")
    seeds = [1000 * r + e if a.order == "random" else None for e in range(a.epochs)]
    out["seq"] = sequential_bound(ctx.shards, files, ctx.cap)
    print(f"  sequential bound {out['seq']['mbps']:.0f} MB/s = {out['seq']['fps']:.0f} files/s (O_DIRECT "
          f"{out['seq']['direct_mbps']:.0f}, readahead {out['seq']['buffered_mbps']:.0f} MB/s)", flush=True)

    dev0 = device_read_bytes(ctx.dev)
    out["plain"] = [epoch(train, a.readers, s, files) for s in seeds]
    out["plain_storage"] = device_read_bytes(ctx.dev) - dev0
    print("  plain capped " + ", ".join(f"{e['fps']:.0f}" for e in out["plain"]) + " files/s", flush=True)

    staged = os.path.join(ctx.work, "staged")
    shutil.rmtree(staged, ignore_errors=True)
    drop_caches()
    t0 = time.perf_counter()
    run(["cp", "-r", train, staged])  # as users stage by hand
    out["stage_s"] = time.perf_counter() - t0
    out["staged"] = [epoch(staged, a.readers, s, files) for s in seeds]
    print(f"  staged: copy {out['stage_s']:.0f} s, " + ", ".join(f"{e['fps']:.0f}" for e in out["staged"])
          + " files/s", flush=True)

    shutil.rmtree(ctx.disk_cache, ignore_errors=True)  # epoch 1 starts with an empty tier
    if a.unindexed:
        remove_indexes(ctx.shards)  # the mount builds them on the capped storage
    drop_caches()
    dev0, t0 = device_read_bytes(ctx.dev), time.perf_counter()
    m = mount_shardfs(ctx, "shardfs")
    out["mount_s"] = time.perf_counter() - t0
    out["in_cgroup"] = ctx.cap.holds(m.pid)
    out["shardfs"], out["shardfs_storage"] = [], []
    for s in seeds:
        before, req0 = device_read_bytes(ctx.dev), ctx.cap.reads()[0]
        done = mp.Value("l", 0)
        watch = StoragePass(ctx.cap, ctx.shard_bytes, done) if not out["shardfs"] else None
        out["shardfs"].append(epoch(os.path.join(m.mnt, "train"), a.readers, s, files, m.pid,
                                    reading=watch.start if watch else lambda: None, done=done))
        if watch:
            out["storage_pass_s"] = watch.done()
            out["read_by_then"] = watch.files_then / files if watch.files_then is not None else None
        out["shardfs_storage"].append(device_read_bytes(ctx.dev) - before)
        out["shardfs"][-1]["requests"] = ctx.cap.reads()[0] - req0
    out["storage_total"] = device_read_bytes(ctx.dev) - dev0  # the mount's index loads included
    out["rss_at_mount"], out["rss_peak"] = m.rss_at_mount, proc_status(m.pid).get("VmHWM")
    out["stats"] = m.stats() or {}
    ctx.mounts.unmount(m)
    print("  shardfs " + ", ".join(f"{e['fps']:.0f}" for e in out["shardfs"]) + " files/s, storage "
          + ", ".join(f"{b / 1e6:.0f}" for b in out["shardfs_storage"]) + " MB", flush=True)

    drop_caches()
    dev0 = device_read_bytes(ctx.dev)
    m2 = mount_shardfs(ctx, "shardfs-again")
    out["second"] = epoch(os.path.join(m2.mnt, "train"), a.readers, seeds[0], files, m2.pid)
    out["second_storage"] = device_read_bytes(ctx.dev) - dev0
    out["second_stats"] = m2.stats() or {}
    ctx.mounts.unmount(m2)
    print(f"  second mount {out['second']['fps']:.0f} files/s, storage {out['second_storage'] / 1e6:.0f} MB",
          flush=True)
    shutil.rmtree(staged, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------------------------
# --sweep: the first epoch for every shape (shard count x RAM budget)


def sweep_sets(ctx) -> dict[int, str]:
    """The JPEGs packed into each --sweep-shards count (shard size = data / count), made once on the
    shared storage and indexed uncapped: {count asked: shard directory}."""
    src, sets = os.path.join(ctx.shared, "src"), {}
    for n in ctx.args.sweep_shards:
        out = os.path.join(ctx.shared, "sweep", str(n))
        if not os.path.exists(os.path.join(out, ".complete")):
            shutil.rmtree(out, ignore_errors=True)
            size = -(-ctx.marker["image_bytes"] * 103 // 100 // n)  # + tar headers and padding
            shardfs("pack", src, out, "--format", "tar", "--shuffle", "--shard-size", f"{size >> 10}K",
                    "--prefix", "train", "--workers", str(os.cpu_count() or 1), check=True, timeout=3600)
            ctx.mounts.unmount(ctx.mounts.shardfs([out], os.path.join(ctx.work, "mnt", "sweep-index"),
                                                  log=os.path.join(ctx.work, "sweep-index.log")))
            write(os.path.join(out, ".complete"), "")
        sets[n] = out
    return sets


class StoragePass:
    """When the storage has served ``nbytes`` since now (a thread watching the cap's byte count):
    how long the epoch kept the storage busy, whatever the readers then still had to read, and
    how many files they had read by then (``done``, the readers' shared count)."""

    def __init__(self, cap: ReadCap, nbytes: int, done):
        self.cap, self.goal, self.secs = cap, cap.reads()[1] + nbytes, None
        self.done_count, self.files_then = done, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.01):
            if self.cap.reads()[1] >= self.goal:
                self.secs = time.perf_counter() - self.t0
                self.files_then = self.done_count.value
                return

    def done(self) -> float | None:
        self._stop.set()
        self._thread.join()
        return self.secs


def sweep_cell(ctx, shards_dir: str, data: int, budget_div: int, seed: int | None) -> dict:
    """A fresh mount (empty disk tier, RAM budget data / budget_div) and its first epoch; also
    how long the storage took to serve the shards within it."""
    a, files = ctx.args, ctx.marker["files"]
    shutil.rmtree(ctx.disk_cache, ignore_errors=True)
    drop_caches()
    m = ctx.mounts.shardfs([shards_dir], os.path.join(ctx.work, "mnt", "sweep"),
                           "--cache-size", f"{data // budget_div >> 10}K", "--disk-cache", ctx.disk_cache,
                           "--disk-cache-size", f"{2 * data >> 20}M", log=os.path.join(ctx.work, "sweep.log"))
    try:
        dev0, (req0, _) = device_read_bytes(ctx.dev), ctx.cap.reads()
        done = mp.Value("l", 0)
        watch = StoragePass(ctx.cap, data, done)
        got = epoch(os.path.join(m.mnt, "train"), a.readers, seed, files, m.pid, reading=watch.start, done=done)
        got["storage_s"] = watch.done()
        got["read_by_then"] = watch.files_then / files if watch.files_then is not None else None
        got["storage"], got["requests"] = device_read_bytes(ctx.dev) - dev0, ctx.cap.reads()[0] - req0
    finally:
        ctx.mounts.unmount(m)
    return got


def sweep_round(ctx, sets: dict[int, str], r: int) -> dict:
    a, cells = ctx.args, {}
    for n, where in sets.items():
        shards = sorted(os.path.join(where, f) for f in os.listdir(where) if f.endswith(".tar"))
        data = sum(os.path.getsize(s) for s in shards)
        seq = sequential_bound(shards, ctx.marker["files"], ctx.cap)
        for div in a.sweep_budgets:
            got = sweep_cell(ctx, where, data, div, 1000 * r if a.order == "random" else None)
            cells[n, div] = {"ratio": got["fps"] / seq["fps"], "storage": got["storage"] / data,
                             "pass_ratio": seq["secs"] / got["storage_s"] if got["storage_s"] else None,
                             "read_by_then": got["read_by_then"],
                             "requests": got["requests"], "fps": got["fps"], "seq_fps": seq["fps"],
                             "shards": len(shards), "data": data, "others_cpu": got["others_cpu"]}
            print(f"  {len(shards)} shards of {data / len(shards) / 1e6:.1f} MB, budget 1/{div}: "
                  f"{got['fps']:.0f} files/s = {cells[n, div]['ratio']:.2f}x the bound "
                  f"({seq['fps']:.0f} files/s); the storage's pass {got['storage_s'] or 0:.2f} s = "
                  f"{cells[n, div]['pass_ratio'] or 0:.2f}x the bound, {cells[n, div]['storage']:.3f}x "
                  f"the shards in {got['requests']} requests; files read by then "
                  f"{got['read_by_then'] or 0:.2f}", flush=True)
    return cells


def sweep_report(ctx, rounds: list[dict]) -> None:
    a = ctx.args
    print()
    print(f"first epoch / sequential bound of the same shards (median [min-max] of {len(rounds)} rounds); "
          f"{ctx.marker['files']} JPEGs, {a.readers} readers, {a.order} order, empty disk tier, "
          f"RAM budget a share of the data")
    keys = sorted(rounds[0])
    divs = sorted({d for _, d in keys}, reverse=True)
    worst = {}
    for what, key in (("epoch 1, x the bound", "ratio"),
                      ("the storage's pass (shards served, readers not done), x the bound", "pass_ratio"),
                      ("files the readers had read when the storage's pass ended, share", "read_by_then")):
        print(what)
        print(f"{'shards':<28}" + "".join(f"{'budget 1/' + str(d):>22}" for d in divs))
        ratios = []
        for n in sorted({n for n, _ in keys}):
            first = rounds[0][n, divs[0]]
            label = f"{first['shards']} x {first['data'] / first['shards'] / 1e6:.1f} MB"
            row = []
            for d in divs:
                values = [r[n, d][key] for r in rounds if (n, d) in r]
                ratios.append(median(values))
                row.append(spread(values, "{:.2f}"))
            print(f"{label:<28}" + "".join(f"{c:>22}" for c in row))
        worst[key] = min((r for r in ratios if r is not None), default=0.0)
    worst_storage = max(c["storage"] for r in rounds for c in r.values())
    busy = [c["others_cpu"] for r in rounds for c in r.values() if c["others_cpu"] is not None]
    print(f"shared storage read, x the shards: at most {worst_storage:.3f}; others' CPU share during the "
          f"epochs {spread([100 * b for b in busy])} %")
    print(f"{'target':<58}{'worst cell':>22}  result")
    for name, key in (("epoch 1 >= 0.8x sequential bound, every cell", "ratio"),
                      ("the storage's pass >= 0.8x the bound, every cell", "pass_ratio")):
        print(f"{name:<58}{worst[key]:>22.2f}  {'PASS' if worst[key] >= 0.8 else 'FAIL'}")


# ---------------------------------------------------------------------------------------------
# report


def spread(values, fmt: str = "{:.0f}") -> str:
    return cell(list(values), fmt)


def report(ctx, rounds: list[dict]) -> None:
    a, shard_bytes = ctx.args, ctx.shard_bytes
    label = "shardfs+tier" if ctx.has_tier else "shardfs (RAM only)"
    print()
    print(f"files/s per epoch (median [min-max] of {len(rounds)} rounds), every epoch after drop_caches; "
          f"{a.readers} readers, open().read() in {a.order} order")
    cols = [label, "plain capped", "plain staged", "sequential bound"]
    print(f"{'epoch':<22}" + "".join(f"{c:>22}" for c in cols))
    for e in range(a.epochs):
        cells = [spread(r[k][e]["fps"] for r in rounds) for k in ("shardfs", "plain", "staged")]
        cells.append(spread(r["seq"]["fps"] for r in rounds))
        print(f"{e + 1:<22}" + "".join(f"{c:>22}" for c in cells))
    print(f"{'2nd mount, epoch 1':<22}{spread(r['second']['fps'] for r in rounds):>22}")
    print(f"{'listing s, epoch 1':<22}" + "".join(f"{spread((r[k][0]['list_s'] for r in rounds), '{:.2f}'):>22}"
                                                 for k in ("shardfs", "plain", "staged")))
    print()
    x = lambda b: b / shard_bytes  # noqa: E731
    rows = [
        ("shared storage read, x shards", ""),
        (f"  {label}, epoch 1..{a.epochs}",
         " / ".join(spread((x(r["shardfs_storage"][e]) for r in rounds), "{:.3f}") for e in range(a.epochs))),
        (f"  shardfs mount{' (index build)' if a.unindexed else ''} + all epochs",
         spread((x(r["storage_total"]) for r in rounds), "{:.3f}")),
        ("  2nd mount (same disk cache)", spread((x(r["second_storage"]) for r in rounds), "{:.3f}")),
        (f"  plain capped, {a.epochs} epochs", spread((x(r["plain_storage"]) for r in rounds), "{:.3f}")),
        (f"daemon CPU s, epoch 1..{a.epochs}",
         " / ".join(spread((r["shardfs"][e]["daemon_cpu_s"] for r in rounds), "{:.1f}") for e in range(a.epochs))),
        ("others' CPU share %, max over epochs", "  ".join(
            f"{k} {spread((100 * max((e['others_cpu'] or 0) for e in r[k]) for r in rounds))}"
            for k in ("shardfs", "plain", "staged"))),
        ("epoch 1: files read when the storage was done",
         spread((r["read_by_then"] for r in rounds if r.get("read_by_then") is not None), "{:.2f}")),
        ("storage requests, epoch 1 / sequential bound", "{} / {}".format(
            spread(r["shardfs"][0]["requests"] for r in rounds), spread(r["seq"]["requests"] for r in rounds))),
        ("  mean request KiB, epoch 1 / bound", "{} / {}".format(
            spread((r["shardfs_storage"][0] / r["shardfs"][0]["requests"] / 1024 for r in rounds
                    if r["shardfs"][0]["requests"])),  # (none where the mount's index build filled the tier)
            spread((shard_bytes / r["seq"]["requests"] / 1024 for r in rounds)))),
        ("staged by hand: cp -r s", spread((r["stage_s"] for r in rounds), "{:.1f}")),
        ("sequential bound MB/s (O_DIRECT / readahead)", "{} ({} / {})".format(
            spread(r["seq"]["mbps"] for r in rounds), spread(r["seq"]["direct_mbps"] for r in rounds),
            spread(r["seq"]["buffered_mbps"] for r in rounds))),
        (f"shardfs mount s ({'indexes built' if a.unindexed else 'index exists'})",
         spread((r["mount_s"] for r in rounds), "{:.2f}")),
        ("  x the sequential bound's time", spread((r["mount_s"] / r["seq"]["secs"] for r in rounds), "{:.2f}")),
        ("daemon RSS at mount MB", spread((r["rss_at_mount"] / 1e6 for r in rounds), "{:.0f}")),
        ("daemon peak RSS MB (VmHWM)", spread((r["rss_peak"] / 1e6 for r in rounds), "{:.0f}")),
    ]
    for name, value in rows:
        print(f"{name:<46}{value}")
    print(f"RAM budget {a.cache_size >> 20} MiB; indexes on disk {ctx.index_bytes / 1e6:.1f} MB; shards "
          f"{shard_bytes / 1e9:.3f} GB in {len(ctx.shards)} files; daemon in the capped cgroup: "
          f"{all(r['in_cgroup'] for r in rounds)}")
    last = rounds[-1]
    print("daemon figures (last round, before unmount): cache " + json.dumps(last["stats"].get("cache", {}))
          + "; tier " + json.dumps(tier_figures(last["stats"])))
    print("second mount: tier " + json.dumps(tier_figures(last["second_stats"])))

    def ratios(fn):
        return [fn(r) for r in rounds]

    e1 = lambda r: r["shardfs"][0]["fps"]  # noqa: E731
    targets = [
        ("epoch 1 >= 0.8x sequential bound", ratios(lambda r: e1(r) / r["seq"]["fps"]), ">=", 0.8),
        ("epoch 1's storage pass >= 0.8x sequential bound",
         ratios(lambda r: r["seq"]["secs"] / r["storage_pass_s"] if r["storage_pass_s"] else 0), ">=", 0.8),
        ("epoch 1 >= 4x plain capped", ratios(lambda r: e1(r) / r["plain"][0]["fps"]), ">=", 4.0),
        *[(f"epoch {e + 1} >= 0.7x plain staged", ratios(lambda r, e=e: r["shardfs"][e]["fps"] / r["staged"][e]["fps"]),
           ">=", 0.7) for e in range(1, a.epochs)],
        (f"shared storage over {'the first mount and ' if a.unindexed else ''}{a.epochs} epochs <= 1.05x shards",
         ratios(lambda r: x(r["storage_total"])), "<=", 1.05),
        ("2nd mount shared storage <= 0.05x shards", ratios(lambda r: x(r["second_storage"])), "<=", 0.05),
        (f"peak RSS <= budget + RSS at mount + {a.rss_slack >> 20} MB, x that",
         ratios(lambda r: r["rss_peak"] / (a.cache_size + r["rss_at_mount"] + a.rss_slack)), "<=", 1.0),
    ]
    if all(r["storage_pass_s"] is None and not r["shardfs_storage"][0] for r in rounds):
        # (the mount's index build filled the tier: epoch 1 made no pass over storage to time)
        targets = [t for t in targets if not t[0].startswith("epoch 1's storage pass")]
    print()
    print(f"{'target (' + label + ')':<58}{'ratio':>22}  result")
    print("-" * 90)
    for name, values, rule, limit in targets:
        med = median(values)
        ok = med >= limit if rule == ">=" else med <= limit
        print(f"{name:<58}{spread(values, '{:.2f}'):>22}  {'PASS' if ok else 'FAIL'}")
    if not ctx.has_tier:
        print("note: this shardfs has no --disk-cache: the shardfs column is the RAM tier alone")


# ---------------------------------------------------------------------------------------------


class Ctx:
    pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="/var/tmp/shardfs-bench-tier",
                        help="on the local disk: the image, staged copy, disk cache, mountpoints, logs")
    parser.add_argument("--dataset-size", type=parse_size, default=parse_size("2G"), help="JPEG bytes to make")
    parser.add_argument("--cache-size", type=parse_size, default=parse_size("400M"), help="shardfs RAM budget")
    parser.add_argument("--disk-cache-size", default=None, help="shardfs --disk-cache-size (default: 2x the shards)")
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--jpegs-from", help="copy the JPEGs of another run's dataset (e.g. tools/bench.py's "
                        "/tmp/shardfs-bench/src, made with the same classes and count) instead of making them")
    parser.add_argument("--side", default="auto", help="JPEG side in pixels (auto: ~110 KB per JPEG)")
    parser.add_argument("--shard-size", type=parse_size, default=None, help="default: RAM budget / 4, at most 256M")
    parser.add_argument("--iops", type=int, default=200, help="read IOPS cap of the shared storage")
    parser.add_argument("--bps", type=parse_size, default=150_000_000, help="read bytes/s cap (150M = 150 MiB/s)")
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--order", choices=("random", "imagefolder"), default="random",
                        help="the order files are read in: a shuffle, or ImageFolder's (class by class)")
    parser.add_argument("--sweep", action="store_true",
                        help="first epochs only, for every shard count x RAM budget (see above)")
    parser.add_argument("--sweep-shards", type=lambda t: [int(x) for x in t.split(",")], default=[8, 32, 128],
                        help="shard counts of the sweep (default 8,32,128)")
    parser.add_argument("--sweep-budgets", type=lambda t: [int(x) for x in t.split(",")], default=[8, 4, 2],
                        help="RAM budgets of the sweep, as 1/N of the data (default 8,4,2)")
    parser.add_argument("--unindexed", action="store_true",
                        help="each round's first shardfs mount builds the indexes (on the capped storage)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--rss-slack", type=parse_size, default=parse_size("64M"),
                        help="daemon memory allowed above the budget and its RSS at mount")
    parser.add_argument("--rebuild", action="store_true", help="remake the dataset even if marker.json matches")
    parser.add_argument("--json", help="also write every round's figures here")
    args = parser.parse_args()
    args.shard_size = args.shard_size or min(256 << 20, args.cache_size // 4)
    if args.dataset_size < 4 * args.cache_size and not args.sweep:
        print(f"WARNING: the dataset is under 4x the RAM budget ({args.dataset_size >> 20}M, "
              f"{args.cache_size >> 20}M)")
    ctx = Ctx()
    ctx.args, ctx.work = args, capped.begin(parser, args)
    with contextlib.ExitStack() as stack:
        ctx.shared, ctx.dev, ctx.marker = bench_dataset.on_capped_storage(args, ctx.work, stack)
        ctx.shards = shard_files(ctx.shared)
        ctx.shard_bytes = sum(os.path.getsize(s) for s in ctx.shards)
        ctx.disk_cache = os.path.join(ctx.work, "disk-cache")
        stack.callback(shutil.rmtree, ctx.disk_cache, True)
        stack.callback(shutil.rmtree, os.path.join(ctx.work, "staged"), True)
        ctx.has_tier = "--disk-cache" in shardfs("mount", "--help").stdout
        ctx.mount_options = ["--cache-size", f"{args.cache_size >> 20}M"]
        if ctx.has_tier:
            ctx.mount_options += ["--disk-cache", ctx.disk_cache,
                                  "--disk-cache-size", args.disk_cache_size or f"{2 * ctx.shard_bytes >> 20}M"]
        m = ctx.marker
        print(f"dataset: {m['files']} JPEGs, {m['image_bytes'] / 1e9:.3f} GB, "
              f"mean {m['image_bytes'] / m['files'] / 1e3:.1f} KB; {len(ctx.shards)} tar shards "
              f"{ctx.shard_bytes / 1e9:.3f} GB; shared storage {ctx.dev} capped at "
              f"{args.iops} IOPS, {args.bps / 1e6:.0f} MB/s; shardfs mount {' '.join(ctx.mount_options)}"
              + ("" if ctx.has_tier else " (this shardfs has no --disk-cache: RAM tier only)"), flush=True)
        ctx.cap = None
        stack.callback(lambda: ctx.cap and ctx.cap.close())
        ctx.mounts = stack.enter_context(Mounts())  # FUSE mounts undone first, then the cgroup, then the image
        t0 = time.perf_counter()
        ctx.mounts.unmount(mount_shardfs(ctx, "index"))  # builds missing indexes, uncapped: not measured
        ctx.index_bytes = index_bytes(ctx.shared)
        print(f"indexes ready ({time.perf_counter() - t0:.1f} s, {ctx.index_bytes / 1e6:.1f} MB)", flush=True)

        sets = sweep_sets(ctx) if args.sweep else None  # packed and indexed uncapped: not measured
        ctx.cap = ReadCap(ctx.dev, args.iops, args.bps, "bench-tier")
        if args.sweep:
            rounds = until_interrupted(args.rounds, lambda r: sweep_round(ctx, sets, r))
            if rounds:
                sweep_report(ctx, rounds)
            return 0 if rounds else 1
        rounds = until_interrupted(args.rounds, lambda r: one_round(ctx, r))
        if args.json:  # (first: the figures are kept whatever the report does)
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "marker": ctx.marker, "rounds": rounds}, f, indent=1, default=str)
        if rounds:
            report(ctx, rounds)
    return 0 if rounds else 1


if __name__ == "__main__":
    sys.exit(main())
