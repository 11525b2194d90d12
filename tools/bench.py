#!/usr/bin/env python3
"""By-hand benchmark of shardfs against a plain directory, ratarmount and squashfuse_ll (NOT a test).

Builds (or reuses, see --workdir and its marker.json) a synthetic ImageNet-like dataset of real
JPEGs (~110 KB each), packs it into tar shards (`shardfs pack` when it exists) and a squashfs
image, then measures every method in the same run. Round r mounts every method once (the order
rotates each round, so nobody always goes first); in each round, per method:

  sync + drop_caches, fresh mount (timed)   -> mount time
  torchvision ImageFolder(root)             -> listing time
  random-order read of every file by --readers processes (open/read/close): cold, then warm
  ImageFolder + DataLoader(num_workers=--readers, batch_size=64), RandomResizedCrop(224)+ToTensor
  drop_caches on the same mount, random read again (kernel caches gone, the daemon's own kept)
  peak RSS (VmHWM) of the daemon; bytes read from storage in every pass (/proc/PID/io read_bytes
  of the daemon; of the reader processes for plain; shardfs's own cache counter too)

Figures are medians over --epochs rounds, with ratios to `plain`; then the shardfs targets with
PASS/FAIL. On a shared machine other jobs make figures noisy: each pass records the share of the
CPU that processes not started here took, a round waits for a quiet machine first (--quiet-wait)
and is redone once (--retries) when others took more than --max-background of the CPU.

Run as root (drop_caches needs it; otherwise "cold" figures are not cold and the output says so):

    python3 tools/bench.py --images 2000 --epochs 1        # quick look (~3 min)
    python3 tools/bench.py --json /tmp/bench.json          # default size (~20k images, 2.2 GB; ~1 h)

On a VM with free page reporting (the CI machine kind), add --free-page-reporting off: otherwise the
host's page faults on fresh guest memory are charged to whoever touches it, which is the FUSE daemon
and not the disk's DMA (see stop_free_page_reporting).
"""

from __future__ import annotations

import argparse
import atexit
import json
import math
import mmap
import multiprocessing as mp
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)
from shardfs.storage.memory import parse_size  # noqa: E402
from shardfs.service.mount import process_alive as pid_alive, stop_child  # noqa: E402

MARKER_VERSION = 3
TARGET_JPEG_BYTES = 110_000  # ImageNet train mean
STATS_XATTR = "user.shardfs.fuse.stats"
PAGE_REPORTING = "/sys/module/page_reporting/parameters/page_reporting_order"
NO_REPORTING_ORDER = 11  # above the buddy allocator's largest order: no free block is ever reported
LATER_EPOCH_ZERO = 0.02  # "~0" storage reads in later epochs: at most this fraction of the dataset


# ---------------------------------------------------------------------------------------------
# small helpers


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def vmstat(key: str) -> int | None:
    with open("/proc/vmstat") as f:
        for line in f:
            if line.startswith(key + " "):
                return int(line.split()[1])
    return None


def meminfo(key: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def drop_caches() -> bool:
    """sync; echo 3 > drop_caches. False when not possible (not root, read-only /proc/sys)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def proc_field(pid: int, fname: str, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/{fname}") as f:
            for line in f:
                if line.startswith(key + ":"):
                    parts = line.split()
                    value = int(parts[1])
                    return value * 1024 if len(parts) > 2 and parts[2] == "kB" else value
    except OSError:
        return None
    return None



class BlockDev:
    """Sectors read by the block device holding a path (/sys/dev/block/MAJ:MIN/stat)."""

    def __init__(self, path: str):
        st = os.stat(path)
        self.name = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        self.stat = f"/sys/dev/block/{self.name}/stat"
        if not os.path.exists(self.stat):
            self.stat = None

    def read_bytes(self) -> int | None:
        if not self.stat:
            return None
        with open(self.stat) as f:
            return int(f.read().split()[2]) * 512


HZ = os.sysconf("SC_CLK_TCK")


def cpu_busy_s() -> float:
    """Busy CPU seconds of the whole machine (all cores) since boot."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal
    return (v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)) / HZ


def pid_cpu_s(pid: int | None) -> float:
    """CPU seconds of a process and its reaped children (0 when gone)."""
    if not pid:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:15]) / HZ
    except OSError:
        return 0.0


def own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class CpuMeter:
    """Share of the machine's CPU used by processes that are not ours during a pass: other people's
    jobs on a shared box make every figure noisy; this says how much."""

    def __init__(self, daemon_pid: int | None = None):
        self.daemon_pid = daemon_pid
        self.t0 = time.perf_counter()
        self.busy0, self.own0, self.d0 = cpu_busy_s(), own_cpu_s(), pid_cpu_s(daemon_pid)

    def background(self) -> float:
        secs = time.perf_counter() - self.t0
        busy = cpu_busy_s() - self.busy0
        ours = own_cpu_s() - self.own0 + pid_cpu_s(self.daemon_pid) - self.d0
        return max(0.0, (busy - ours) / (secs * (os.cpu_count() or 1)))


def wait_quiet(limit_s: float, threshold: float = 0.15) -> float:
    """Wait (up to limit_s) until other processes use less than `threshold` of the CPU over 2 s.
    Returns the last background share seen."""
    deadline = time.monotonic() + limit_s
    while True:
        m = CpuMeter()
        time.sleep(2.0)
        bg = m.background()
        if bg < threshold or time.monotonic() >= deadline:
            return bg


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


# ---------------------------------------------------------------------------------------------
# the dataset


def _gen_class(job):
    """One class folder, made by shardfs.sample in a scratch dir and moved into place."""
    c, per_class, side, scratch, train = job
    from shardfs import sample

    tmp = os.path.join(scratch, f"c{c}")
    shutil.rmtree(tmp, ignore_errors=True)
    sample.make_imagefolder(tmp, classes=1, per_class=per_class, side=side, seed=1000 + c)
    src = os.path.join(tmp, "train", "n00000000")
    dst = os.path.join(train, f"n{c:08d}")
    for name in os.listdir(src):  # file names carry the class name: rename them too
        os.rename(os.path.join(src, name), os.path.join(src, name.replace("n00000000", f"n{c:08d}", 1)))
    os.rename(src, dst)
    shutil.rmtree(tmp, ignore_errors=True)
    return c


def tune_side(scratch: str) -> tuple[int, float]:
    """The JPEG side that gives the ImageNet mean (~110 KB) with this Pillow/libjpeg."""
    from shardfs import sample

    probe = os.path.join(scratch, "probe")
    top = sample.make_imagefolder(probe, classes=2, per_class=30, side=320, seed=4242)
    sizes = [os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(top) for f in fs]
    shutil.rmtree(probe, ignore_errors=True)
    mean320 = sum(sizes) / len(sizes)
    side = int(round(320 * math.sqrt(TARGET_JPEG_BYTES / mean320) / 16) * 16)
    return side, mean320


def shardfs_pack_help() -> str | None:
    done = run([sys.executable, "-m", "shardfs", "pack", "--help"], cwd=REPO)
    return done.stdout if done.returncode == 0 else None


