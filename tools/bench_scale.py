#!/usr/bin/env python3
"""shardfs at ImageNet scale of member count: a by-hand benchmark (not a test).

Generates (or reuses) N tiny files with ImageNet-like paths, written as tar shards, as a plain
directory and as a squashfs image of it, then measures through the real CLI:

* a sequential read of every shard (4 MiB reads, page cache dropped) just before each first mount
  (the device's speed drifts): the baseline of issue 31's index build target (that first mount
  minus the median remount), at most 1.2x it, the median of the rounds' ratios;
* first mount (indexes built) and remount (indexes loaded) times, medians of --repeat runs;
* the daemon's RSS after each (VmRSS / VmHWM from /proc/PID/status), minus the RSS of a daemon
  mounting a tiny dataset, per member; and the tree's own array bytes per member (in-process);
* ``shardfs index --rebuild`` time with its default workers;
* per method (plain directory, shardfs, squashfuse_ll, the kernel's squashfs when root, ratarmount
  with every shard on its command line: one union tree), in --read-repeat rounds, each on a fresh
  mount with the caches dropped: ImageFolder's listing of every file on the fresh and again on the
  warm mount, then random-order reads by --readers processes with the built-in open() (as training
  code reads), cold then warm, the warm one again at the os level, and an open() read after
  drop_caches (for shardfs: the shards resident in its cache, one lookup and one read per file: the
  daemon's CPU per file). The read passes read a fixed random sample of --sample files (100,000 by
  default; 0: every file), the same files for every method and pass, so that a run at 1M files
  stays bounded (squashfuse_ll reads ~2,000 files/s); the table says how many each pass read;
* bounds for slow baselines, labelled in the table, never silent: a read pass stops after
  --pass-budget seconds (90; ratarmount's union of 1,000 tars reads tens of files/s) and the
  round's later passes read the files read until then; a baseline's daemon that has not mounted
  after --mount-budget seconds (900) is stopped; a method that fails is shown as failed, with why.
  ratarmount and squashfuse_ll are mounted once before the rounds (ratarmount then builds its
  indexes: "first mount"), so the rounds' mounts load indexes.

Prints the tables (medians [min-max] and ratios to plain) and issue 13's targets with PASS/FAIL.
Run as root so the page cache can be dropped::

    .venv/bin/python tools/bench_scale.py --shards 1000   # 1,000,000 files in 1,000 shards (~30 min on 2 cores
                                                 # once the dataset exists; its generation takes longer)
    .venv/bin/python tools/bench_scale.py --files 20000 --shards 20 --sample 5000 --repeat 1 --workdir /tmp/bs-small
    .venv/bin/python tools/bench_scale.py --files 4000000 --shards 2000 --skip-reads  # mounts and memory only (no
                                                 # plain tree: 4.5 GB of tar, written in ~3 min)

The dataset stays in --workdir (default /tmp/shardfs-bench-scale: ~1.2 GB of tar + 1M small files
+ their squashfs image) and is reused by the next run with the same parameters; an interrupted
generation resumes. The machine is used as it comes; other processes that drop the page cache or
take the CPU spoil figures: every timed phase records them, a disturbed read round is redone
(--retries), and --quiet-wait S waits up to S seconds for a quiet machine before each phase.
Mounts are always undone (also on SIGTERM / Ctrl-C); processes are only ever signalled by the pid
this run started.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shlex
import shutil
import subprocess
import sys
import time

import numpy as np
from benchlib import machine, old_indexes, tables
from benchlib.caches import drop_caches
from benchlib.cli import run, shardfs
from benchlib.methods import Data, make_methods
from benchlib.mounts import Mounts
from benchlib.rounds import first_mounts, listing_pass, one_round, read_pass, rounds_used, run_rounds
from benchlib.tables import median, spread

GEN_VERSION = 1
POOL_BYTES = 1 << 22
MTIME = 1_600_000_000
JPEG_MAGIC = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00"
BYTES_PER_MEMBER = 150  # issue 13's target for the daemon's memory per member


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




def make_squashfs(plain_root: str) -> str | None:
    """mksquashfs of the plain directory (reused while its marker matches), for the squashfs baselines."""
    image, marker = plain_root + ".sqsh", plain_root + ".sqsh.done.json"
    plain_done = _load_json(plain_root + ".done.json")
    if _load_json(marker) == plain_done and os.path.exists(image):
        return image
    if not shutil.which("mksquashfs"):
        log("no mksquashfs (apt-get install squashfs-tools): no squashfs baselines")
        return None
    t = time.perf_counter()
    done = run(["mksquashfs", plain_root, image, "-noappend", "-quiet", "-no-progress"])
    if done.returncode != 0:
        log(f"mksquashfs failed: {done.stderr.strip()[-300:]}")
        return None
    _save_json(marker, plain_done)
    log(f"  squashfs image of the plain dir: {os.path.getsize(image) / 1e9:.2f} GB in {time.perf_counter() - t:.0f} s")
    return image


# ---------------------------------------------------------------------------------------------
# Mounts, memory, indexes.
# ---------------------------------------------------------------------------------------------


def mount_timed(mounts: Mounts, src: str, mnt: str, tag: str, index_dir: str, log_dir: str) -> dict:
    """``shardfs mount`` (wall time of the command: CLI start to the mount answering), the daemon's
    pid, its stats and its memory; still mounted afterwards (``unmount_timed`` undoes it)."""
    t = time.perf_counter()
    m = mounts.shardfs([src], mnt, "--index-dir", index_dir, *EXTRA_MOUNT_ARGS, log=os.path.join(log_dir, f"{tag}.log"))
    seconds = time.perf_counter() - t
    return {"seconds": seconds, "pid": m.pid, "stats": m.stats(), "proc": machine.proc_status(m.pid),
            "log": m.log, "mounted": m}


def unmount_timed(mounts: Mounts, m: dict) -> float:
    return mounts.unmount(m.pop("mounted"))


EXTRA_MOUNT_ARGS: list[str] = []  # --mount-arg
# ratarmount keeps the index of an archive of at most 1,000 members in memory only, rebuilt at every
# mount; the scale's shards have exactly 1,000 (ImageNet's 1,000 shards have ~1,281, indexed on disk):
# index on disk, so that its mounts after the first load indexes, as shardfs's remounts do.
BASELINE_OPTIONS = {"ratarmount": ["--index-minimum-file-count", "0"]}


def mapped_note(runs: list[dict]) -> str:
    """How many remounts mapped the view a mount before them saved (shardfs/view/snapshot.py;
    SHARDFS_SAVED_VIEW=0 in the environment measures the merge of the indexes instead)."""
    return f"saved view mapped in {sum(bool(m['stats'].get('view_mapped')) for m in runs)} of {len(runs)}"


def remove_indexes(*dirs: str) -> int:
    n = 0
    for d in dirs:
        for name in os.listdir(d) if os.path.isdir(d) else ():
            if name.endswith(".shardfs-idx"):
                os.unlink(os.path.join(d, name))
                n += 1
    return n


def disturbed(results: list[dict]) -> str:
    """A note for the table: what other processes did during these runs."""
    seen = [r["others"] for r in results if "others" in r]
    n = sum(o["foreign_drops"] for o in seen)
    cpu = [o["background_cpu"] for o in seen if o["background_cpu"] is not None]  # None: too short to judge
    out = f"; others' CPU up to {100 * max(cpu):.0f}%" if cpu else ""
    return out + (f"; DISTURBED: {n} page-cache drops by other processes during these runs" if n else "")


def verify_sample(mnt: str, plain: str, lay: Layout, count: int, seed: int) -> int:
    """Files of the mount that differ from the plain copy, among ``count`` random ones."""
    bad = 0
    for k in np.random.default_rng(seed).choice(lay.files, size=min(count, lay.files), replace=False):
        rel = lay.name(int(k))
        with open(os.path.join(mnt, rel), "rb") as a, open(os.path.join(plain, rel), "rb") as b:
            bad += a.read() != b.read()
    return bad


# ---------------------------------------------------------------------------------------------
# The tree's arrays, in this process.
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
    before = machine.proc_status(os.getpid())["VmRSS"]
    t = time.perf_counter()
    ds = open_dataset([shard_dir], index_dir)
    seconds = time.perf_counter() - t
    after = machine.proc_status(os.getpid())["VmRSS"]
    trimmed = None
    if trim is not None:
        trim(0)
        trimmed = machine.proc_status(os.getpid())["VmRSS"] - before
    tree = ds.tree
    parts = {name: int(getattr(tree, name).nbytes) for name in TREE_ARRAYS}
    parts["names"] = len(tree.names)
    out = {"parts": parts, "total": sum(parts.values()), "nfiles": tree.nfiles, "members": len(tree.kind),
           "ndirs": tree.ndirs, "built": ds.built, "seconds": seconds, "rss_delta": after - before,
           "rss_delta_trimmed": trimmed}
    del ds, tree
    return out



def mb(n) -> str:
    return f"{n / 2**20:.0f}"


# ---------------------------------------------------------------------------------------------
# The phases of a run.
# ---------------------------------------------------------------------------------------------


class Run:
    """One run's paths, options and mounts; each phase adds its results to ``self.R``."""

    def __init__(self, args, work: str, mounts: Mounts):
        self.a, self.work, self.mounts = args, work, mounts
        self.name = f"f{args.files}-s{args.shards}-c{args.classes}"
        self.shard_dir = os.path.join(work, self.name, "shards")
        self.plain_dir = os.path.join(work, self.name, "plain")
        self.index_dir = os.path.join(work, "index-dir", self.name)  # emptied with the ones beside the shards
        self.tiny_index_dir = os.path.join(work, "index-dir", "tiny")
        self.log_dir = os.path.join(work, "logs")
        self.mnt = os.path.join(work, "mnt", "shardfs-scale")
        for d in (self.index_dir, self.tiny_index_dir, self.log_dir):
            os.makedirs(d, exist_ok=True)
        self.can_drop = drop_caches()
        self.cold_mounts = self.can_drop and not args.warm_mounts
        self.R: dict = {"page_cache_dropped": self.can_drop, "cold_mounts": self.cold_mounts}

    def before_timing(self) -> machine.Others:
        machine.wait_quiet(self.a.quiet_wait)
        if self.cold_mounts:
            drop_caches()
        return machine.Others()

    def dataset(self) -> None:
        a = self.a
        log(f"dataset {self.name}: generating or reusing")
        self.lay, gen = generate(self.work, self.name, a.files, a.shards, a.classes, a.seed, a.min_size, a.max_size,
                                 a.gen_workers, plain=not a.skip_reads)  # the plain tree: for the reads alone
        for part, info in gen.items():
            state = f"reused (generated {info['when']})" if info["reused"] else "generated now"
            log(f"  {part}: {state} in {info['seconds']:.1f} s ({info['seconds_with_sync']:.1f} s with sync)")
        generate(self.work, "tiny", 100, 2, 10, a.seed, a.min_size, a.max_size, 1, plain=False)
        self.squashfs = make_squashfs(self.plain_dir) if "squash" in a.methods and not a.skip_reads else None
        self.R.update(generation=gen, shard_bytes=sum(os.path.getsize(os.path.join(self.shard_dir, n))
                                                      for n in os.listdir(self.shard_dir) if n.endswith(".tar")))

    def tiny(self) -> None:
        """The RSS of a daemon with (almost) no index: 100 members in 2 tar shards."""
        tiny = {"first": [], "remount": []}
        for i in range(self.a.repeat):
            remove_indexes(os.path.join(self.work, "tiny", "shards"), self.tiny_index_dir)
            for kind in ("first", "remount"):
                m = mount_timed(self.mounts, os.path.join(self.work, "tiny", "shards"), self.mnt, f"tiny-{kind}-{i}",
                                self.tiny_index_dir, self.log_dir)
                unmount_timed(self.mounts, m)
                tiny[kind].append(m["proc"])
        self.R["tiny"] = tiny
        log(f"tiny dataset (100 files, 2 shards): RSS first {mb(median(p['VmRSS'] for p in tiny['first']))} MB, "
            f"remount {mb(median(p['VmRSS'] for p in tiny['remount']))} MB")

    def mount_phase(self, kind: str) -> None:
        """--repeat first mounts (indexes moved aside before each, a sequential read of the shards
        just before) or remounts (indexes loaded)."""
        runs = []
        aside = os.path.join(self.work, "old-indexes")
        for i in range(self.a.repeat):
            removed = 0
            if kind == "first":
                self.sequential(i)
                removed = old_indexes.set_aside(aside, self.shard_dir, self.index_dir)
            others = self.before_timing()
            m = mount_timed(self.mounts, self.shard_dir, self.mnt, f"{kind}-{i}", self.index_dir, self.log_dir)
            m["others"] = others.done()
            st = m["stats"]
            if st["files"] != self.a.files:
                log(f"  WARNING: the mount shows {st['files']} files, expected {self.a.files}")
            m["unmount_s"] = unmount_timed(self.mounts, m)
            runs.append(m)
            log(f"{kind} mount {i + 1}/{self.a.repeat}: {m['seconds']:.2f} s (daemon index {st['index_seconds']:.2f} s, "
                f"{st['indexes_built']} built, {removed} old indexes moved aside"
                f"{', saved view mapped' if st.get('view_mapped') else ''}), RSS {mb(m['proc']['VmRSS'])} MB, "
                f"HWM {mb(m['proc']['VmHWM'])} MB, unmount {m['unmount_s']:.2f} s")
        old_indexes.clear(aside)
        self.R[f"{kind}_mount"] = runs

    def sequential(self, i: int) -> None:
        """The baseline of a first mount, read just before it (the device's speed drifts on a shared
        machine): every shard read front to back once, in 4 MiB reads (what storage gives a scan
        that keeps up with it), page cache dropped first like the mounts."""
        runs = self.R.setdefault("sequential_read", [])
        paths = sorted(os.path.join(self.shard_dir, n) for n in os.listdir(self.shard_dir) if n.endswith(".tar"))
        others = self.before_timing()
        t = time.perf_counter()
        for path in paths:
            with open(path, "rb", buffering=0) as f:
                while f.read(4 << 20):
                    pass
        runs.append({"seconds": time.perf_counter() - t, "others": others.done()})
        log(f"sequential read of the shards {i + 1}/{self.a.repeat}: {runs[-1]['seconds']:.2f} s")

    def arrays(self) -> None:
        self.R["arrays"] = arrays = tree_array_bytes(self.shard_dir, self.index_dir)
        n = self.a.files
        log(f"tree arrays: {arrays['total'] / 2**20:.1f} MB = {arrays['total'] / n:.1f} B/member; in-process "
            f"open_dataset {arrays['seconds']:.2f} s, RSS +{mb(arrays['rss_delta'])} MB")

    def rebuild(self) -> None:
        runs = []
        for i in range(self.a.repeat):
            others = self.before_timing()
            t = time.perf_counter()
            done = shardfs("index", self.shard_dir, "--index-dir", self.index_dir, "--rebuild", check=True)
            runs.append({"seconds": time.perf_counter() - t, "others": others.done()})
            log(f"index --rebuild {i + 1}/{self.a.repeat}: {runs[-1]['seconds']:.2f} s: {done.stdout.strip()}")
        self.R["index_rebuild"] = runs

    def reads(self) -> None:
        """Rounds over the methods (each FUSE one but shardfs, whose first mounts were timed above, first
        mounted once to build its index): listings fresh and warm of every file, then the read passes
        over the same sample; then a sample of the shardfs mount compared with the plain files."""
        a = self.a
        data = Data(plain=self.plain_dir, shard_dir=self.shard_dir, work=self.work, squashfs=self.squashfs,
                    index_dir=self.index_dir)
        methods, self.R["skipped"] = make_methods([n.strip() for n in a.methods.split(",") if n.strip()], data,
                                                  {"shardfs": list(EXTRA_MOUNT_ARGS)}, BASELINE_OPTIONS)
        for m in methods.values():
            m.mount_timeout = a.mount_budget
        others = {n: m for n, m in methods.items() if n != "shardfs"}
        first = first_mounts(others, self.mounts, self.R["skipped"])
        methods = {n: m for n, m in methods.items() if n not in self.R["skipped"]}
        if self.R.get("first_mount"):  # not with --remount-only
            first["shardfs"] = median(m["seconds"] for m in self.R["first_mount"])
        budget = a.pass_budget or None

        def reading(how: str, seed: int, drop_first: bool = False):
            return read_pass(how, seed, drop_first, sample=a.sample, sample_seed=a.seed + 5, budget_s=budget)

        passes = [("list_fresh", listing_pass), ("list_warm", listing_pass), ("cold", reading("open", a.seed)),
                  ("warm", reading("open", a.seed + 100)), ("warm_os", reading("os", a.seed + 200)),
                  ("dropped", reading("open", a.seed + 300, drop_first=True))]
        self.R["reads"] = run_rounds(methods, a.read_repeat,
                                     lambda meth, r: one_round(meth, self.mounts, passes, r, a.readers, a.quiet_wait,
                                                               a.files), a.retries, a.max_background)
        self.R["reads"]["first_mount"] = {n: s for n, s in first.items() if n in methods and s is not None}
        self.R["methods"] = {n: m.fuse for n, m in methods.items()}
        if a.verify and "shardfs" in methods:
            self.verify(methods["shardfs"])

    def verify(self, shardfs_method) -> None:
        m = shardfs_method.mount(self.mounts)
        try:
            self.R["verify_bad"] = verify_sample(m.mnt, self.plain_dir, self.lay, self.a.verify, self.a.seed + 4)
        finally:
            self.mounts.unmount(m)
        log(f"verify: {self.R['verify_bad']} of {min(self.a.verify, self.a.files)} random files differ between "
            "mount and plain")


