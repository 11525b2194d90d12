#!/usr/bin/env python3
"""shardfs at ImageNet scale of member count: a by-hand benchmark (not a test).

Generates (or reuses) N tiny files with ImageNet-like paths, written both as tar shards and as a
plain directory, then measures through the real CLI:

* first mount (indexes built) and remount (indexes loaded) times, medians of --repeat runs;
* the daemon's RSS after each (VmRSS / VmHWM from /proc/PID/status), minus the RSS of a daemon
  mounting a tiny dataset, per member; and the tree's own array bytes per member (in-process);
* ``shardfs index --rebuild`` time with its default workers;
* a random-order read of every file (open/read/close) by --readers processes: the plain
  directory vs the shardfs mount, cold (page cache dropped, fresh mount) and warm (second pass).

Prints a markdown table at the end. Run as root so the page cache can be dropped::

    python3 tools/bench_scale.py                 # 1,000,000 files in 100 shards (15-30 min on 2 cores)
    python3 tools/bench_scale.py --files 20000 --shards 10 --workdir /tmp/shardfs-bench-scale-small

The dataset stays in --workdir (default /tmp/shardfs-bench-scale: ~1.2 GB of tar + 1M small files)
and is reused by the next run with the same parameters; an interrupted generation resumes.

Other processes that drop the page cache (other benchmarks) spoil warm figures: every timed phase
records such drops (/proc/vmstat drop_pagecache minus ours) and the load average, the table says
DISTURBED where it happened, a disturbed cold+warm read pair is redone (--retries), and
--quiet-wait S waits for S quiet seconds before each phase. Mounts are always undone (also on
SIGTERM / Ctrl-C); processes are only ever signalled by the pid this run started.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from shardfs.service.mount import is_stale as _stale, process_alive as alive  # noqa: E402

STATS_XATTR = "user.shardfs.fuse.stats"
GEN_VERSION = 1
POOL_BYTES = 1 << 22
MTIME = 1_600_000_000
JPEG_MAGIC = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# The dataset: member k (class-major order) is train/n{c:08d}/n{c:08d}_{j}.JPEG, in shard k % S.
# Sizes and contents come from a seeded generator, so the tar and plain passes write the same bytes.
# ---------------------------------------------------------------------------------------------


class Layout:
    def __init__(self, files: int, classes: int, shards: int, seed: int, min_size: int, max_size: int):
        self.files, self.classes, self.shards = files, classes, shards
        counts = np.full(classes, files // classes, dtype=np.int64)
        counts[: files % classes] += 1
        self.class_start = np.concatenate([[0], np.cumsum(counts)])
        self.cls = np.repeat(np.arange(classes, dtype=np.int64), counts)
        self.idx = np.arange(files, dtype=np.int64) - self.class_start[self.cls]
        rng = np.random.default_rng(seed)
        self.sizes = rng.integers(min_size, max_size + 1, files, dtype=np.int64)
        self.starts = rng.integers(0, POOL_BYTES - max_size, files, dtype=np.int64)
        self.pool = rng.bytes(POOL_BYTES)

    def name(self, k: int) -> str:
        c = int(self.cls[k])
        return "train/n%08d/n%08d_%d.JPEG" % (c, c, int(self.idx[k]))

    def data(self, k: int) -> bytes:
        s = int(self.starts[k])
        return JPEG_MAGIC + self.pool[s : s + int(self.sizes[k]) - len(JPEG_MAGIC)]

    def total_bytes(self) -> int:
        return int(self.sizes.sum())


_LAYOUT: Layout | None = None  # set before forking the generation workers

# ustar header: name[0:100] | mode uid gid [100:124] | size [124:136] | mtime [136:148] |
# chksum [148:156] | typeflag, linkname, magic, version, uname, gname, dev, prefix, pad [156:512]
_H_A = b"0000644\0" + b"0000000\0" + b"0000000\0"
_H_B = b"%011o\0" % MTIME
_H_C = (b"0" + b"\0" * 100 + b"ustar\0" + b"00" + b"root".ljust(32, b"\0") + b"root".ljust(32, b"\0")
        + b"0000000\0" * 2 + b"\0" * 155 + b"\0" * 12)
assert len(_H_C) == 356
_H_CONST = sum(_H_A) + sum(_H_B) + sum(_H_C) + 8 * 32
_ZEROS = b"\0" * 1024


def _tar_member(name: bytes, data: bytes) -> bytes:
    size_f = b"%011o\0" % len(data)
    chk = _H_CONST + sum(name) + sum(size_f)
    header = name.ljust(100, b"\0") + _H_A + size_f + _H_B + (b"%06o\0 " % chk) + _H_C
    return header + data + _ZEROS[: -len(data) % 512]


def _write_shard(job: tuple[int, str]) -> int:
    s, path = job
    lay = _LAYOUT
    tmp = path + ".tmp"
    chunks, pending = [], 0
    with open(tmp, "wb") as out:
        for k in range(s, lay.files, lay.shards):
            chunks.append(_tar_member(lay.name(k).encode(), lay.data(k)))
            pending += 1
            if pending == 4096:
                out.write(b"".join(chunks))
                chunks, pending = [], 0
        chunks.append(_ZEROS)
        out.write(b"".join(chunks))
    os.replace(tmp, path)
    return s


def _write_class(job: tuple[int, str]) -> int:
    c, top = job
    lay = _LAYOUT
    final = os.path.join(top, "n%08d" % c)
    tmp = os.path.join(top, ".tmp-n%08d" % c)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    for k in range(int(lay.class_start[c]), int(lay.class_start[c + 1])):
        fd = os.open(os.path.join(tmp, os.path.basename(lay.name(k))), flags, 0o644)
        try:
            os.write(fd, lay.data(k))
        finally:
            os.close(fd)
    os.rename(tmp, final)
    return c


def _run_jobs(fn, jobs, workers: int, what: str) -> None:
    if not jobs:
        return
    step = max(1, len(jobs) // 10)
    ctx = mp.get_context("fork")
    with ctx.Pool(workers) as pool:
        for n, _ in enumerate(pool.imap_unordered(fn, jobs, chunksize=1), 1):
            if n % step == 0 or n == len(jobs):
                log(f"  {what}: {n}/{len(jobs)}")


def _load_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _save_json(path: str, data) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(path + ".tmp", path)


def ensure_part(part: str, root: str, params: dict, lay: Layout, workers: int) -> dict:
    """Write the tar shards (part="shards") or the plain tree (part="plain") unless a marker with the
    same parameters says it is done; resumes a run that was interrupted (finished shards / class
    folders are renamed into place, so they are complete)."""
    global _LAYOUT
    done_marker, started_marker = root + ".done.json", root + ".params.json"
    done = _load_json(done_marker)
    if done and done.get("params") == params:
        return {**done, "reused": True}
    if _load_json(started_marker) != params:
        shutil.rmtree(root, ignore_errors=True)
        if os.path.exists(done_marker):
            os.unlink(done_marker)
    os.makedirs(root, exist_ok=True)
    _save_json(started_marker, params)
    _LAYOUT = lay
    t = time.perf_counter()
    if part == "shards":
        jobs = [(s, os.path.join(root, "train-%06d.tar" % s)) for s in range(lay.shards)]
        resumed = len(jobs) - len(todo := [j for j in jobs if not os.path.exists(j[1])])
        _run_jobs(_write_shard, todo, workers, "tar shards written")
    else:
        top = os.path.join(root, "train")
        os.makedirs(top, exist_ok=True)
        jobs = [(c, top) for c in range(lay.classes)]
        resumed = len(jobs) - len(todo := [j for j in jobs if not os.path.isdir(os.path.join(top, "n%08d" % j[0]))])
        _run_jobs(_write_class, todo, workers, "plain class folders written")
    seconds = time.perf_counter() - t
    subprocess.run(["sync"])
    seconds_synced = time.perf_counter() - t
    result = {"params": params, "seconds": round(seconds, 2), "seconds_with_sync": round(seconds_synced, 2),
              "resumed_units": resumed, "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    _save_json(done_marker, result)
    return {**result, "reused": False}


def generate(workdir: str, name: str, files: int, shards: int, classes: int, seed: int, min_size: int,
             max_size: int, workers: int, plain: bool = True) -> tuple[Layout, dict]:
    lay = Layout(files, classes, shards, seed, min_size, max_size)
    params = {"version": GEN_VERSION, "files": files, "shards": shards, "classes": classes, "seed": seed,
              "min_size": min_size, "max_size": max_size}
    info = {"shards": ensure_part("shards", os.path.join(workdir, name, "shards"), params, lay, workers)}
    if plain:
        info["plain"] = ensure_part("plain", os.path.join(workdir, name, "plain"), params, lay, workers)
    return lay, info


# ---------------------------------------------------------------------------------------------
# The system: page cache, processes, the CLI.
# ---------------------------------------------------------------------------------------------


_OWN_DROPS = 0


def drop_caches() -> bool:
    global _OWN_DROPS
    subprocess.run(["sync"])
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        _OWN_DROPS += 1
        return True
    except OSError:
        return False


def system_drops() -> int:
    """Page-cache drops since boot, by anyone (/proc/vmstat drop_pagecache)."""
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("drop_pagecache "):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Disturbance:
    """What else happened on the machine during a timed phase: page-cache drops by other processes
    (which empty the kernel caches a warm figure relies on) and the load average."""

    def __init__(self):
        self.drops0, self.own0 = system_drops(), _OWN_DROPS
        self.load0 = os.getloadavg()[0]

    def done(self) -> dict:
        foreign = (system_drops() - self.drops0) - (_OWN_DROPS - self.own0)
        return {"foreign_drops": foreign, "load1_start": round(self.load0, 2),
                "load1_end": round(os.getloadavg()[0], 2)}


def wait_quiet(seconds: float, limit: float = 300) -> None:
    """Wait (at most ``limit``) until nobody else has dropped the page cache for ``seconds``."""
    if seconds <= 0:
        return
    deadline, last, since = time.monotonic() + limit, system_drops(), time.monotonic()
    while time.monotonic() - since < seconds and time.monotonic() < deadline:
        time.sleep(1)
        now = system_drops()
        if now != last:
            last, since = now, time.monotonic()
    if time.monotonic() >= deadline:
        log(f"  machine not quiet after {limit:.0f} s of waiting; going on")


def disturbed(results: list[dict]) -> str:
    n = sum(r.get("disturbance", {}).get("foreign_drops", 0) for r in results)
    loads = [r["disturbance"]["load1_start"] for r in results if "disturbance" in r]
    out = f"; load avg {max(loads):.1f}" if loads else ""
    return out + (f"; DISTURBED: {n} page-cache drops by other processes during these runs" if n else "")


def proc_status(pid: int) -> dict:
    """VmRSS, VmHWM (bytes) and CPU seconds of a process."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    out["cpu_s"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out