def try_shardfs_pack(src: str, out: str, shard_size: int, help_text: str) -> tuple[list[str] | None, str]:
    """Pack with `shardfs pack` when it exists; its interface is guessed from --help."""
    cmd = [sys.executable, "-m", "shardfs", "pack", src, out]
    if "--format" in help_text:
        cmd += ["--format", "tar"]
    if "--shuffle" in help_text:
        cmd += ["--shuffle"]
    if "--shard-size" in help_text:
        cmd += ["--shard-size", f"{shard_size >> 20}M"]
    if "--prefix" in help_text:
        cmd += ["--prefix", "train"]
    if "--workers" in help_text:
        cmd += ["--workers", str(os.cpu_count() or 1)]
    os.makedirs(out, exist_ok=True)
    done = run(cmd, cwd=REPO)
    shards = sorted(os.path.join(out, n) for n in os.listdir(out) if n.endswith(".tar"))
    why = " ".join(cmd[2:])
    if done.returncode != 0 or not shards:
        return None, f"`{why}` failed ({done.returncode}): {done.stderr.strip()[-300:]}"
    with tarfile.open(shards[0]) as tf:
        first = next((m.name for m in tf if m.isfile()), "")
    if not first.lstrip("./").startswith("train/"):
        return None, f"`{why}` stored names like {first!r}, not train/<class>/<file>"
    return shards, f"shardfs pack ({why})"