# ---------------------------------------------------------------------------------------------
# The tables.
# ---------------------------------------------------------------------------------------------


def mount_rows(R: dict, args) -> list[tuple[str, str, str]]:
    """Mount, memory and index figures: (figure, value, notes)."""
    N, remount, arrays = args.files, R["remount_mount"], R["arrays"]
    if args.remount_only:
        return remount_rows(R, args)
    first = R["first_mount"]
    tiny = {k: median(p["VmRSS"] for p in v) for k, v in R["tiny"].items()}
    f_s, r_s = [m["seconds"] for m in first], [m["seconds"] for m in remount]
    rss = {k: median(m["proc"]["VmRSS"] for m in runs) for k, runs in (("first", first), ("remount", remount))}
    hwm = {k: median(m["proc"]["VmHWM"] for m in runs) for k, runs in (("first", first), ("remount", remount))}
    R["bytes_per_member"] = bpm = {k: (rss[k] - tiny[k]) / N for k in rss}
    rebuild = [x["seconds"] for x in R["index_rebuild"]]
    seq = [x["seconds"] for x in R["sequential_read"]]
    # issue 31: the index build (first mount minus the median remount) over the sequential read
    # just before that first mount, per round
    ratios = [(f - median(r_s)) / q for f, q in zip(f_s, seq)]
    R["build_over_sequential"] = median(ratios)
    cache_note = "page cache dropped before each" if R["cold_mounts"] else "page cache warm"
    gen = R["generation"]
    rows = [("files / shards / class folders", f"{N:,} / {args.shards} / {args.classes}",
             f"{R['shard_bytes'] / 1e9:.2f} GB of tar, files {args.min_size}-{args.max_size} B")]
    rows += [(f"generation: {'tar shards' if p == 'shards' else 'plain dir'} s", f"{g['seconds']:.1f}",
              f"{g['seconds_with_sync']:.1f} s with sync; " + (f"reused from {g['when']}" if g["reused"] else "this run"))
             for p, g in gen.items()]
    rows += [
        ("first mount s (indexes built)", tables.cell(f_s, "{:.2f}"),
         f"daemon index {median(m['stats']['index_seconds'] for m in first):.2f} s; {cache_note}{disturbed(first)}"),
        ("sequential read of the shards s", tables.cell(seq, "{:.2f}"),
         f"4 MiB reads, one stream; {cache_note}{disturbed(R['sequential_read'])}"),
        ("index build / sequential read", tables.cell(ratios, "{:.2f}") + "x",
         "per round: (first mount - median remount) / the sequential read just before it; issue 31's "
         "target: at most 1.2x"),
        ("remount s (indexes loaded)", tables.cell(r_s, "{:.2f}"),
         f"daemon index {median(m['stats']['index_seconds'] for m in remount):.2f} s; {mapped_note(remount)}"
         f"{disturbed(remount)}"),
        ("daemon RSS MB first / remount", f"{mb(rss['first'])} / {mb(rss['remount'])}",
         f"VmHWM {mb(hwm['first'])} / {mb(hwm['remount'])} MB; tiny dataset {mb(tiny['first'])} / "
         f"{mb(tiny['remount'])} MB"),
        ("bytes/member, RSS-based first / remount", f"{bpm['first']:.0f} / {bpm['remount']:.0f}",
         "(RSS - tiny RSS) / N" + ("; N too small to judge (fixed costs dominate)" if N < 500_000 else "")),
        ("bytes/member, tree arrays", f"{arrays['total'] / N:.1f}",
         ", ".join(f"{k} {v / N:.1f}" for k, v in sorted(arrays["parts"].items(), key=lambda kv: -kv[1]))),
        ("index --rebuild s (default workers)", tables.cell(rebuild, "{:.2f}"),
         f"{os.cpu_count()} workers{spread(rebuild)}{disturbed(R['index_rebuild'])}"),
    ]
    if "verify_bad" in R:
        rows.append(("verify: files differing mount vs plain", f"{R['verify_bad']}",
                     f"{min(args.verify, N)} random files compared byte for byte"))
    return rows