def shardfs(*args: str, timeout: float = 7200) -> subprocess.CompletedProcess:
    # Own session: a Ctrl-C on the terminal must not kill a `shardfs mount` whose daemon goes on
    # to mount behind our back; we get the signal and unmount in order (see _Signals).
    return subprocess.run([sys.executable, "-m", "shardfs", *args], capture_output=True, text=True, timeout=timeout,
                          start_new_session=True)


class _Signals:
    """SIGTERM/SIGINT end the run through ``finally`` (which unmounts); during a mount command they
    wait until the mount is recorded, so that no mount is left behind."""

    critical = 0
    pending: int | None = None

    @classmethod
    def install(cls) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, cls._handler)

    @classmethod
    def _handler(cls, signum, _frame) -> None:
        if cls.critical:
            cls.pending = signum
            return
        cls._raise(signum)

    @staticmethod
    def _raise(signum: int) -> None:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    def __enter__(self):
        _Signals.critical += 1

    def __exit__(self, *exc) -> None:
        _Signals.critical -= 1
        if not _Signals.critical and _Signals.pending is not None:
            signum, _Signals.pending = _Signals.pending, None
            self._raise(signum)


def mount_stats(mnt: str) -> dict:
    return json.loads(os.getxattr(mnt, STATS_XATTR))


