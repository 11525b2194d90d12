#!/usr/bin/env python3
"""By-hand benchmark of issue 12's disk tier (NOT a test): datasets larger than the RAM budget, on
shared storage slower than the node's own disk.

"Shared storage" is an ext4 image on a loop device (losetup --direct-io, mounted under --workdir)
holding the tar shards and a plain directory of the same JPEGs. Its reads are capped by a cgroup v1
blkio group (--iops, --bps: like an HDD-backed store). Once the dataset is made, this process joins
the group, so everything that reads (the reader processes, cp, dd, `shardfs mount` and the daemon
it starts) is capped. The disk tier and the copy "staged by hand" live on the machine's own disk,
uncapped. A dataset of real JPEGs (~110 KB, ImageNet's mean) is made once and reused (marker.json).

One round, every pass after sync + drop_caches, reading as training code does (a torchvision
ImageFolder listing, then every file once in a random order by --readers processes with the
built-in open(path, 'rb').read()); epoch e uses the same order for every method:

  sequential bound  dd iflag=direct of every shard: bytes/s / (shard bytes per file) = files/s
  plain capped      the plain directory on shared storage, --epochs epochs
  staged            cp -r of that directory to local disk (timed), then --epochs epochs there
  shardfs           one mount (--cache-size, --disk-cache on local disk when this shardfs has it),
                    --epochs epochs; then a SECOND mount (new daemon, same disk cache) for one epoch

Bytes from shared storage are the loop device's sectors read (/sys/block/loopN/stat: nobody else
reads this device; the daemon's /proc/PID/io would also count the disk tier's local reads).
Figures are medians [min-max] over --rounds; every ratio is taken within one round.

Run as root (loop devices, cgroups and drop_caches need it):

    python3 tools/bench_tier.py --dataset-size 600M --cache-size 150M   # smoke, ~10 min
    python3 tools/bench_tier.py                                         # 2G dataset, 400M budget
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [p for p in (REPO, HERE) if p not in sys.path]
from bench import CpuMeter, _gen_class, drop_caches, fusermount, pid_cpu_s, proc_field, tune_side  # noqa: E402
from shardfs.storage.memory import parse_size  # noqa: E402

MARKER_VERSION = 1
JPEG_BYTES = 110_000  # ImageNet train mean
BLKIO = "/sys/fs/cgroup/blkio"


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """Run a command; raise with its stderr when it fails."""
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return done


def shardfs_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "shardfs", *args]


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


# ---------------------------------------------------------------------------------------------
# shared storage: a loop-mounted ext4 image, its reads capped by a blkio cgroup


def attach_image(image: str, mountpoint: str, stack: contextlib.ExitStack) -> str:
    """losetup + mount; undone by `stack`. Direct I/O on the backing file, so the image's reads
    are not served a second time from the host file's page cache."""
    dev = run(["losetup", "--find", "--show", "--direct-io=on", image]).stdout.strip()
    stack.callback(subprocess.run, ["losetup", "-d", dev])
    os.makedirs(mountpoint, exist_ok=True)
    run(["mount", dev, mountpoint])
    stack.callback(subprocess.run, ["umount", mountpoint])
    return dev


def device_read_bytes(dev: str) -> int:
    with open(f"/sys/block/{os.path.basename(dev)}/stat") as f:
        return int(f.read().split()[2]) * 512