def remount_rows(R: dict, args) -> list[tuple[str, str, str]]:
    """--remount-only: the remount, memory and tree figures alone."""
    N, remount, arrays = args.files, R["remount_mount"], R["arrays"]
    tiny = median(p["VmRSS"] for p in R["tiny"]["remount"])
    r_s = [m["seconds"] for m in remount]
    rss, hwm = (median(m["proc"][k] for m in remount) for k in ("VmRSS", "VmHWM"))
    R["bytes_per_member"] = {"remount": (rss - tiny) / N}
    return [
        ("files / shards / class folders", f"{N:,} / {args.shards} / {args.classes}",
         f"{R['shard_bytes'] / 1e9:.2f} GB of tar, files {args.min_size}-{args.max_size} B"),
        ("remount s (indexes loaded)", tables.cell(r_s, "{:.2f}"),
         f"daemon index {median(m['stats']['index_seconds'] for m in remount):.2f} s; {mapped_note(remount)}"
         f"{disturbed(remount)}"),
        ("daemon RSS MB remount", mb(rss), f"VmHWM {mb(hwm)} MB; tiny dataset {mb(tiny)} MB"),
        ("bytes/member, RSS-based remount", f"{R['bytes_per_member']['remount']:.0f}", "(RSS - tiny RSS) / N"),
        ("bytes/member, tree arrays", f"{arrays['total'] / N:.1f}",
         ", ".join(f"{k} {v / N:.1f}" for k, v in sorted(arrays["parts"].items(), key=lambda kv: -kv[1]))),
    ]