class Mounts:
    """Mounts through the real CLI; ``close`` (called in ``finally``) unmounts whatever is left."""

    def __init__(self, log_dir: str, extra_args: list[str]):
        self.log_dir, self.extra_args = log_dir, extra_args
        self.live: dict[str, int | None] = {}  # mountpoint -> daemon pid

    def mount(self, src: str, mnt: str, tag: str, index_dir: str) -> dict:
        os.makedirs(mnt, exist_ok=True)
        if os.path.ismount(mnt) or _stale(mnt):
            log(f"{mnt} is still mounted (an earlier run?): unmounting it first")
            self.unmount(mnt)
        log_file = os.path.join(self.log_dir, f"{tag}.log")
        with _Signals():
            self.live[mnt] = None  # from now on `close` looks at it, even if the command fails
            t = time.perf_counter()
            done = shardfs("mount", src, mnt, "--index-dir", index_dir, "--log-file", log_file, *self.extra_args)
            seconds = time.perf_counter() - t
            if done.returncode != 0:
                raise RuntimeError(f"shardfs mount failed ({done.returncode}): {done.stdout}{done.stderr}\n"
                                   f"log: {log_file}")
            stats = mount_stats(mnt)
            self.live[mnt] = pid = stats["pid"]
            proc = proc_status(pid)
        return {"seconds": seconds, "pid": pid, "stats": stats, "proc": proc, "log": log_file}

    def unmount(self, mnt: str) -> float:
        pid = self.live.pop(mnt, None)
        if not pid and not os.path.ismount(mnt) and not _stale(mnt):
            return 0.0  # a mount command that failed before mounting
        if not pid:
            try:
                pid = mount_stats(mnt)["pid"]
            except (OSError, ValueError, KeyError):
                pass
        t = time.perf_counter()
        done = shardfs("umount", mnt, timeout=120)
        seconds = time.perf_counter() - t
        if done.returncode != 0 or os.path.ismount(mnt) or _stale(mnt):
            log(f"shardfs umount {mnt} failed ({done.returncode}: {done.stderr.strip()}); fusermount3 -u -z")
            subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True)
        if pid:
            deadline = time.monotonic() + 30
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if alive(pid):
                log(f"daemon {pid} still alive 30 s after unmount: SIGTERM to it")
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        return seconds

    def close(self) -> None:
        for mnt in list(self.live):
            try:
                self.unmount(mnt)
            except Exception as exc:  # keep cleaning up the others
                log(f"cleanup of {mnt}: {exc}")
                subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True)



def remove_indexes(shard_dir: str, index_dir: str) -> int:
    n = 0
    for d in (shard_dir, index_dir):
        if os.path.isdir(d):
            for name in os.listdir(d):
                if name.endswith(".shardfs-idx"):
                    os.unlink(os.path.join(d, name))
                    n += 1
    return n