def _rm(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _save_marker(path: str, marker: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(marker, f, indent=1)
    os.replace(path + ".tmp", path)


def _marker_from_v2(old: dict) -> dict:
    p, secs = old.get("params", {}), old.get("seconds", {})
    try:
        return {
            "version": MARKER_VERSION,
            "src": {"params": {k: p[k] for k in ("images", "classes", "side")}, "side": old["side"],
                    "files": old["files"], "image_bytes": old["image_bytes"],
                    "mean_jpeg_bytes": old["mean_jpeg_bytes"], "seconds": secs.get("generate")},
            "shards": {"params": {k: p[k] for k in ("shard_size", "packer")}, "paths": old["shards"],
                       "packer": old["packer"], "tar_bytes": old["tar_bytes"], "seconds": secs.get("pack")},
            "squashfs": ({"path": old["squashfs"], "bytes": old["squashfs_bytes"], "seconds": secs.get("mksquashfs")}
                         if old.get("squashfs") else None),
        }
    except KeyError:
        return {}


def build_dataset(args, work: str) -> dict:
    """Make (or reuse) src/train/<class>/*.JPEG, shards/*.tar and image.sqsh.

    marker.json records each stage with the parameters it was made with; a stage is remade
    (with the stages after it) only when its parameters changed, or with --rebuild."""
    marker_path = os.path.join(work, "marker.json")
    try:
        with open(marker_path) as f:
            have = json.load(f)
        if (have.get("params") or {}).get("version") == 2:  # an earlier bench.py's one-stage marker
            have = _marker_from_v2(have)
        if have.get("version") != MARKER_VERSION:
            have = {}
    except (OSError, ValueError):
        have = {}
    if args.rebuild:
        have = {}
    marker = {"version": MARKER_VERSION}
    src = os.path.join(work, "src")
    from shardfs import sample

    # 1. the JPEGs
    want = {"images": args.images, "classes": args.classes, "side": args.side}
    old = have.get("src") or {}
    if old.get("params") == want and os.path.isdir(os.path.join(src, "train")):
        marker["src"] = old
        print(f"dataset: reusing the JPEGs in {src}")
    else:
        have = {}  # everything after depends on the JPEGs
        _save_marker(marker_path, marker)
        print(f"dataset: making JPEGs in {src} ...", flush=True)
        for sub in ("src", "shards", "scratch", "image.sqsh"):
            _rm(os.path.join(work, sub))
        scratch = os.path.join(work, "scratch")
        os.makedirs(scratch)
        t0 = time.perf_counter()
        if args.side == "auto":
            side, mean320 = tune_side(scratch)
            print(f"  side=320 gives {mean320 / 1e3:.1f} KB per JPEG here; using side={side} for ~110 KB")
        else:
            side = int(args.side)
        per_class = max(1, args.images // args.classes)
        train = os.path.join(src, "train")
        os.makedirs(train)
        jobs = [(c, per_class, side, scratch, train) for c in range(args.classes)]
        with mp.get_context("fork").Pool(os.cpu_count() or 1) as pool:
            for done, _ in enumerate(pool.imap_unordered(_gen_class, jobs), 1):
                if done % max(1, args.classes // 10) == 0:
                    print(f"  {done}/{args.classes} classes", flush=True)
        _rm(scratch)
        files = sample.files_under(src)
        image_bytes = sum(os.path.getsize(os.path.join(src, f)) for f in files)
        marker["src"] = {"params": want, "side": side, "files": len(files), "image_bytes": image_bytes,
                         "mean_jpeg_bytes": image_bytes / len(files), "seconds": time.perf_counter() - t0}
        print(f"  {len(files)} JPEGs, {image_bytes / 1e9:.2f} GB, mean {image_bytes / len(files) / 1e3:.1f} KB "
              f"({marker['src']['seconds']:.0f} s)", flush=True)
    _save_marker(marker_path, marker)
    files, image_bytes = marker["src"]["files"], marker["src"]["image_bytes"]

    # 2. the tar shards
    pack_help = shardfs_pack_help()
    want = {"shard_size": args.shard_size, "packer": "shardfs-pack" if pack_help else "round-robin"}
    old = have.get("shards") or {}
    if old.get("params") == want and old.get("paths") and all(os.path.exists(p) for p in old["paths"]):
        marker["shards"] = old
        print(f"dataset: reusing {len(old['paths'])} tar shards ({old['packer']})")
    else:
        out = os.path.join(work, "shards")
        _rm(out)
        t0 = time.perf_counter()
        nshards = max(1, math.ceil((image_bytes + 1536 * files) / args.shard_size))
        shards, packer = None, ""
        if pack_help:
            shards, packer = try_shardfs_pack(src, out, args.shard_size, pack_help)
            if shards is None:
                print(f"  WARNING: {packer}; falling back to sample.pack_tar_round_robin")
                _rm(out)
        if shards is None:
            shards = sample.pack_tar_round_robin(src, out, nshards)
            packer = f"shardfs.sample.pack_tar_round_robin ({nshards} shards)"
        marker["shards"] = {"params": want, "paths": shards, "packer": packer,
                            "tar_bytes": sum(os.path.getsize(p) for p in shards),
                            "seconds": time.perf_counter() - t0}
        print(f"  packed {len(shards)} tar shards, {marker['shards']['tar_bytes'] / 1e9:.2f} GB, with {packer} "
              f"({marker['shards']['seconds']:.0f} s)", flush=True)
    _save_marker(marker_path, marker)

    # 3. the squashfs image (default compression; -noappend)
    sqsh = os.path.join(work, "image.sqsh")
    old = have.get("squashfs") or {}
    if old.get("path") and os.path.exists(old["path"]):
        marker["squashfs"] = old
    elif shutil.which("mksquashfs"):
        _rm(sqsh)
        t0 = time.perf_counter()
        done = run(["mksquashfs", src, sqsh, "-noappend", "-quiet", "-no-progress"])
        if done.returncode != 0:
            print(f"  WARNING: mksquashfs failed: {done.stderr.strip()[-300:]}")
        else:
            marker["squashfs"] = {"path": sqsh, "bytes": os.path.getsize(sqsh), "seconds": time.perf_counter() - t0}
            print(f"  squashfs image {marker['squashfs']['bytes'] / 1e9:.2f} GB ({marker['squashfs']['seconds']:.0f} s)",
                  flush=True)
    _save_marker(marker_path, marker)
    return marker


# ---------------------------------------------------------------------------------------------
# mounts


def fusermount(mnt: str, lazy: bool = False) -> bool:
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    cmd = [tool, "-u"] + (["-z"] if lazy else []) + [mnt]
    return run(cmd).returncode == 0


def is_mounted_or_stale(mnt: str) -> bool:
    if os.path.ismount(mnt):
        return True
    try:
        os.stat(mnt)
    except OSError:
        return True  # ENOTCONN: a dead FUSE daemon left it
    return False


def clean_mountpoint(mnt: str) -> None:
    os.makedirs(mnt, exist_ok=True)
    if is_mounted_or_stale(mnt):
        if not fusermount(mnt):
            fusermount(mnt, lazy=True)


class Mount:
    """One mounted instance of a method: root of the ImageFolder, daemon pid, how to unmount."""

    def __init__(self, root: str, mnt: str | None = None, pid: int | None = None, proc=None):
        self.root, self.mnt, self.pid, self.proc = root, mnt, pid, proc

    def stats(self) -> dict | None:
        if self.mnt is None:
            return None
        try:
            return json.loads(os.getxattr(self.mnt, STATS_XATTR))
        except (OSError, ValueError):
            return None

    def io_read_bytes(self) -> int | None:
        return proc_field(self.pid, "io", "read_bytes") if self.pid else None

    def peak_rss(self) -> int | None:
        return proc_field(self.pid, "status", "VmHWM") if self.pid else None

    def unmount(self) -> None:
        """fusermount3 -u, then -u -z; wait for the daemon; signal only a pid we started."""
        if self.mnt is None:
            return
        if not fusermount(self.mnt) and is_mounted_or_stale(self.mnt):
            fusermount(self.mnt, lazy=True)
        deadline = time.monotonic() + 30
        if self.proc is not None:  # our own child (ratarmount, squashfuse_ll)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                stop_child(self.proc)
        elif self.pid:  # the shardfs daemon our `shardfs mount` started (pid from its own xattr)
            while pid_alive(self.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if pid_alive(self.pid):
                print(f"  WARNING: shardfs daemon {self.pid} still alive 30 s after unmount; SIGTERM")
                os.kill(self.pid, signal.SIGTERM)
        self.mnt = None


def wait_mounted(mnt: str, proc: subprocess.Popen, timeout: float, log: str) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.ismount(mnt):
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited with {proc.returncode} before mounting (log {log})")
        if time.monotonic() > deadline:
            stop_child(proc)
            raise RuntimeError(f"not mounted after {timeout:.0f} s (log {log})")
        time.sleep(0.01)


class Method:
    name = ""
    fuse = True

    def __init__(self, ctx):
        self.ctx = ctx
        self.note = ""

    def available(self) -> str | None:
        return None

    def prepare_first(self) -> None:
        """Forget indexes so that the first mount builds them."""

    def mount(self) -> Mount:
        raise NotImplementedError


class Plain(Method):
    name = "plain"
    fuse = False

    def mount(self) -> Mount:
        return Mount(os.path.join(self.ctx.marker_dir, "src", "train"))


class ShardFS(Method):
    name = "shardfs"

    def __init__(self, ctx, cache_size: str | None = None, label: str = "shardfs"):
        super().__init__(ctx)
        self.name = label
        self.cache_size = cache_size

    def options(self) -> list[str]:
        opts = []
        if self.cache_size and self.ctx.mount_help.get("--cache-size"):
            opts += ["--cache-size", self.cache_size]
        if self.ctx.args.prefetch and self.ctx.mount_help.get("--prefetch"):
            opts += ["--prefetch", self.ctx.args.prefetch]
        return opts

    def prepare_first(self) -> None:
        shard_dir = os.path.join(self.ctx.marker_dir, "shards")
        for n in os.listdir(shard_dir):
            if n.endswith(".shardfs-idx"):
                os.unlink(os.path.join(shard_dir, n))

    def mount(self) -> Mount:
        mnt = os.path.join(self.ctx.work, "mnt", self.name)
        clean_mountpoint(mnt)
        log = os.path.join(self.ctx.work, "logs", f"{self.name}.log")
        cmd = [sys.executable, "-m", "shardfs", "mount", os.path.join(self.ctx.marker_dir, "shards"), mnt,
               "--log-file", log, *self.options()]
        done = run(cmd, cwd=REPO, timeout=3600)
        if done.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd[2:])}` failed: {done.stderr.strip()[-400:]}")
        m = Mount(os.path.join(mnt, "train"), mnt)
        st = m.stats()
        if not st or "pid" not in st:
            m.mnt = mnt
            m.unmount()
            raise RuntimeError("mounted but the stats xattr gives no pid")
        m.pid = st["pid"]
        return m


class Ratarmount(Method):
    name = "ratarmount"

    def exe(self) -> str | None:
        # The real script beside our interpreter (pyenv shims would add a bash layer, still exec'd).
        mine = os.path.join(os.path.dirname(sys.executable), "ratarmount")
        return mine if os.path.exists(mine) else shutil.which("ratarmount")

    def available(self) -> str | None:
        return None if self.exe() else "ratarmount not installed"

    def prepare_first(self) -> None:
        for p in self.ctx.shards:
            for idx in (p + ".index.sqlite",):
                if os.path.exists(idx):
                    os.unlink(idx)

    def mount(self) -> Mount:
        mnt = os.path.join(self.ctx.work, "mnt", self.name)
        clean_mountpoint(mnt)
        log = os.path.join(self.ctx.work, "logs", f"{self.name}.log")
        with open(log, "a") as lf:  # own session: a Ctrl-C leaves the daemon to our unmount in `finally`
            proc = subprocess.Popen([self.exe(), "-f", *self.ctx.shards, mnt], stdout=lf, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        wait_mounted(mnt, proc, 3600, log)
        return Mount(os.path.join(mnt, "train"), mnt, proc.pid, proc)


class Squashfuse(Method):
    name = "squashfuse_ll"

    def available(self) -> str | None:
        if not shutil.which("squashfuse_ll"):
            return "squashfuse_ll not installed"
        if not self.ctx.marker.get("squashfs"):
            return "no squashfs image (mksquashfs missing or failed)"
        return None

    def mount(self) -> Mount:
        mnt = os.path.join(self.ctx.work, "mnt", self.name)
        clean_mountpoint(mnt)
        log = os.path.join(self.ctx.work, "logs", f"{self.name}.log")
        with open(log, "a") as lf:  # own session, as for ratarmount
            proc = subprocess.Popen(["squashfuse_ll", "-f", self.ctx.marker["squashfs"]["path"], mnt], stdout=lf,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        wait_mounted(mnt, proc, 600, log)
        return Mount(os.path.join(mnt, "train"), mnt, proc.pid, proc)


# ---------------------------------------------------------------------------------------------
# workloads


def _reader_proc(paths, barrier, results, slot):
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    n = nbytes = errors = 0
    io0 = proc_field(os.getpid(), "io", "read_bytes") or 0
    barrier.wait()
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            errors += 1
            continue
        try:
            while True:
                k = os.readv(fd, [view])
                if k <= 0:
                    break
                nbytes += k
            n += 1
        except OSError:
            errors += 1
        finally:
            os.close(fd)
    io1 = proc_field(os.getpid(), "io", "read_bytes") or 0
    results[slot * 4: slot * 4 + 4] = [n, nbytes, errors, io1 - io0]


def random_read(paths: list[str], readers: int, seed: int) -> dict:
    """Every file once, in a random order, by `readers` processes (open/read/close)."""
    order = list(paths)
    random.Random(seed).shuffle(order)
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(readers + 1)
    results = ctx.Array("q", 4 * readers, lock=False)
    procs = [ctx.Process(target=_reader_proc, args=(order[i::readers], barrier, results, i)) for i in range(readers)]
    for p in procs:
        p.start()
    barrier.wait()
    t0 = time.perf_counter()
    for p in procs:
        p.join()
    secs = time.perf_counter() - t0
    files = sum(results[i * 4] for i in range(readers))
    nbytes = sum(results[i * 4 + 1] for i in range(readers))
    errors = sum(results[i * 4 + 2] for i in range(readers))
    io = sum(results[i * 4 + 3] for i in range(readers))
    return {"seconds": secs, "files": files, "bytes": nbytes, "errors": errors, "readers_read_bytes": io,
            "files_per_s": files / secs, "mb_per_s": nbytes / secs / 1e6}


def listing(root: str):
    from torchvision import datasets

    t0 = time.perf_counter()
    ds = datasets.ImageFolder(root)
    return ds, time.perf_counter() - t0


def decode_epoch(ds, workers: int, seed: int) -> dict:
    import torch
    from torchvision import transforms

    ds.transform = transforms.Compose([transforms.RandomResizedCrop(224), transforms.ToTensor()])
    torch.manual_seed(seed)
    loader = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True, num_workers=workers)
    t0 = time.perf_counter()
    seen = 0
    for images, _labels in loader:
        seen += len(images)
    secs = time.perf_counter() - t0
    return {"seconds": secs, "images": seen, "images_per_s": seen / secs}


# ---------------------------------------------------------------------------------------------
# one round of one method


class Meter:
    """What happened during a pass: bytes read from storage (the daemon's /proc/PID/io read_bytes
    for FUSE methods; the block device's sectors, system-wide and so polluted by other jobs;
    shardfs's own cache counter), FUSE read requests the shardfs daemon answered, and the share
    of the machine's CPU that other people's processes took."""

    def __init__(self, m: Mount, dev: BlockDev):
        self.m, self.dev = m, dev

    def _now(self):
        st = self.m.stats() or {}
        cache = st.get("cache") if isinstance(st.get("cache"), dict) else {}
        return (self.m.io_read_bytes(), self.dev.read_bytes(), cache.get("storage_bytes_read"),
                (st.get("fuse_ops") or {}) if st else None,
                pid_cpu_s(self.m.pid) if self.m.pid else None)

    def start(self):
        self.t = self._now()
        self.cpu = CpuMeter(self.m.pid)
        self.drops = vmstat("drop_pagecache")

    def stop(self, extra: dict | None = None) -> dict:
        now = self._now()
        d = lambda a, b: (b - a) if a is not None and b is not None else None  # noqa: E731
        out = {"daemon": d(self.t[0], now[0]), "device": d(self.t[1], now[1]), "cache": d(self.t[2], now[2]),
               "fuse_reads": d(self.t[3].get("read", 0), now[3].get("read", 0)) if now[3] is not None else None,
               "fuse_ops": ({k: v - self.t[3].get(k, 0) for k, v in now[3].items() if v != self.t[3].get(k, 0)}
                            if now[3] is not None else None),
               "daemon_cpu_s": d(self.t[4], now[4]),
               "background_cpu": self.cpu.background(),
               # drop_caches by someone else during the pass (we never drop during one): warm isn't warm
               "foreign_drops": d(self.drops, vmstat("drop_pagecache"))}
        if extra is not None and "readers_read_bytes" in extra:
            out["readers"] = extra["readers_read_bytes"]  # plain: the readers' own block reads
        return out


PASSES = ("storage_first", "storage_warm", "storage_decode", "storage_dropped")


def warm_up_decoder(root: str, workers: int) -> None:
    """One small untimed DataLoader run, so that the first timed decode epoch pays no start-up costs."""
    import torch
    from torchvision import transforms

    ds, _ = listing(root)
    ds.transform = transforms.Compose([transforms.RandomResizedCrop(224), transforms.ToTensor()])
    subset = torch.utils.data.Subset(ds, list(range(0, len(ds), max(1, len(ds) // 256))))
    for _ in torch.utils.data.DataLoader(subset, batch_size=64, num_workers=workers):
        pass


def one_round(method: Method, ctx, r: int) -> dict:
    out: dict = {"round": r}
    readers = ctx.args.readers
    out["quiet_before"] = wait_quiet(ctx.args.quiet_wait) if ctx.args.quiet_wait > 0 else None
    out["cold_ok"] = drop_caches()
    out["cached_after_drop"] = meminfo("Cached")
    t0 = time.perf_counter()
    m = method.mount()
    out["mount_s"] = time.perf_counter() - t0
    try:
        meter = Meter(m, ctx.dev)
        meter.start()
        ds, out["list_s"] = listing(m.root)
        out["files_listed"] = len(ds.samples)
        if len(ds.samples) != ctx.marker["src"]["files"]:
            raise RuntimeError(f"ImageFolder found {len(ds.samples)} files, expected {ctx.marker['src']['files']}")
        paths = [p for p, _ in ds.samples]
        out["cold"] = random_read(paths, readers, seed=r)
        out["storage_first"] = meter.stop(out["cold"])

        meter.start()
        out["warm"] = random_read(paths, readers, seed=100 + r)
        out["storage_warm"] = meter.stop(out["warm"])

        meter.start()
        out["decode"] = decode_epoch(ds, readers, seed=r)
        out["storage_decode"] = meter.stop()

        out["dropped_ok"] = drop_caches()
        meter.start()
        out["dropped"] = random_read(paths, readers, seed=200 + r)
        out["storage_dropped"] = meter.stop(out["dropped"])

        for key in ("cold", "warm", "dropped"):
            if out[key]["errors"] or out[key]["files"] != len(paths):
                raise RuntimeError(f"{key} read: {out[key]['errors']} errors, {out[key]['files']}/{len(paths)} files")
        out["rss_peak"] = m.peak_rss()
        st = m.stats()
        if st is not None:
            out["daemon_stats"] = st
    except Exception as exc:
        msg = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
        raise RuntimeError(f"{type(exc).__name__}: {msg} [{mount_diagnosis(m)}]") from exc
    finally:
        m.unmount()
    return out


def mount_diagnosis(m: Mount) -> str:
    """What became of a mount when a pass failed."""
    if m.mnt is None:
        return "no mount"
    mounted = os.path.ismount(m.mnt)
    if m.proc is not None:
        alive = m.proc.poll() is None
        status = "" if alive else f", exit status {m.proc.returncode}"
    else:
        alive, status = pid_alive(m.pid) if m.pid else False, ""
    if not mounted and alive:
        return "the mount was gone while its daemon still ran: unmounted by someone else?"
    if not alive:
        return f"the daemon had died{status}"
    return "mount and daemon still alive"


# ---------------------------------------------------------------------------------------------
# report


ROWS = [
    # key, label, format, show the ratio to plain
    ("rounds_used", "rounds the medians use", "{}", False),
    ("first_mount_s", "first mount s (builds index)", "{:.2f}", False),
    ("mount_s", "mount s (index exists, cold)", "{:.2f}", False),
    ("rss_mb", "peak daemon RSS MB (VmHWM)", "{:.0f}", False),
    ("list_s", "ImageFolder listing s (cold)", "{:.2f}", True),
    ("cold_fps", "cold read files/s (fresh mount)", "{:.0f}", True),
    ("cold_mbs", "cold read MB/s", "{:.0f}", True),
    ("warm_fps", "warm read files/s", "{:.0f}", True),
    ("warm_mbs", "warm read MB/s", "{:.0f}", True),
    ("dropped_fps", "re-read after drop_caches files/s", "{:.0f}", True),
    ("decode_ips", "decode epoch images/s", "{:.0f}", True),
    ("st_first", "storage 1st epoch (x shards)", "{:.3f}", False),
    ("st_warm", "storage warm read (x shards)", "{:.3f}", False),
    ("st_decode", "storage decode epoch (x shards)", "{:.3f}", False),
    ("st_dropped", "storage re-read after drop (x shards)", "{:.3f}", False),
    ("cache_first", "cache counter 1st epoch (x shards)", "{:.3f}", False),
    ("cache_later", "cache counter warm+decode (x shards)", "{:.3f}", False),
    ("cache_dropped", "cache counter after drop (x shards)", "{:.3f}", False),
    ("warm_fuse_reads", "daemon READs in warm pass", "{:.0f}", False),
    ("cpu_first", "daemon CPU s in 1st epoch", "{:.1f}", False),
    ("cpu_decode", "daemon CPU s in decode epoch", "{:.1f}", False),
    ("bg_cpu", "others' CPU share during passes %", "{:.0f}", False),
    ("foreign_drops", "others' drop_caches during passes", "{:.0f}", False),
]


def storage_of(rnd: dict, key: str, fuse: bool) -> float | None:
    s = rnd.get(key) or {}
    return s.get("daemon") if fuse else s.get("readers")


def polluted(rnd: dict, max_background: float) -> bool:
    """Other jobs took much CPU, or dropped the page cache, during one of the round's passes."""
    return any(rnd[k]["background_cpu"] > max_background or (rnd[k].get("foreign_drops") or 0) for k in PASSES)


def summarize(method: Method, all_rounds: list[dict], first_mount_s: float | None, dataset_bytes: int,
              max_background: float) -> dict:
    """Medians over the clean rounds (all rounds when none is clean); storage as a multiple of
    `dataset_bytes` (the tar shards' total)."""
    fuse = method.fuse
    passes = PASSES
    clean = [r for r in all_rounds if not polluted(r, max_background)]
    rounds = clean or all_rounds
    x = lambda v: None if v is None else v / dataset_bytes  # noqa: E731
    summ = {
        "rounds_used": f"{len(rounds)} {'clean' if clean else 'NOISY'} of {len(all_rounds)}",
        "first_mount_s": first_mount_s,
        "mount_s": median(r["mount_s"] for r in rounds) if fuse else None,
        "rss_mb": max((r["rss_peak"] for r in rounds if r.get("rss_peak")), default=None),
        "list_s": median(r["list_s"] for r in rounds),
        "cold_fps": median(r["cold"]["files_per_s"] for r in rounds),
        "cold_mbs": median(r["cold"]["mb_per_s"] for r in rounds),
        "warm_fps": median(r["warm"]["files_per_s"] for r in rounds),
        "warm_mbs": median(r["warm"]["mb_per_s"] for r in rounds),
        "dropped_fps": median(r["dropped"]["files_per_s"] for r in rounds),
        "decode_ips": median(r["decode"]["images_per_s"] for r in rounds),
        "st_first": x(median(storage_of(r, "storage_first", fuse) for r in rounds)),
        "st_warm": x(median(storage_of(r, "storage_warm", fuse) for r in rounds)),
        "st_decode": x(median(storage_of(r, "storage_decode", fuse) for r in rounds)),
        "st_dropped": x(median(storage_of(r, "storage_dropped", fuse) for r in rounds)),
        "cache_first": x(median(r["storage_first"].get("cache") for r in rounds)),
        "cache_later": x(median(
            (r["storage_warm"]["cache"] + r["storage_decode"]["cache"])
            if r["storage_warm"].get("cache") is not None else None for r in rounds)),
        "cache_dropped": x(median(r["storage_dropped"].get("cache") for r in rounds)),
        # worst rounds, for the storage targets
        "st_first_max": x(max((storage_of(r, "storage_first", fuse) or 0) for r in rounds)),
        "st_later_max": x(max(max(storage_of(r, "storage_warm", fuse) or 0, storage_of(r, "storage_decode", fuse) or 0)
                              for r in rounds)),
        "st_dropped_max": x(max((storage_of(r, "storage_dropped", fuse) or 0) for r in rounds)),
        "cache_first_max": x(max((r["storage_first"].get("cache") or 0) for r in rounds)),
        "cache_any_max": x(max((r[k].get("cache") or 0) for r in rounds for k in PASSES)),
        "device_first": x(median((r["storage_first"] or {}).get("device") for r in rounds)),
        "warm_fuse_reads": median(r["storage_warm"].get("fuse_reads") for r in rounds),
        "cpu_first": median(r["storage_first"].get("daemon_cpu_s") for r in rounds),
        "cpu_decode": median(r["storage_decode"].get("daemon_cpu_s") for r in rounds),
        "bg_cpu": 100 * median(r[k]["background_cpu"] for r in rounds for k in passes),
        "bg_cpu_max": 100 * max(r[k]["background_cpu"] for r in rounds for k in passes),
        "foreign_drops": sum(r[k].get("foreign_drops") or 0 for r in rounds for k in passes),
    }
    if summ["rss_mb"] is not None:
        summ["rss_mb"] /= 1e6
    return summ


def fmt_cell(value, fmt: str, base) -> str:
    if value is None:
        return "-"
    text = fmt.format(value)
    if base not in (None, 0) and value is not None:
        text += f" ({value / base:.2f}x)"
    return text


def print_table(names: list[str], summ: dict[str, dict]) -> None:
    width = 37
    colw = max(17, max(len(n) for n in names) + 2)
    print(f"{'figure (median of rounds)':<{width}}" + "".join(f"{n:>{colw}}" for n in names))
    print("-" * (width + colw * len(names)))
    for key, label, fmt, ratio in ROWS:
        if all(summ[n].get(key) is None for n in names):
            continue
        base = summ.get("plain", {}).get(key) if ratio else None
        cells = []
        for n in names:
            cells.append(fmt_cell(summ[n].get(key), fmt, None if n == "plain" else base))
        print(f"{label:<{width}}" + "".join(f"{c:>{colw}}" for c in cells))


def evaluate_targets(summ: dict[str, dict], methods: dict[str, Method], quarter_note: str | None) -> list[dict]:
    rows = []

    def add(target, method, value, rule, ok):  # noqa: PLR0913
        rows.append({"target": target, "method": method, "value": value, "rule": rule,
                     "result": "n/a" if ok is None else ("PASS" if ok else "FAIL")})

    plain = summ.get("plain")
    sq = summ.get("squashfuse_ll")
    for name in ("shardfs", "shardfs-quarter"):
        s = summ.get(name)
        if s is None:
            continue
        def vs(key, other):
            r = s[key] / other[key]
            return r, f"{s[key]:.0f}/{other[key]:.0f} = {r:.2f}x"

        if plain:
            r, v = vs("decode_ips", plain)
            add("decode epoch images/s >= 0.95x plain", name, v, ">= 0.95x", r >= 0.95)
            r, v = vs("warm_fps", plain)
            add("warm random read files/s >= 0.3x plain", name, v, ">= 0.30x", r >= 0.3)
        if sq:
            r, v = vs("warm_fps", sq)
            add("warm random read files/s >= squashfuse_ll", name, v, ">= 1.00x", r >= 1.0)
        if plain:
            r, v = vs("cold_fps", plain)
            add("cold 1st epoch files/s (fresh mount) >= 0.7x plain", name, v, ">= 0.70x", r >= 0.7)
        if sq:
            r, v = vs("cold_fps", sq)
            add("cold 1st epoch files/s (fresh mount) > squashfuse_ll", name, v, "> 1.00x", r > 1.0)
    s = summ.get("shardfs")
    if s is not None:
        v = s["st_first_max"]
        add("storage 1st epoch <= 1.05x shards (full budget)", "shardfs",
            f"{v:.3f}x (cache {s['cache_first_max']:.3f}x)", "<= 1.05x", v <= 1.05)
        v = s["st_later_max"]
        add("storage later epochs ~0 (warm read, decode)", "shardfs", f"{v:.3f}x",
            f"<= {LATER_EPOCH_ZERO}x", v <= LATER_EPOCH_ZERO)
        v = s["st_dropped_max"]
        add("storage later epoch ~0 after drop_caches (daemon cache)", "shardfs", f"{v:.3f}x",
            f"<= {LATER_EPOCH_ZERO}x", v <= LATER_EPOCH_ZERO)
    s = summ.get("shardfs-quarter")
    if s is not None:
        v = max(s["st_first_max"], s["st_later_max"], s["st_dropped_max"])
        add("storage per epoch <= 1.0x shards (quarter budget)", "shardfs-quarter",
            f"{v:.3f}x (cache {s['cache_any_max']:.3f}x)", "<= 1.00x",
            v <= 1.0)
    elif quarter_note:
        add("storage per epoch <= 1.0x shards (quarter budget)", "shardfs-quarter", quarter_note, "<= 1.00x", None)
    return rows


def page_reporting_order() -> str:
    try:
        with open(PAGE_REPORTING) as f:
            return f.read().strip()
    except OSError:
        return "absent"


def stop_free_page_reporting() -> None:
    """Turn a VM's free page reporting off for this run (restored at exit) and back the free memory.

    With it on, the guest hands freed memory back to the host, and the first touch of each such
    page faults on the host, charged to the guest CPU that touches it. A FUSE daemon fills its
    cache and the kernel copies every reply into fresh page-cache pages on the guest's CPUs,
    while a plain directory's page cache is filled by the disk's DMA, whose faults the host pays
    on its own threads: the cold figures then measure the hypervisor (measured on the CI VM:
    the same shardfs pass took 2.0 s of daemon CPU with reporting off, 4.5-11 s with it on)."""
    old = page_reporting_order()
    if old == "absent":
        print("free page reporting: not present on this machine")
        return
    with open(PAGE_REPORTING, "w") as f:
        f.write(str(NO_REPORTING_ORDER))
    atexit.register(_restore_page_reporting, old, os.getpid())
    # Memory reported before now stays unbacked until touched: touch most of it once.
    size = max(0, min(meminfo("MemAvailable") - (4 << 30), 16 << 30))
    t0 = time.perf_counter()
    buf = mmap.mmap(-1, size) if size else None
    for i in range(0, size, mmap.PAGESIZE):
        buf[i] = 1
    if buf is not None:
        buf.close()
    print(f"free page reporting: off for this run (order {old} -> {NO_REPORTING_ORDER}, restored at exit); "
          f"{size / 2**30:.1f} GiB of free memory backed in {time.perf_counter() - t0:.1f} s")


def _restore_page_reporting(old: str, owner: int) -> None:
    if os.getpid() != owner:  # a forked helper exiting
        return
    with open(PAGE_REPORTING, "w") as f:
        f.write(old)


def machine_facts(work: str) -> dict:
    facts = {
        "nproc": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)),
        "ram_gb": round(meminfo("MemTotal") / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "root": os.geteuid() == 0,
        "free_page_reporting_order": page_reporting_order(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            facts["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    except OSError:
        pass
    done = run(["findmnt", "-n", "-o", "SOURCE,FSTYPE", "-T", work])
    facts["workdir_fs"] = done.stdout.strip()
    try:
        import PIL
        import torch
        import torchvision

        facts["torch"], facts["torchvision"], facts["pillow"] = torch.__version__, torchvision.__version__, PIL.__version__
    except ImportError:
        pass
    for tool, cmd in (("squashfuse", ["squashfuse_ll", "--version"]), ("fusermount3", ["fusermount3", "--version"])):
        if shutil.which(cmd[0]):
            d = run(cmd)
            lines = [ln for ln in (d.stdout + d.stderr).splitlines() if ln.startswith(tool)]
            facts[tool] = lines[0].strip() if lines else "?"
    try:
        from importlib.metadata import version

        facts["ratarmount"] = version("ratarmount")
        facts["mfusepy"] = version("mfusepy")
    except Exception:  # noqa: BLE001
        pass
    return facts


def code_state() -> dict:
    """Which shardfs code the mounts run: commit, uncommitted files, a digest of shardfs/ now."""
    import hashlib

    h = hashlib.sha256()
    pkg = os.path.join(REPO, "shardfs")
    for d, _dirs, names in sorted(os.walk(pkg)):
        for n in sorted(names):
            if n.endswith(".py"):
                with open(os.path.join(d, n), "rb") as f:
                    h.update(n.encode() + f.read())
    commit = run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"]).stdout.strip()
    dirty = run(["git", "-C", REPO, "status", "--porcelain", "--", "shardfs"]).stdout.split("\n")
    return {"commit": commit or "?", "uncommitted": [ln[3:] for ln in dirty if ln.strip()],
            "digest": h.hexdigest()[:12]}


class Ctx:
    pass


_WORK: list[str] = []  # the workdir, once known: main() cleans its mountpoints on the way out


def cleanup_mountpoints() -> None:
    """Unmount whatever is still mounted on our own mountpoints (an interrupted run)."""
    for work in _WORK:
        top = os.path.join(work, "mnt")
        for name in sorted(os.listdir(top)) if os.path.isdir(top) else []:
            mnt = os.path.join(top, name)
            if is_mounted_or_stale(mnt):
                print(f"cleanup: unmounting {mnt}", file=sys.stderr)
                if not fusermount(mnt):
                    fusermount(mnt, lazy=True)


def main() -> int:
    try:
        return _main()
    finally:
        cleanup_mountpoints()


def _main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="/tmp/shardfs-bench", help="dataset, shards, mountpoints, logs")
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--side", default="auto", help="JPEG side in pixels (auto: tuned for ~110 KB)")
    parser.add_argument("--shard-size", type=parse_size, default=parse_size("256M"))
    parser.add_argument("--readers", type=int, default=2, help="reader processes and DataLoader workers")
    parser.add_argument("--epochs", type=int, default=3, help="rounds per method (figures are medians)")
    parser.add_argument("--methods", default="plain,shardfs,shardfs-quarter,ratarmount,squashfuse_ll")
    parser.add_argument("--cache-size", default=None,
                        help="shardfs --cache-size for the `shardfs` method (default: the daemon's default)")
    parser.add_argument("--prefetch", default=None, help="shardfs --prefetch (touched|all); default: daemon's")
    parser.add_argument("--quiet-wait", type=float, default=60.0,
                        help="before each round wait up to this many s for other jobs' CPU use to drop below 15%% "
                             "(0: do not wait)")
    parser.add_argument("--retries", type=int, default=1,
                        help="redo a method's round (up to this many times) when other processes took more than "
                             "--max-background of the CPU during one of its passes")
    parser.add_argument("--max-background", type=float, default=0.25, help="see --retries (share, 0..1)")
    parser.add_argument("--rebuild", action="store_true", help="remake the dataset even if the marker matches")
    parser.add_argument("--json", help="also write everything as JSON here")
    parser.add_argument("--free-page-reporting", choices=["keep", "off"], default="keep",
                        help="off: turn a VM's free page reporting off for the run (root; restored at exit), "
                             "see stop_free_page_reporting")
    args = parser.parse_args()

    main_pid = os.getpid()

    def on_term(signum, _frame):
        if os.getpid() != main_pid:  # a forked helper (pool, reader, DataLoader worker): just go
            os._exit(128 + signum)
        raise KeyboardInterrupt(f"signal {signum}")  # the main process: unmount in `finally`, report

    signal.signal(signal.SIGTERM, on_term)

    cmdline = " ".join([os.path.relpath(sys.argv[0]) if sys.argv[0] else "bench.py", *sys.argv[1:]])
    work = os.path.abspath(args.workdir)
    _WORK.append(work)
    os.makedirs(os.path.join(work, "logs"), exist_ok=True)
    facts = machine_facts(work)
    if args.free_page_reporting == "off":
        stop_free_page_reporting()
    code0 = code_state()
    print(f"command: python3 {cmdline}")
    print("machine: " + ", ".join(f"{k}={v}" for k, v in facts.items()))
    print(f"shardfs code: commit {code0['commit']}, uncommitted {code0['uncommitted'] or 'none'}, "
          f"digest {code0['digest']}")

    ctx = Ctx()
    ctx.args, ctx.work, ctx.marker_dir = args, work, work
    ctx.marker = build_dataset(args, work)
    ctx.shards = ctx.marker["shards"]["paths"]
    ctx.dev = BlockDev(work)
    src, sh, sq = ctx.marker["src"], ctx.marker["shards"], ctx.marker.get("squashfs") or {}
    dataset_bytes = sh["tar_bytes"]  # storage figures are multiples of what the shards hold
    print(f"dataset: {src['files']} JPEGs in {args.classes} classes, side {src['side']}, "
          f"mean {src['mean_jpeg_bytes'] / 1e3:.1f} KB, {src['image_bytes'] / 1e9:.3f} GB of images; "
          f"{len(ctx.shards)} tar shards {dataset_bytes / 1e9:.3f} GB ({sh['packer']}); "
          + (f"squashfs {sq['bytes'] / 1e9:.3f} GB (mksquashfs {sq['seconds']:.0f} s)" if sq else "no squashfs"))

    mhelp = run([sys.executable, "-m", "shardfs", "mount", "--help"], cwd=REPO).stdout
    ctx.mount_help = {"--cache-size": "--cache-size" in mhelp, "--prefetch": "--prefetch" in mhelp}
    print("shardfs mount options: " + ", ".join(f"{k} {'present' if v else 'ABSENT'}"
                                              for k, v in ctx.mount_help.items()))

    quarter = f"{max(1, dataset_bytes // 4 >> 20)}M"
    wanted = [m.strip() for m in args.methods.split(",") if m.strip()]
    methods: dict[str, Method] = {}
    notes: dict[str, str] = {}
    quarter_note = None
    for name in wanted:
        if name == "plain":
            methods[name] = Plain(ctx)
        elif name == "shardfs":
            methods[name] = ShardFS(ctx, args.cache_size, "shardfs")
        elif name == "shardfs-quarter":
            if not ctx.mount_help["--cache-size"]:
                quarter_note = "skipped: shardfs mount has no --cache-size"
                notes[name] = quarter_note
                continue
            methods[name] = ShardFS(ctx, quarter, "shardfs-quarter")
        elif name == "ratarmount":
            methods[name] = Ratarmount(ctx)
        elif name == "squashfuse_ll":
            methods[name] = Squashfuse(ctx)
        else:
            parser.error(f"unknown method {name}")
        why = methods[name].available()
        if why:
            notes[name] = f"skipped: {why}"
            del methods[name]
    for name, note in notes.items():
        print(f"{name}: {note}")
    for name, m in methods.items():
        if isinstance(m, ShardFS):
            print(f"{name}: shardfs mount options {m.options() or '(none)'}")

    all_methods = dict(methods)
    # first mounts: indexes built from scratch, cold cache
    first_mount: dict[str, float | None] = {}
    failed: dict[str, str] = {}
    for name, meth in methods.items():
        if not meth.fuse:
            first_mount[name] = None
            continue
        meth.prepare_first()
        drop_caches()
        t0 = time.perf_counter()
        try:
            mnt = meth.mount()
        except Exception as exc:  # noqa: BLE001
            failed[name] = f"first mount failed: {exc}"
            print(f"{name}: {failed[name]}")
            continue
        first_mount[name] = time.perf_counter() - t0
        mnt.unmount()
        print(f"{name}: first mount (builds index) {first_mount[name]:.2f} s", flush=True)
    for name in failed:
        methods.pop(name)

    warm_up_decoder(os.path.join(work, "src", "train"), args.readers)
    rounds: dict[str, list[dict]] = {n: [] for n in methods}
    discarded: dict[str, list[dict]] = {}
    cold_ok = True
    cached_after = []
    started = time.perf_counter()
    try:
        for r in range(args.epochs):
            order = list(methods.items())
            order = order[r % len(order):] + order[:r % len(order)]  # nobody always goes first
            for name, meth in order:
                t0 = time.perf_counter()
                res, errors = None, []
                for attempt in range(args.retries + 1):
                    try:
                        res = one_round(meth, ctx, r)
                    except Exception as exc:  # noqa: BLE001
                        # e.g. someone else's cleanup unmounted our mount mid-pass: try again
                        first_line = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
                        errors.append(f"{type(exc).__name__}: {first_line}")
                        print(f"round {r + 1}/{args.epochs} {name:<16} attempt {attempt + 1} failed: {errors[-1]}",
                              flush=True)
                        res = None
                        continue
                    res["attempt"] = attempt
                    busy = max(res[k]["background_cpu"] for k in PASSES)
                    drops = sum(res[k]["foreign_drops"] or 0 for k in PASSES)
                    res["polluted"] = polluted(res, args.max_background)
                    if not res["polluted"] or attempt == args.retries:
                        break
                    discarded.setdefault(name, []).append(res)
                    print(f"round {r + 1}/{args.epochs} {name:<16} others took {100 * busy:.0f}% of the CPU"
                          f"{f' and dropped the page cache {drops} times' if drops else ''}: redoing it",
                          flush=True)
                if res is None:
                    failed[name] = f"round {r + 1} failed {len(errors)} times: {'; '.join(errors)}"
                    print(f"{name}: {failed[name]}; dropping it from the run", flush=True)
                    methods.pop(name, None)
                    continue
                if errors:
                    res["errors_before"] = errors
                rounds[name].append(res)
                cold_ok &= res["cold_ok"] and res["dropped_ok"]
                cached_after.append(res["cached_after_drop"])
                print(f"round {r + 1}/{args.epochs} {name:<16} mount {res['mount_s']:.2f} s, list {res['list_s']:.2f} s, "
                      f"cold {res['cold']['files_per_s']:.0f} f/s, warm {res['warm']['files_per_s']:.0f} f/s, "
                      f"decode {res['decode']['images_per_s']:.0f} img/s, dropped {res['dropped']['files_per_s']:.0f} f/s; "
                      f"others' CPU {100 * max(res[k]['background_cpu'] for k in PASSES):.0f}% max, "
                      f"others' drop_caches {sum(res[k]['foreign_drops'] or 0 for k in PASSES)} "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
    except KeyboardInterrupt:
        print("interrupted: reporting what was measured", file=sys.stderr)
    total_s = time.perf_counter() - started

    names = [n for n in rounds if rounds[n]]
    summ = {n: summarize(all_methods[n], rounds[n], first_mount.get(n), dataset_bytes, args.max_background)
            for n in names}
    print()
    cold_text = (f"yes (root; sync + drop_caches before every fresh mount; page cache after drop "
                 f"<= {max(cached_after, default=0) / 1e6:.0f} MB)" if cold_ok
                 else "NO: drop_caches failed (not root?), cold figures are NOT cold")
    done_rounds = ", ".join(f"{n} {len(rounds[n])}" for n in names)
    print(f"results: rounds measured ({done_rounds}) of {args.epochs} in {total_s / 60:.1f} min; "
          f"readers={args.readers}; "
          f"cold figures really cold: {cold_text}")
    print(f"storage figures: bytes read from storage per pass / the tar shards' {dataset_bytes / 1e9:.3f} GB "
          f"(JPEGs alone: {src['image_bytes'] / 1e9:.3f} GB); read_bytes of the daemon (/proc/PID/io) for "
          f"FUSE methods, of the reader processes for plain (its decode epoch: not measured); 'cache counter' is "
          f"shardfs's own storage_bytes_read")
    code1 = code_state()
    if code1["digest"] != code0["digest"]:
        print(f"WARNING: shardfs/ changed during the run (digest {code0['digest']} -> {code1['digest']}, "
              f"commit {code1['commit']}): later mounts ran newer code than earlier ones")
    print("medians use the clean rounds of each method (no other job above --max-background CPU, no foreign "
          "drop_caches) when there is one; see 'rounds the medians use'")
    bg = max((s["bg_cpu_max"] for s in summ.values()), default=0)
    if bg > 10:
        print(f"WARNING: other processes took up to {bg:.0f}% of the machine's CPU during some passes: "
              f"figures are noisy (see the 'others' CPU' row and the per-round lines)")
    drops = sum(s["foreign_drops"] for s in summ.values())
    if drops:
        print(f"WARNING: someone else dropped the page cache {drops} times during measured passes: "
              f"some 'warm' figures were not warm (see the per-round lines)")
    print()
    print_table(names, summ)
    print()
    for n in names:
        st = rounds[n][-1].get("daemon_stats") or {}
        if isinstance(st.get("cache"), dict):
            print(f"{n} cache (last round, at unmount): " + ", ".join(f"{k}={v}" for k, v in sorted(st["cache"].items())))
    targets = evaluate_targets(summ, methods, quarter_note)
    print()
    print(f"{'target (' + str(args.readers) + ' readers, ' + str(facts['nproc']) + ' cores)':<56}{'method':<17}"
          f"{'value':>22}  {'rule':<10}result")
    print("-" * 112)
    for t in targets:
        print(f"{t['target']:<56}{t['method']:<17}{t['value']:>22}  {t['rule']:<10}{t['result']}")
    for n, why in {**notes, **failed}.items():
        print(f"note: {n}: {why}")

    if args.json:
        out = {
            "command": f"python3 {cmdline}",
            "machine": facts,
            "shardfs_code": {"start": code0, "end": code1},
            "dataset": {k: v for k, v in ctx.marker.items()},
            "cold_really_cold": cold_ok,
            "shardfs_mount_options": ctx.mount_help,
            "summary": summ,
            "targets": targets,
            "notes": {**notes, **failed},
            "rounds": rounds,
            "discarded_rounds": discarded,
        }
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