READS = [("list_fresh", "listing s, fresh mount", "seconds", "{:.2f}"),
         ("list_warm", "listing s, warm mount", "seconds", "{:.2f}"),
         ("cold", "cold open() files/s", "files_per_s", "{:,.0f}"),
         ("warm", "warm open() files/s", "files_per_s", "{:,.0f}"),
         ("warm_os", "warm os-level files/s", "files_per_s", "{:,.0f}"),
         ("dropped", "open() after drop_caches files/s", "files_per_s", "{:,.0f}")]


PASSES = ("cold", "warm", "warm_os", "dropped")


def files_read(rnd: dict) -> str:
    """What the read passes of a round read: the sample's size, or per pass, * where the budget ran out."""
    counts = [f"{rnd[k]['files']:,}" + ("*" if rnd[k].get("budget_hit") else "") for k in PASSES]
    return counts[0] if len(set(counts)) == 1 and "*" not in counts[0] else " / ".join(counts)


def not_run(R: dict) -> dict[str, str]:
    """Methods asked for that have no figures or only some, and why: "failed: ..." or "skipped: ..."."""
    out = {n: ("failed: " if why.startswith("first mount failed") else "skipped: ") + why
           for n, why in R["skipped"].items()}
    out.update({n: f"failed: {why}" for n, why in R["reads"]["failed"].items()})
    return out