# ---------------------------------------------------------------------------------------------
# Random-order reads of every file by several processes.
# ---------------------------------------------------------------------------------------------

_READ_PATHS: list[str] | None = None  # set before forking the readers


def _reader(root: str, start: int, end: int, barrier, results) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):  # die quietly; the parent cleans up
        signal.signal(sig, signal.SIG_DFL)
    paths = [root + "/" + p for p in _READ_PATHS[start:end]]
    nbytes = errors = 0
    first_error = None
    barrier.wait()
    t0 = time.monotonic()
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
            try:
                while True:
                    b = os.read(fd, 1 << 20)
                    if not b:
                        break
                    nbytes += len(b)
            finally:
                os.close(fd)
        except OSError as exc:
            errors += 1
            first_error = first_error or f"{p}: {exc}"
    results.put((t0, time.monotonic(), end - start, nbytes, errors, first_error))


def read_all(root: str, lay: Layout, readers: int, seed: int) -> dict:
    order = np.random.default_rng(seed).permutation(lay.files)
    return read_paths(root, [lay.name(int(k)) for k in order], lay.total_bytes(), readers)


def read_paths(root: str, rels: list[str], expected: int, readers: int) -> dict:
    """Every file of ``rels`` (relative to root) read once in that order, split among ``readers``
    processes; ``expected``: the bytes they should give."""
    global _READ_PATHS
    dist = Disturbance()
    _READ_PATHS = rels
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(readers + 1), ctx.Queue()
    bounds = np.linspace(0, len(rels), readers + 1).astype(int)
    procs = [ctx.Process(target=_reader, args=(root, int(bounds[i]), int(bounds[i + 1]), barrier, results))
             for i in range(readers)]
    for p in procs:
        p.start()
    try:
        barrier.wait(timeout=600)
        start = time.monotonic()
        got = [results.get() for _ in procs]
        end = max(g[1] for g in got)
    finally:
        for p in procs:
            p.join()
        _READ_PATHS = None
    files = sum(g[2] for g in got)
    nbytes = sum(g[3] for g in got)
    errors = sum(g[4] for g in got)
    seconds = end - start
    out = {"seconds": seconds, "files": files, "files_per_s": files / seconds, "mb_per_s": nbytes / seconds / 1e6,
           "bytes": nbytes, "errors": errors, "first_error": next((g[5] for g in got if g[5]), None),
           "bytes_ok": nbytes == expected, "disturbance": dist.done()}
    if out["disturbance"]["foreign_drops"]:
        log(f"  WARNING: {out['disturbance']['foreign_drops']} page-cache drops by other processes during this pass")
    if errors or not out["bytes_ok"]:
        log(f"  WARNING: {errors} errors, {nbytes} bytes read, {expected} expected; "
            f"first error: {out['first_error']}")
    return out


def verify_sample(mnt: str, plain: str, lay: Layout, count: int, seed: int) -> int:
    """Files of the mount that differ from the plain copy, among ``count`` random ones."""
    bad = 0
    for k in np.random.default_rng(seed).choice(lay.files, size=min(count, lay.files), replace=False):
        rel = lay.name(int(k))
        with open(os.path.join(mnt, rel), "rb") as a, open(os.path.join(plain, rel), "rb") as b:
            if a.read() != b.read():
                bad += 1
    return bad


# ---------------------------------------------------------------------------------------------
# Figures.
# ---------------------------------------------------------------------------------------------

TREE_ARRAYS = ("name_end", "kind", "offset", "size", "mode", "mtime", "shard", "lookup_hash", "lookup_id",
               "listing", "listing_start")


def tree_array_bytes(shard_dir: str, index_dir: str) -> dict:
    """Open the dataset in this process (indexes are current) and measure the tree's arrays."""
    from shardfs.view.dataset import open_dataset

    trim = None
    try:  # glibc: hand free heap pages back, before and after, so that the difference is what is kept
        import ctypes

        trim = ctypes.CDLL("libc.so.6").malloc_trim
        trim(0)
    except (OSError, AttributeError):
        pass
    before = proc_status(os.getpid())["VmRSS"]
    t = time.perf_counter()
    ds = open_dataset([shard_dir], index_dir)
    seconds = time.perf_counter() - t
    after = proc_status(os.getpid())["VmRSS"]
    trimmed = None
    if trim is not None:
        trim(0)
        trimmed = proc_status(os.getpid())["VmRSS"] - before
    tree = ds.tree
    parts = {name: int(getattr(tree, name).nbytes) for name in TREE_ARRAYS}
    parts["names"] = len(tree.names)
    out = {"parts": parts, "total": sum(parts.values()), "nfiles": tree.nfiles, "members": len(tree.kind),
           "ndirs": tree.ndirs, "built": ds.built, "seconds": seconds, "rss_delta": after - before,
           "rss_delta_trimmed": trimmed}
    del ds, tree
    return out


def med(values):
    return statistics.median(values) if values else float("nan")