class ReadCap:
    """A blkio cgroup capping reads from one device; this process (and so its children) in it."""

    def __init__(self, dev: str, iops: int, bps: int):
        rdev = os.stat(dev).st_rdev
        self.majmin = f"{os.major(rdev)}:{os.minor(rdev)}"
        self.path = os.path.join(BLKIO, f"shardfs-bench-tier-{os.getpid()}")
        os.mkdir(self.path)
        write(os.path.join(self.path, "blkio.throttle.read_iops_device"), f"{self.majmin} {iops}")
        write(os.path.join(self.path, "blkio.throttle.read_bps_device"), f"{self.majmin} {bps}")
        write(os.path.join(self.path, "cgroup.procs"), str(os.getpid()))

    def holds(self, pid: int) -> bool:
        with open(os.path.join(self.path, "cgroup.procs")) as f:
            return str(pid) in f.read().split()

    def close(self) -> None:
        write(os.path.join(BLKIO, "cgroup.procs"), str(os.getpid()))
        for _ in range(50):  # exited children leave the group a moment later
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)
        with open(os.path.join(self.path, "cgroup.procs")) as f:
            print(f"WARNING: cgroup {self.path} still holds {f.read().split()}: left in place", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# the dataset: JPEGs (src/train/<class>/) and tar shards (shards/) on the shared storage


def make_image(path: str, size: int) -> None:
    if os.path.exists(path):
        os.unlink(path)
    with open(path, "wb") as f:
        f.truncate(size)
    run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=0,lazy_journal_init=0", path])


def fill_dataset(args, shared: str) -> dict:
    """JPEGs made in parallel (tools/bench.py's generator), packed with `shardfs pack`."""
    t0 = time.perf_counter()
    scratch, train = os.path.join(shared, "scratch"), os.path.join(shared, "src", "train")
    os.makedirs(scratch)
    os.makedirs(train)
    side = tune_side(scratch)[0] if args.side == "auto" else int(args.side)
    per_class = max(1, args.dataset_size // JPEG_BYTES // args.classes)
    print(f"dataset: making {per_class * args.classes} JPEGs (side {side}) in {train} ...", flush=True)
    jobs = [(c, per_class, side, scratch, train) for c in range(args.classes)]
    with mp.get_context("fork").Pool(os.cpu_count() or 1) as pool:
        for _ in pool.imap_unordered(_gen_class, jobs):
            pass
    shutil.rmtree(scratch)
    made_s = time.perf_counter() - t0
    shards_dir = os.path.join(shared, "shards")
    run(shardfs_cmd("pack", os.path.join(shared, "src"), shards_dir, "--shuffle", "--prefix", "train",
                    "--shard-size", str(args.shard_size), "--workers", str(os.cpu_count() or 1)), cwd=REPO)
    sizes = [os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(train) for n in ns]
    return {"files": len(sizes), "image_bytes": sum(sizes), "side": side, "make_s": made_s,
            "pack_s": time.perf_counter() - t0 - made_s}


def dataset(args, work: str, stack: contextlib.ExitStack) -> tuple[str, str, dict]:
    """The shared storage, attached, with its dataset (made when marker.json does not match)."""
    image, shared = os.path.join(work, "shared.img"), os.path.join(work, "shared")
    marker_path = os.path.join(work, "marker.json")
    want = {"version": MARKER_VERSION, "dataset_size": args.dataset_size, "classes": args.classes,
            "side": args.side, "shard_size": args.shard_size}
    try:
        with open(marker_path) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        marker = {}
    reuse = marker.get("params") == want and os.path.exists(image) and not args.rebuild
    if not reuse:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(marker_path)
        make_image(image, int(args.dataset_size * 2.4) + (256 << 20))
    dev = attach_image(image, shared, stack)
    if reuse:
        print(f"dataset: reusing {image} ({marker['files']} JPEGs)")
        return shared, dev, marker
    marker = {"params": want, **fill_dataset(args, shared)}
    with open(marker_path, "w") as f:
        json.dump(marker, f, indent=1)
    return shared, dev, marker


def shard_files(shared: str) -> list[str]:
    top = os.path.join(shared, "shards")
    return sorted(os.path.join(top, n) for n in os.listdir(top) if n.endswith(".tar"))


def index_bytes(shared: str) -> int:
    top = os.path.join(shared, "shards")
    return sum(os.path.getsize(os.path.join(top, n)) for n in os.listdir(top) if n.endswith(".shardfs-idx"))


# ---------------------------------------------------------------------------------------------
# reading as training code reads


def _reader(paths: list[str], barrier, results, slot: int) -> None:
    barrier.wait()
    files = nbytes = errors = 0
    for p in paths:
        try:
            with open(p, "rb") as f:  # what torchvision's pil_loader does (isatty included)
                nbytes += len(f.read())
            files += 1
        except OSError:
            errors += 1
    results[slot * 3: slot * 3 + 3] = [files, nbytes, errors]


def epoch(root: str, readers: int, seed: int, expect: int, daemon: int | None = None) -> dict:
    """drop_caches, ImageFolder listing, every file once in a random order. Also the CPU seconds of
    the `daemon` pid, and the share of the machine's CPU that processes not ours took (noise)."""
    from torchvision.datasets import ImageFolder

    drop_caches()
    others, daemon_cpu0 = CpuMeter(daemon), pid_cpu_s(daemon)
    t0 = time.perf_counter()
    paths = [p for p, _ in ImageFolder(root).samples]
    list_s = time.perf_counter() - t0
    random.Random(seed).shuffle(paths)
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(readers + 1), ctx.Array("q", 3 * readers, lock=False)
    procs = [ctx.Process(target=_reader, args=(paths[i::readers], barrier, results, i)) for i in range(readers)]
    try:
        for p in procs:
            p.start()
        barrier.wait()
        t0 = time.perf_counter()
        for p in procs:
            p.join()
        read_s = time.perf_counter() - t0
    finally:  # interrupted: our readers go before the mounts they read are undone
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join()
    files, errors = sum(results[0::3]), sum(results[2::3])
    if files != expect or errors:
        raise RuntimeError(f"{root}: read {files} of {expect} files, {errors} errors")
    return {"list_s": list_s, "read_s": read_s, "fps": files / read_s, "others_cpu": others.background(),
            "daemon_cpu_s": pid_cpu_s(daemon) - daemon_cpu0 if daemon else None}


def sequential_bound(shards: list[str], files: int) -> dict:
    """Every shard read once with large O_DIRECT requests: the storage's best case, in files/s."""
    drop_caches()
    t0 = time.perf_counter()
    for s in shards:
        run(["dd", f"if={s}", "of=/dev/null", "bs=4M", "iflag=direct"])
    secs = time.perf_counter() - t0
    nbytes = sum(os.path.getsize(s) for s in shards)
    return {"mbps": nbytes / secs / 1e6, "fps": nbytes / secs / (nbytes / files)}


# ---------------------------------------------------------------------------------------------
# shardfs mounts


class ShardfsMount:
    def __init__(self, ctx, name: str):
        self.mnt = os.path.join(ctx.work, "mnt", name)
        os.makedirs(self.mnt, exist_ok=True)
        cmd = shardfs_cmd("mount", os.path.join(ctx.shared, "shards"), self.mnt,
                          "--log-file", os.path.join(ctx.work, f"{name}.log"), *ctx.mount_options)
        run(cmd, cwd=REPO)
        self.pid = None
        ctx.stack.callback(self.unmount)
        self.pid = self.stats()["pid"]
        self.rss_at_mount = proc_field(self.pid, "status", "VmRSS")

    def stats(self) -> dict:
        return json.loads(run(shardfs_cmd("stats", "--json", self.mnt), cwd=REPO).stdout)

    def peak_rss(self) -> int | None:
        return proc_field(self.pid, "status", "VmHWM")

    def unmount(self) -> None:
        """fusermount3 -u (lazily when busy); wait for the daemon; SIGTERM only its own pid."""
        if self.mnt is None:
            return
        for _ in range(5):  # a busy mount: give whoever holds it a few seconds
            if fusermount(self.mnt) or not os.path.ismount(self.mnt):
                break
            time.sleep(1)
        else:
            held = subprocess.run(["fuser", "-vm", self.mnt], capture_output=True, text=True)
            print(f"WARNING: {self.mnt} busy, unmounting lazily; held by:\n{held.stdout}{held.stderr}", file=sys.stderr)
            fusermount(self.mnt, lazy=True)
        deadline = time.monotonic() + 30
        while self.pid and os.path.exists(f"/proc/{self.pid}") and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.pid and os.path.exists(f"/proc/{self.pid}"):
            print(f"WARNING: shardfs daemon {self.pid} alive 30 s after unmount: SIGTERM", file=sys.stderr)
            os.kill(self.pid, signal.SIGTERM)
        self.mnt = None


def tier_figures(stats: dict) -> dict:
    """Whatever the daemon reports about its disk tier (names not fixed yet: keys naming it)."""
    return {k: v for k, v in stats.items() if "disk" in k or "tier" in k}


# ---------------------------------------------------------------------------------------------
# one round


def one_round(ctx, r: int) -> dict:
    a, out = ctx.args, {}
    files, train = ctx.marker["files"], os.path.join(ctx.shared, "src", "train")
    seeds = [1000 * r + e for e in range(a.epochs)]
    out["seq"] = sequential_bound(ctx.shards, files)
    print(f"  sequential bound {out['seq']['mbps']:.0f} MB/s = {out['seq']['fps']:.0f} files/s", flush=True)

    dev0 = device_read_bytes(ctx.dev)
    out["plain"] = [epoch(train, a.readers, s, files) for s in seeds]
    out["plain_storage"] = device_read_bytes(ctx.dev) - dev0
    print("  plain capped " + ", ".join(f"{e['fps']:.0f}" for e in out["plain"]) + " files/s", flush=True)

    staged = os.path.join(ctx.work, "staged")
    shutil.rmtree(staged, ignore_errors=True)
    drop_caches()
    t0 = time.perf_counter()
    run(["cp", "-r", train, staged])
    out["stage_s"] = time.perf_counter() - t0
    out["staged"] = [epoch(staged, a.readers, s, files) for s in seeds]
    print(f"  staged: copy {out['stage_s']:.0f} s, " + ", ".join(f"{e['fps']:.0f}" for e in out["staged"])
          + " files/s", flush=True)

    shutil.rmtree(ctx.disk_cache, ignore_errors=True)  # epoch 1 starts with an empty tier
    drop_caches()
    dev0, t0 = device_read_bytes(ctx.dev), time.perf_counter()
    m = ShardfsMount(ctx, "shardfs")
    out["mount_s"] = time.perf_counter() - t0
    out["in_cgroup"] = ctx.cap.holds(m.pid)
    out["shardfs"], out["shardfs_storage"] = [], []
    for s in seeds:
        before = device_read_bytes(ctx.dev)
        out["shardfs"].append(epoch(os.path.join(m.mnt, "train"), a.readers, s, files, m.pid))
        out["shardfs_storage"].append(device_read_bytes(ctx.dev) - before)
    out["storage_total"] = device_read_bytes(ctx.dev) - dev0  # the mount's index loads included
    out["rss_at_mount"], out["rss_peak"] = m.rss_at_mount, m.peak_rss()
    out["stats"] = m.stats()
    m.unmount()
    print("  shardfs " + ", ".join(f"{e['fps']:.0f}" for e in out["shardfs"]) + " files/s, storage "
          + ", ".join(f"{b / 1e6:.0f}" for b in out["shardfs_storage"]) + " MB", flush=True)

    drop_caches()
    dev0 = device_read_bytes(ctx.dev)
    m2 = ShardfsMount(ctx, "shardfs-again")
    out["second"] = epoch(os.path.join(m2.mnt, "train"), a.readers, seeds[0], files, m2.pid)
    out["second_storage"] = device_read_bytes(ctx.dev) - dev0
    out["second_stats"] = m2.stats()
    m2.unmount()
    print(f"  second mount {out['second']['fps']:.0f} files/s, storage {out['second_storage'] / 1e6:.0f} MB",
          flush=True)
    shutil.rmtree(staged, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------------------------
# report


def spread(values, fmt: str = "{:.0f}") -> str:
    """median, and [min-max] when there are several."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    text = fmt.format(statistics.median(values))
    return text + (f" [{fmt.format(min(values))}-{fmt.format(max(values))}]" if len(values) > 1 else "")


def report(ctx, rounds: list[dict]) -> None:
    a, shard_bytes = ctx.args, ctx.shard_bytes
    label = "shardfs+tier" if ctx.has_tier else "shardfs (RAM only)"
    print()
    print(f"files/s per epoch (median [min-max] of {len(rounds)} rounds), every epoch after drop_caches; "
          f"{a.readers} readers, open().read() in random order")
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
        ("  shardfs mount + all epochs", spread((x(r["storage_total"]) for r in rounds), "{:.3f}")),
        ("  2nd mount (same disk cache)", spread((x(r["second_storage"]) for r in rounds), "{:.3f}")),
        (f"  plain capped, {a.epochs} epochs", spread((x(r["plain_storage"]) for r in rounds), "{:.3f}")),
        (f"daemon CPU s, epoch 1..{a.epochs}",
         " / ".join(spread((r["shardfs"][e]["daemon_cpu_s"] for r in rounds), "{:.1f}") for e in range(a.epochs))),
        ("others' CPU share %, max over epochs", "  ".join(
            f"{k} {spread((100 * max(e['others_cpu'] for e in r[k]) for r in rounds))}"
            for k in ("shardfs", "plain", "staged"))),
        ("staged by hand: cp -r s", spread((r["stage_s"] for r in rounds), "{:.1f}")),
        ("sequential bound MB/s", spread((r["seq"]["mbps"] for r in rounds), "{:.0f}")),
        ("shardfs mount s (index exists)", spread((r["mount_s"] for r in rounds), "{:.2f}")),
        ("daemon RSS at mount MB", spread((r["rss_at_mount"] / 1e6 for r in rounds), "{:.0f}")),
        ("daemon peak RSS MB (VmHWM)", spread((r["rss_peak"] / 1e6 for r in rounds), "{:.0f}")),
    ]
    for name, value in rows:
        print(f"{name:<40}{value}")
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
        ("epoch 1 >= 4x plain capped", ratios(lambda r: e1(r) / r["plain"][0]["fps"]), ">=", 4.0),
        *[(f"epoch {e + 1} >= 0.7x plain staged", ratios(lambda r, e=e: r["shardfs"][e]["fps"] / r["staged"][e]["fps"]),
           ">=", 0.7) for e in range(1, a.epochs)],
        (f"shared storage over {a.epochs} epochs <= 1.05x shards", ratios(lambda r: x(r["storage_total"])), "<=", 1.05),
        ("2nd mount shared storage <= 0.05x shards", ratios(lambda r: x(r["second_storage"])), "<=", 0.05),
        (f"peak RSS <= budget + RSS at mount + {a.rss_slack >> 20} MB, x that",
         ratios(lambda r: r["rss_peak"] / (a.cache_size + r["rss_at_mount"] + a.rss_slack)), "<=", 1.0),
    ]
    print()
    print(f"{'target (' + label + ')':<58}{'ratio':>22}  result")
    print("-" * 90)
    for name, values, rule, limit in targets:
        med = statistics.median(values)
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
    parser.add_argument("--side", default="auto", help="JPEG side in pixels (auto: ~110 KB per JPEG)")
    parser.add_argument("--shard-size", type=parse_size, default=None, help="default: RAM budget / 4, at most 256M")
    parser.add_argument("--iops", type=int, default=200, help="read IOPS cap of the shared storage")
    parser.add_argument("--bps", type=parse_size, default=150_000_000, help="read bytes/s cap (150M = 150 MiB/s)")
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--rss-slack", type=parse_size, default=parse_size("64M"),
                        help="daemon memory allowed above the budget and its RSS at mount")
    parser.add_argument("--rebuild", action="store_true", help="remake the dataset even if marker.json matches")
    parser.add_argument("--json", help="also write every round's figures here")
    args = parser.parse_args()
    args.shard_size = args.shard_size or min(256 << 20, args.cache_size // 4)
    if args.dataset_size < 4 * args.cache_size:
        print(f"WARNING: the dataset is under 4x the RAM budget ({args.dataset_size >> 20}M vs {args.cache_size >> 20}M)")
    if os.geteuid() != 0:
        parser.error("run as root: loop devices, blkio cgroups and drop_caches need it")

    main_pid = os.getpid()

    def on_term(signum, _frame):
        if os.getpid() != main_pid:  # a forked reader: just go
            os._exit(128 + signum)
        raise KeyboardInterrupt(f"signal {signum}")  # unwinds the ExitStack: unmount, detach, cgroup

    signal.signal(signal.SIGTERM, on_term)
    ctx = Ctx()
    ctx.args, ctx.work = args, os.path.abspath(args.workdir)
    os.makedirs(ctx.work, exist_ok=True)
    print(f"command: python3 {' '.join(sys.argv)}")
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, shardfs commit "
          f"{subprocess.run(['git', '-C', REPO, 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip()}")
    with contextlib.ExitStack() as stack:
        ctx.stack = stack
        ctx.shared, ctx.dev, ctx.marker = dataset(args, ctx.work, stack)
        ctx.shards = shard_files(ctx.shared)
        ctx.shard_bytes = sum(os.path.getsize(s) for s in ctx.shards)
        ctx.disk_cache = os.path.join(ctx.work, "disk-cache")
        stack.callback(shutil.rmtree, ctx.disk_cache, True)
        stack.callback(shutil.rmtree, os.path.join(ctx.work, "staged"), True)
        ctx.has_tier = "--disk-cache" in run(shardfs_cmd("mount", "--help"), cwd=REPO).stdout
        ctx.mount_options = ["--cache-size", f"{args.cache_size >> 20}M"]
        if ctx.has_tier:
            ctx.mount_options += ["--disk-cache", ctx.disk_cache,
                                  "--disk-cache-size", args.disk_cache_size or str(2 * ctx.shard_bytes)]
        m = ctx.marker
        print(f"dataset: {m['files']} JPEGs, {m['image_bytes'] / 1e9:.3f} GB, mean {m['image_bytes'] / m['files'] / 1e3:.1f}"
              f" KB; {len(ctx.shards)} tar shards {ctx.shard_bytes / 1e9:.3f} GB; shared storage {ctx.dev} capped at "
              f"{args.iops} IOPS, {args.bps / 1e6:.0f} MB/s; shardfs mount {' '.join(ctx.mount_options)}"
              + ("" if ctx.has_tier else " (this shardfs has no --disk-cache: RAM tier only)"), flush=True)
        ctx.cap = None
        stack.callback(lambda: ctx.cap and ctx.cap.close())  # after the mounts below are undone
        t0 = time.perf_counter()
        ShardfsMount(ctx, "index").unmount()  # builds missing indexes, uncapped: not what we measure
        ctx.index_bytes = index_bytes(ctx.shared)
        print(f"indexes ready ({time.perf_counter() - t0:.1f} s, {ctx.index_bytes / 1e6:.1f} MB)", flush=True)

        ctx.cap = ReadCap(ctx.dev, args.iops, args.bps)
        rounds = []
        try:
            for r in range(args.rounds):
                print(f"round {r + 1}/{args.rounds} (load {os.getloadavg()[0]:.1f})", flush=True)
                rounds.append(one_round(ctx, r))
        except KeyboardInterrupt:
            print("interrupted: reporting the rounds measured", file=sys.stderr)
        if rounds:
            report(ctx, rounds)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "marker": ctx.marker, "rounds": rounds}, f, indent=1, default=str)
    return 0 if rounds else 1


if __name__ == "__main__":
    sys.exit(main())