def read_rows(R: dict) -> tuple[list, dict]:
    """The methods table's rows and the medians the targets use."""
    rounds, used_row = rounds_used(R["reads"]["rounds"])
    status = {**{n: ["ok"] for n in rounds}, **{n: [why.split(":")[0]] for n, why in not_run(R).items()}}
    rows = [("status (failed, skipped: see the notes)", "{}", status, None), used_row,
            ("first mount s (builds its index)", "{:.2f}", {n: [s] for n, s in R["reads"]["first_mount"].items()},
             None),
            ("mount s (fresh, indexes exist)", "{:.2f}",
             {n: [r["mount_s"] for r in rs] for n, rs in rounds.items() if R["methods"].get(n)}, None),
            (f"files read per pass ({' / '.join(PASSES)}; * the budget ran out)", "{}",
             {n: [", ".join(files_read(r) for r in rs)] for n, rs in rounds.items()}, None)]
    rows += [(label, fmt, {n: [r[k][field] for r in rs] for n, rs in rounds.items()}, "plain")
             for k, label, field, fmt in READS]

    def cpu_us(r, k):
        p = r[k]
        return p["daemon_cpu_s"] * 1e6 / p["files"] if p.get("daemon_cpu_s") is not None else None

    for k in ("cold", "warm", "dropped"):
        rows.append((f"daemon CPU us per file, {k}", "{:.0f}", {n: [cpu_us(r, k) for r in rs]
                                                               for n, rs in rounds.items()}, None))
    summ = {n: {k: median(r[k][field] for r in rs) for k, _, field, _ in READS} for n, rs in rounds.items()}
    for n, rs in rounds.items():
        summ[n]["cpu_us_dropped"] = median(cpu_us(r, "dropped") for r in rs)
    return rows, summ