def spread(values, fmt="{:.2f}") -> str:
    if len(values) <= 1:
        return ""
    return f" (min {fmt.format(min(values))}, max {fmt.format(max(values))}, n={len(values)})"


def mb(n) -> str:
    return f"{n / 2**20:.0f}"


def machine() -> dict:
    mem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "ram_gb": round(mem / 2**30, 1), "cpu": cpu, "kernel": platform.release(),
            "python": platform.python_version()}


# ---------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=1_000_000, help="number of files (default 1,000,000)")
    parser.add_argument("--shards", type=int, default=100, help="tar shards (default 100)")
    parser.add_argument("--classes", type=int, default=1000, help="class folders (default 1000)")
    parser.add_argument("--workdir", default="/tmp/shardfs-bench-scale", help="dataset, mountpoint, logs")
    parser.add_argument("--readers", type=int, default=2, help="reader processes for the read passes")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each mount/remount/index figure")
    parser.add_argument("--read-repeat", type=int, default=1, help="runs of each full read pass")
    parser.add_argument("--gen-workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-size", type=int, default=200)
    parser.add_argument("--max-size", type=int, default=600)
    parser.add_argument("--warm-mounts", action="store_true",
                        help="do not drop the page cache before the mount/index timings (default: drop)")
    parser.add_argument("--skip-reads", action="store_true", help="no full read passes")
    parser.add_argument("--verify", type=int, default=2000, help="random files compared mount vs plain")
    parser.add_argument("--json", help="also write every figure to this JSON file")
    parser.add_argument("--quiet-wait", type=float, default=0, metavar="S",
                        help="before each timed phase, wait until no other process has dropped the page cache "
                             "for S seconds (other benchmarks on the machine; at most 5 min each time)")
    parser.add_argument("--retries", type=int, default=1,
                        help="redo a cold+warm read pair disturbed by another process's page-cache drop")
    parser.add_argument("--mount-arg", action="append", metavar="ARG",
                        help="extra argument for every `shardfs mount`, repeat for several "
                             "(--mount-arg=--cache-size --mount-arg=1G)")
    args = parser.parse_args()
    if args.files < 1 or args.shards < 1 or args.classes < 1 or args.readers < 1 or args.repeat < 1:
        parser.error("counts must be positive")
    _Signals.install()  # SIGTERM / Ctrl-C: `finally` unmounts

    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    mach = machine()
    cmdline = shlex.join([sys.executable] + sys.argv)
    print(f"# shardfs scale benchmark\n\ncommand: {cmdline}")
    print(f"machine: nproc={mach['nproc']}, RAM={mach['ram_gb']} GB, cpu={mach['cpu']!r}, "
          f"kernel={mach['kernel']}, python={mach['python']}\nworkdir: {work}\n", flush=True)

    name = f"f{args.files}-s{args.shards}-c{args.classes}"
    log(f"dataset {name}: generating or reusing")
    lay, gen = generate(work, name, args.files, args.shards, args.classes, args.seed, args.min_size,
                        args.max_size, args.gen_workers)
    for part, info in gen.items():
        state = f"reused (generated {info['when']})" if info["reused"] else "generated now"
        log(f"  {part}: {state} in {info['seconds']:.1f} s ({info['seconds_with_sync']:.1f} s with sync)")
    _tiny_lay, _ = generate(work, "tiny", 100, 2, 10, args.seed, args.min_size, args.max_size, 1, plain=False)
    shard_dir = os.path.join(work, name, "shards")
    plain_dir = os.path.join(work, name, "plain")
    tiny_dir = os.path.join(work, "tiny", "shards")
    shard_bytes = sum(os.path.getsize(os.path.join(shard_dir, n)) for n in os.listdir(shard_dir) if n.endswith(".tar"))
    index_dir = os.path.join(work, "index-dir", name)  # --index-dir of every mount (emptied with the beside ones)
    tiny_index_dir = os.path.join(work, "index-dir", "tiny")
    log_dir = os.path.join(work, "logs")
    os.makedirs(index_dir, exist_ok=True)
    os.makedirs(tiny_index_dir, exist_ok=True)
    os.makedirs(log_dir, exist_ok=True)
    mnt = os.path.join(work, "mnt")

    can_drop = drop_caches()
    log(f"page cache drop: {'yes' if can_drop else 'NOT possible (not root, or /proc/sys read-only)'}")
    cold_mounts = can_drop and not args.warm_mounts

    def before_timing():
        wait_quiet(args.quiet_wait)
        if cold_mounts:
            drop_caches()

    R: dict = {"machine": mach, "command": cmdline, "params": vars(args), "generation": gen,
               "shard_bytes": shard_bytes, "page_cache_dropped": can_drop, "cold_mounts": cold_mounts}
    mounts = Mounts(log_dir, args.mount_arg or [])
    try:
        # ---- tiny dataset: the daemon's RSS with (almost) no index --------------------------
        tiny = {"first": [], "remount": []}
        for i in range(args.repeat):
            remove_indexes(tiny_dir, tiny_index_dir)
            for kind in ("first", "remount"):
                m = mounts.mount(tiny_dir, mnt, f"tiny-{kind}-{i}", tiny_index_dir)
                tiny[kind].append(m["proc"])
                mounts.unmount(mnt)
        tiny_rss = {k: med([p["VmRSS"] for p in v]) for k, v in tiny.items()}
        tiny_hwm = {k: med([p["VmHWM"] for p in v]) for k, v in tiny.items()}
        R["tiny"] = tiny
        log(f"tiny dataset (100 files, 2 shards): RSS first {mb(tiny_rss['first'])} MB, "
            f"remount {mb(tiny_rss['remount'])} MB")

        # ---- first mount (indexes built) -------------------------------------------------
        first = []
        for i in range(args.repeat):
            removed = remove_indexes(shard_dir, index_dir)
            before_timing()
            dist = Disturbance()
            m = mounts.mount(shard_dir, mnt, f"first-{i}", index_dir)
            m["disturbance"] = dist.done()
            st = m["stats"]
            if st["files"] != args.files:
                log(f"  WARNING: the mount shows {st['files']} files, expected {args.files}")
            m["unmount_s"] = mounts.unmount(mnt)
            first.append(m)
            log(f"first mount {i + 1}/{args.repeat}: {m['seconds']:.2f} s (daemon index {st['index_seconds']:.2f} s, "
                f"{st['indexes_built']} built, {removed} old indexes removed), RSS {mb(m['proc']['VmRSS'])} MB, "
                f"HWM {mb(m['proc']['VmHWM'])} MB, unmount {m['unmount_s']:.2f} s")
        R["first_mount"] = first

        # ---- remount (indexes loaded) -----------------------------------------------------
        remount = []
        for i in range(args.repeat):
            before_timing()
            dist = Disturbance()
            m = mounts.mount(shard_dir, mnt, f"remount-{i}", index_dir)
            m["disturbance"] = dist.done()
            st = m["stats"]
            m["unmount_s"] = mounts.unmount(mnt)
            remount.append(m)
            log(f"remount {i + 1}/{args.repeat}: {m['seconds']:.2f} s (daemon index {st['index_seconds']:.2f} s, "
                f"{st['indexes_built']} built), RSS {mb(m['proc']['VmRSS'])} MB, HWM {mb(m['proc']['VmHWM'])} MB")
        R["remount"] = remount

        # ---- the tree's arrays, in this process ---------------------------------------------
        arrays = tree_array_bytes(shard_dir, index_dir)
        R["arrays"] = arrays
        log(f"tree arrays: {arrays['total'] / 2**20:.1f} MB = {arrays['total'] / args.files:.1f} B/member "
            f"(" + ", ".join(f"{k} {v / args.files:.1f}" for k, v in arrays["parts"].items()) + ")"
            f"; in-process open_dataset {arrays['seconds']:.2f} s, RSS +{mb(arrays['rss_delta'])} MB"
            + (f", +{mb(arrays['rss_delta_trimmed'])} MB after malloc_trim(0)"
               if arrays["rss_delta_trimmed"] is not None else ""))

        # ---- shardfs index --rebuild ------------------------------------------------------
        rebuild = []
        for i in range(args.repeat):
            before_timing()
            dist = Disturbance()
            t = time.perf_counter()
            done = shardfs("index", shard_dir, "--index-dir", index_dir, "--rebuild")
            seconds = time.perf_counter() - t
            R.setdefault("index_rebuild_disturbance", []).append({"disturbance": dist.done()})
            if done.returncode != 0:
                raise RuntimeError(f"shardfs index failed: {done.stdout}{done.stderr}")
            rebuild.append(seconds)
            log(f"index --rebuild {i + 1}/{args.repeat}: {seconds:.2f} s: {done.stdout.strip()}")
        R["index_rebuild_s"] = rebuild

        # ---- full random-order read passes -------------------------------------------------
        # A pass pair (cold, then warm) is redone (--retries) when another process dropped the page
        # cache meanwhile: that empties the kernel caches the warm figure is about.
        reads = {"plain_cold": [], "plain_warm": [], "shardfs_cold": [], "shardfs_warm": [], "fresh_mount_s": []}

        def plain_pair(seed: int, tag: str) -> dict:
            wait_quiet(args.quiet_wait)
            drop_caches()
            since = Disturbance()
            cold = read_all(plain_dir, lay, args.readers, seed)
            log(f"read plain cold {tag}: {cold['files_per_s']:.0f} files/s "
                f"({cold['seconds']:.1f} s, {cold['mb_per_s']:.1f} MB/s)")
            warm = read_all(plain_dir, lay, args.readers, seed + 1)
            warm["disturbance"] = since.done()  # anything since the cold pass began spoils the warm one
            log(f"read plain warm {tag}: {warm['files_per_s']:.0f} files/s ({warm['seconds']:.1f} s)")
            return {"plain_cold": cold, "plain_warm": warm}

        def shardfs_pair(seed: int, tag: str) -> dict:
            wait_quiet(args.quiet_wait)
            drop_caches()
            since = Disturbance()
            m = mounts.mount(shard_dir, mnt, f"read-{tag.replace('/', '-')}", index_dir)
            pid, out = m["pid"], {"fresh_mount_s": m["seconds"]}
            try:
                for kind, s in (("shardfs_cold", seed + 2), ("shardfs_warm", seed + 3)):
                    ops_before = mount_stats(mnt)["fuse_ops"]
                    cpu_before = proc_status(pid)["cpu_s"]
                    res = read_all(mnt, lay, args.readers, s)
                    after = mount_stats(mnt)
                    res["daemon_cpu_s"] = proc_status(pid)["cpu_s"] - cpu_before
                    res["daemon_rss"] = proc_status(pid)["VmRSS"]
                    res["fuse_ops"] = {k: v - ops_before.get(k, 0) for k, v in after["fuse_ops"].items()
                                       if v - ops_before.get(k, 0)}
                    res["read_errors"] = after["read_errors"]
                    res["cache"] = after.get("cache")
                    if kind == "shardfs_warm":
                        res["disturbance"] = since.done()
                    out[kind] = res
                    log(f"read shardfs {kind.split('_')[1]} {tag}: {res['files_per_s']:.0f} "
                        f"files/s ({res['seconds']:.1f} s, daemon CPU {res['daemon_cpu_s']:.1f} s, "
                        f"daemon RSS {mb(res['daemon_rss'])} MB, FUSE ops {res['fuse_ops']}"
                        + (f", cache used {mb(res['cache'].get('used_bytes', 0))} MB" if res["cache"] else "") + ")")
                if args.verify:
                    out["verify_bad"] = bad = verify_sample(mnt, plain_dir, lay, args.verify, seed + 4)
                    log(f"verify: {bad} of {min(args.verify, args.files)} random files differ between mount and plain")
            finally:
                mounts.unmount(mnt)
            return out

        def foreign(pair: dict) -> int:
            return sum(v.get("disturbance", {}).get("foreign_drops", 0) for v in pair.values() if isinstance(v, dict))

        if not args.skip_reads:
            for r in range(args.read_repeat):
                seed = args.seed + 1000 + 10 * r
                for run in (plain_pair, shardfs_pair):
                    best = None
                    for attempt in range(1 + args.retries):
                        pair = run(seed, f"{r + 1}/{args.read_repeat}" + (f" (retry {attempt})" if attempt else ""))
                        if best is None or foreign(pair) < foreign(best):
                            best = pair
                        if not foreign(pair):
                            break
                        log(f"  that pair was disturbed by {foreign(pair)} page-cache drops of other processes"
                            + ("; again" if attempt < args.retries else "; keeping the least disturbed"))
                    for key, value in best.items():
                        reads.setdefault(key, []).append(value)
        R["reads"] = reads
    finally:
        mounts.close()

    # ---- the table -------------------------------------------------------------------------
    N = args.files
    f_s = [m["seconds"] for m in first]
    r_s = [m["seconds"] for m in remount]
    f_ix = [m["stats"]["index_seconds"] for m in first]
    r_ix = [m["stats"]["index_seconds"] for m in remount]
    f_rss = med([m["proc"]["VmRSS"] for m in first])
    r_rss = med([m["proc"]["VmRSS"] for m in remount])
    f_hwm = med([m["proc"]["VmHWM"] for m in first])
    r_hwm = med([m["proc"]["VmHWM"] for m in remount])
    bpm_first = (f_rss - tiny_rss["first"]) / N
    bpm_re = (r_rss - tiny_rss["remount"]) / N
    bpm_arr = arrays["total"] / N
    target = 150
    rows = [
        ("files / shards / class folders", f"{N:,} / {args.shards} / {args.classes}",
         f"{shard_bytes / 1e9:.2f} GB of tar, files {args.min_size}-{args.max_size} B"),
    ]
    for part in ("shards", "plain"):
        g = gen[part]
        rows.append((f"generation: {'tar shards' if part == 'shards' else 'plain dir'} s", f"{g['seconds']:.1f}",
                     f"{g['seconds_with_sync']:.1f} s with sync; " + (f"reused from {g['when']}" if g["reused"]
                                                                       else f"{args.gen_workers} workers, this run")))
    cache_note = "page cache dropped before each" if cold_mounts else "page cache warm"
    rows += [
        ("first mount s (indexes built)", f"{med(f_s):.2f}",
         f"daemon index {med(f_ix):.2f} s; {cache_note}{spread(f_s)}{disturbed(first)}"),
        ("remount s (indexes loaded)", f"{med(r_s):.2f}",
         f"daemon index {med(r_ix):.2f} s{spread(r_s)}{disturbed(remount)}"),
        ("ratio first / remount", f"{med(f_s) / med(r_s):.1f}x", ""),
        ("daemon RSS MB first / remount", f"{mb(f_rss)} / {mb(r_rss)}",
         f"VmHWM {mb(f_hwm)} / {mb(r_hwm)} MB; tiny dataset {mb(tiny_rss['first'])} / {mb(tiny_rss['remount'])} MB "
         f"(HWM {mb(tiny_hwm['first'])} / {mb(tiny_hwm['remount'])})"),
        ("bytes/member, RSS-based first / remount", f"{bpm_first:.0f} / {bpm_re:.0f}",
         f"(RSS - tiny RSS) / N; target <= {target} at 1.28M: "
         + ("N too small to judge (fixed costs dominate)" if N < 500_000
            else "met" if max(bpm_first, bpm_re) <= target else "NOT met")),
        ("bytes/member, peak (VmHWM) first / remount",
         f"{(f_hwm - tiny_hwm['first']) / N:.0f} / {(r_hwm - tiny_hwm['remount']) / N:.0f}", "(HWM - tiny HWM) / N"),
        ("bytes/member, tree arrays", f"{bpm_arr:.1f}",
         ", ".join(f"{k} {v / N:.1f}" for k, v in sorted(arrays["parts"].items(), key=lambda kv: -kv[1]))),
    ]
    if arrays["rss_delta_trimmed"] is not None:
        rows.append(("bytes/member, in-process RSS after open_dataset / after malloc_trim(0)",
                     f"{arrays['rss_delta'] / N:.0f} / {arrays['rss_delta_trimmed'] / N:.0f}",
                     "RSS growth of this process; the difference is freed heap not returned (fragmentation)"))
    rows += [
        ("index --rebuild s (default workers)", f"{med(rebuild):.2f}",
         f"{os.cpu_count()} workers{spread(rebuild)}{disturbed(R['index_rebuild_disturbance'])}"),
    ]
    if not args.skip_reads:
        def fps(kind):
            return med([x["files_per_s"] for x in reads[kind]])

        pc, pw, sc, sw = fps("plain_cold"), fps("plain_warm"), fps("shardfs_cold"), fps("shardfs_warm")
        drop_note = "page cache dropped" if can_drop else "page cache NOT dropped (not root?)"
        def ops(kind):
            got = reads[kind][-1]["fuse_ops"]
            return ", ".join(f"{k}={got.get(k, 0):,}" for k in ("getattr", "read"))

        last = reads["shardfs_warm"][-1]
        cache = last.get("cache") or {}
        cache_note = (f"; cache used {mb(cache['used_bytes'])} MB of {mb(cache.get('budget_bytes', 0))} MB budget"
                      if "used_bytes" in cache else "")
        rows += [
            (f"random read, plain cold, files/s ({args.readers} readers)", f"{pc:,.0f}",
             drop_note + disturbed(reads["plain_cold"])),
            ("random read, shardfs cold, files/s", f"{sc:,.0f}",
             f"**ratio shardfs/plain {sc / pc:.2f}**; fresh mount, {drop_note}; daemon CPU "
             f"{med([x['daemon_cpu_s'] for x in reads['shardfs_cold']]):.0f} s; FUSE ops {ops('shardfs_cold')}"
             + disturbed(reads["shardfs_cold"])),
            ("random read, plain warm, files/s", f"{pw:,.0f}", "second pass" + disturbed(reads["plain_warm"])),
            ("random read, shardfs warm, files/s", f"{sw:,.0f}",
             f"**ratio shardfs/plain {sw / pw:.2f}**; second pass on the same mount; FUSE ops {ops('shardfs_warm')}"
             + disturbed(reads["shardfs_warm"])),
            ("shardfs warm / shardfs cold", f"{sw / sc:.1f}x",
             f"daemon RSS after the passes {mb(last['daemon_rss'])} MB{cache_note}"),
        ]
        errs = sum(x["errors"] for k in ("plain_cold", "plain_warm", "shardfs_cold", "shardfs_warm") for x in reads[k])
        ok = all(x["bytes_ok"] for k in ("plain_cold", "plain_warm", "shardfs_cold", "shardfs_warm") for x in reads[k])
        rows.append(("read errors / bytes check / verify", f"{errs} / {'ok' if ok else 'MISMATCH'} / "
                     f"{sum(reads.get('verify_bad', []))} differ",
                     f"{args.verify} random files compared byte for byte"))
    R["table"] = rows

    print(f"\n## Results\n\ncommand: `{cmdline}`  \nmachine: nproc={mach['nproc']}, RAM={mach['ram_gb']} GB, "
          f"{mach['cpu']}, kernel {mach['kernel']}, Python {mach['python']}  \n"
          f"timed figures are medians of {args.repeat} runs (read passes: {args.read_repeat}); "
          f"mount times are the wall time of `shardfs mount` (CLI start to mount answering)\n")
    print_rows(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(R, f, indent=1, default=str)
    return 0


def print_rows(rows) -> None:
    """The results table (figure, value, notes) as Markdown."""
    print("| figure | value | notes |\n|---|---:|---|")
    for name, value, note in rows:
        print(f"| {name} | {value} | {note} |")
    print(flush=True)


def run_main(main) -> None:
    """Exit with main()'s status; Ctrl-C ends with 130 (mounts are unmounted by main's finally)."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted (mounts were unmounted)", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    run_main(main)