def scale_targets(R: dict, summ: dict) -> list[dict]:
    s, plain = summ.get("shardfs", {}), summ.get("plain", {})
    t, a = tables.target, tables.absolute
    return [
        a("remount <= 2 s", "shardfs", median(m["seconds"] for m in R["remount_mount"]), "<= 2", " s"),
        a(f"daemon memory per member <= {BYTES_PER_MEMBER} B (RSS above a tiny mount)", "shardfs",
          max(R["bytes_per_member"].values()), f"<= {BYTES_PER_MEMBER}", " B"),
        t("full listing, fresh mount: time <= 2x plain", "shardfs", s.get("list_fresh"), plain.get("list_fresh"),
          "<= 2"),
        t("full listing, warm mount: time <= 1.2x plain", "shardfs", s.get("list_warm"), plain.get("list_warm"),
          "<= 1.2"),
        t("random read cold, open(): >= 0.8x plain", "shardfs", s.get("cold"), plain.get("cold"), ">= 0.8"),
        t("random read warm, open(): >= 0.5x plain", "shardfs", s.get("warm"), plain.get("warm"), ">= 0.5"),
        a("daemon CPU per tiny file from its RAM cache (after drop_caches) <= 25 us", "shardfs",
          s.get("cpu_us_dropped"), "<= 25", " us"),
    ]


def report(R: dict, args, cmdline: str, mach: dict) -> None:
    sample = f"a fixed random sample of {args.sample:,} files" if 0 < args.sample < args.files else "every file"
    budget = f", at most {args.pass_budget:.0f} s per pass (--pass-budget)" if args.pass_budget else ""
    print(f"\n## Results\n\ncommand: `{cmdline}`  \nmachine (as it comes): {machine.describe(mach)}  \n"
          f"mount figures: median [min-max] of {args.repeat} runs, wall time of `shardfs mount`; read rounds: "
          f"{args.read_repeat}, {args.readers} readers, median [min-max] then the ratio to plain; listings: every "
          f"file; read passes: {sample}, the same for every method{budget}\n")
    tables.print_rows(R["table"])
    a = tables.absolute
    R["targets_31"] = [] if args.remount_only else [
        a("index build (first mount - remount) <= 1.2x a sequential read", "shardfs", R["build_over_sequential"],
          "<= 1.2", "x")]
    R["targets_31"] += [
        a("remount <= 3 s", "shardfs", median(m["seconds"] for m in R["remount_mount"]), "<= 3", " s"),
        a("daemon memory per member <= 120 B (RSS above a tiny mount)", "shardfs", max(R["bytes_per_member"].values()),
          "<= 120", " B"),
    ]
    tables.print_targets(R["targets_31"], f"target (issue 31, {args.files:,} files)")
    if "reads" in R:
        rows, summ = read_rows(R)
        columns = [n for n, rs in R["reads"]["rounds"].items() if rs]
        tables.print_table(columns + [n for n in not_run(R) if n not in columns], rows)
        R["targets"] = scale_targets(R, summ)
        tables.print_targets(R["targets"], f"target (issue 13, {args.files:,} files"
                                           + (": below 1M, judged at this size only)" if args.files < 1_000_000 else ")"))
        for n, why in not_run(R).items():
            print(f"note: {n}: {why}")
        for note in budget_notes(R, args.pass_budget):
            print(f"note: {note}")


def budget_notes(R: dict, budget: float) -> list[str]:
    """Where --pass-budget stopped a read pass: the figure is over the files read until then."""
    out = []
    for n, rs in R["reads"]["rounds"].items():
        for r in rs:
            cut = [f"{k} after {r[k]['files']:,} of {r[k]['of']:,} files" for k in PASSES if r[k].get("budget_hit")]
            if cut:
                out.append(f"{n}, round {r['round'] + 1}: the {budget:.0f} s budget ran out: " + "; ".join(cut)
                           + " (later passes read only the files read before; files/s is over the files read)")
    return out


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=1_000_000, help="number of files (default 1,000,000)")
    p.add_argument("--shards", type=int, default=100, help="tar shards (default 100)")
    p.add_argument("--classes", type=int, default=1000, help="class folders (default 1000)")
    p.add_argument("--workdir", default="/tmp/shardfs-bench-scale", help="dataset, mountpoint, logs")
    p.add_argument("--readers", type=int, default=2, help="reader processes for the read passes")
    p.add_argument("--repeat", type=int, default=3, help="runs of each mount/remount/index figure")
    p.add_argument("--read-repeat", type=int, default=1, help="rounds of the read passes per method")
    p.add_argument("--methods", default="plain,shardfs,squashfuse_ll,squashfs-kernel,ratarmount",
                   help="what the read rounds compare")
    p.add_argument("--sample", type=int, default=100_000,
                   help="files each read pass reads: a fixed random sample (--seed), the same for every method "
                        "and pass (default 100,000; 0: every file). Listings always cover every file")
    p.add_argument("--mount-budget", type=float, default=900, metavar="S",
                   help="a baseline's daemon (ratarmount, squashfuse_ll) that has not mounted after S seconds "
                        "is stopped and the method shown as failed (default 900)")
    p.add_argument("--pass-budget", type=float, default=90, metavar="S",
                   help="a read pass stops after S seconds (0: no limit); the round's later passes then read the "
                        "files read until then, and the table marks it (default 90: ratarmount's union of 1,000 "
                        "tars reads tens of files/s)")
    p.add_argument("--gen-workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-size", type=int, default=200)
    p.add_argument("--max-size", type=int, default=600)
    p.add_argument("--warm-mounts", action="store_true",
                   help="do not drop the page cache before the mount/index timings (default: drop)")
    p.add_argument("--skip-reads", action="store_true", help="no read rounds")
    p.add_argument("--remount-only", action="store_true",
                   help="no sequential read, first mounts or index rebuilds: the shards' indexes must exist "
                        "and are never removed (a dataset other runs share)")
    p.add_argument("--verify", type=int, default=2000, help="random files compared mount vs plain")
    p.add_argument("--json", help="also write every figure to this JSON file")
    p.add_argument("--quiet-wait", type=float, default=0, metavar="S",
                   help="before each timed phase, wait up to S seconds for 2 s in which other processes took "
                        "under 15%% of the CPU and dropped no caches (0: do not wait)")
    p.add_argument("--retries", type=int, default=1,
                   help="redo a read round that other processes disturbed (page-cache drops, CPU)")
    p.add_argument("--max-background", type=float, default=0.25,
                   help="others' CPU share (0..1) above which a read round counts as disturbed")
    p.add_argument("--mount-arg", action="append", metavar="ARG", default=[],
                   help="extra argument for every `shardfs mount`, repeat for several "
                        "(--mount-arg=--cache-size --mount-arg=1G)")
    args = p.parse_args()
    if min(args.files, args.shards, args.classes, args.readers, args.repeat, args.read_repeat) < 1:
        p.error("counts must be positive")
    if args.sample < 0 or args.pass_budget < 0:
        p.error("--sample and --pass-budget must be 0 or more")
    return args


def main() -> int:
    args = parse_args()
    EXTRA_MOUNT_ARGS.extend(args.mount_arg)
    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    mach, cmdline = machine.facts(work), shlex.join([sys.executable] + sys.argv)
    print(f"# shardfs scale benchmark\n\ncommand: {cmdline}\nmachine: {machine.describe(mach)}\nworkdir: {work}\n",
          flush=True)
    with Mounts() as mounts:
        run_ = Run(args, work, mounts)
        R = run_.R
        R.update(machine=mach, command=cmdline, params=vars(args))
        log(f"page cache drop: {'yes' if run_.can_drop else 'NOT possible (not root, or /proc/sys read-only)'}")
        try:
            run_.dataset()
            run_.tiny()
            if not args.remount_only:
                run_.mount_phase("first")
            run_.mount_phase("remount")
            run_.arrays()
            if not args.remount_only:
                run_.rebuild()
            if not args.skip_reads:
                run_.reads()
        except KeyboardInterrupt:
            print("interrupted (mounts are unmounted)", file=sys.stderr)
            return 130
    R["table"] = mount_rows(R, args)
    report(R, args, cmdline, mach)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(R, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
