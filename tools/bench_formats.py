#!/usr/bin/env python3
"""tar against shardfs's lz4 format: a by-hand benchmark (not a test).

Three parts, every timed figure the median of --repeat runs, all through the real CLI:

1. Pack throughput, MB/s written: ``shardfs pack --format tar`` and ``--format lz4`` against
   ``tar --sort=name -cf`` (then fsync, since pack fsyncs its shards) of the same files, on
   (a) real JPEGs (reuses /tmp/shardfs-bench/src, tools/bench.py's 20,000 JPEGs, when it exists;
   else makes --jpeg-classes x --jpeg-per-class) and (b) compressible ``.npy`` arrays. Sources are
   read once beforehand, so every run packs from the page cache.
2. The ``.npy`` arrays (float32 with structure, --npy-kind): shard bytes lz4 / tar, and a
   random-order read of every file by --readers processes through a real mount, cold (page cache
   dropped, fresh mount) and warm (second pass on the same mount), tar vs lz4 (and the plain
   source directory for reference); then ``np.load`` of every file from each mount, and a sample
   compared with the source (sha256 of the bytes, array equality).
3. Mount time at 1,000,000 members (tools/bench_scale.py's dataset, reused from --scale-dir when
   present; else a --members one is made in --workdir): its plain directory is packed once into
   lz4 shards of --scale-shard-members (cached in --workdir with a marker), then first mount
   (every ``*.shardfs-idx`` deleted: tar indexes built by scanning headers, lz4 ones from the
   member tables) and remount (indexes loaded), tar shards vs lz4 shards: wall time of
   ``shardfs mount`` and the daemon's RSS.

Run as root (the page cache is dropped before cold figures and mount timings)::

    .venv/bin/python tools/bench_formats.py --json /tmp/bench-formats.json   # ~9 min on 2 cores (~5 with the 1M pack cached)
    .venv/bin/python tools/bench_formats.py --skip-1m --npy-files 200 --jpeg-src /nonexistent \\
        --jpeg-per-class 5 --repeat 1 --workdir /tmp/bf-small             # a quick look

Mounts are always undone (``shardfs umount``, then ``fusermount3 -u -z``), also on SIGTERM /
Ctrl-C; processes are only ever signalled by the pid this run started.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import bench_scale as bs  # its 1M dataset, timed mounts, notes on disturbed runs
import numpy as np
from benchlib import machine, readers, tables
from benchlib.caches import drop_caches
from benchlib.cli import run, shardfs
from benchlib.mounts import Mounts, mount_stats
from benchlib.sample import files_under, make_imagefolder

import shardfs as shardfs_pkg
from shardfs.storage.memory import parse_size

log = bs.log
med = tables.median
spread = tables.spread
NPY_KINDS = ("labels", "counts", "image8", "smooth_q", "smooth")
NPY_VERSION = 1
SCALE_PACK_VERSION = 1
SHARD_SUFFIXES = (".tar", ".lz4shard")


# ---------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------


class Ctx:
    """What every part needs: options, the mount helper, whether the page cache may be dropped."""

    def __init__(self, args, work: str, mounts: Mounts, can_drop: bool):
        self.args, self.work, self.mounts, self.can_drop = args, work, mounts, can_drop
        self.mnt = os.path.join(work, "mnt")

    def drop(self) -> bool:
        """Drop the page cache (sync first), unless not allowed; True when it was dropped."""
        return drop_caches() if self.can_drop else False

    def mount(self, src: str, tag: str, index_dir: str) -> dict:
        return bs.mount_timed(self.mounts, src, self.mnt, tag, index_dir, os.path.join(self.work, "logs"))

    def unmount(self, m: dict) -> float:
        return bs.unmount_timed(self.mounts, m)


def mbs(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e6 if seconds > 0 else float("nan")


def warm_read(root: str) -> tuple[int, int]:
    """Read every file under root (into the page cache); (files, bytes)."""
    n = total = 0
    for rel in files_under(root):
        with open(os.path.join(root, rel), "rb", buffering=0) as f:
            while b := f.read(1 << 20):
                total += len(b)
        n += 1
    return n, total


def shard_files(d: str) -> list[str]:
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(SHARD_SUFFIXES))


def shard_bytes(d: str) -> int:
    return sum(os.path.getsize(p) for p in shard_files(d))


def remove_indexes(*dirs: str) -> int:
    n = 0
    for d in dirs:
        for p in glob.glob(os.path.join(glob.escape(d), "*.shardfs-idx")):
            os.unlink(p)
            n += 1
    return n


def timed_pack(*args: str, timeout: float = 7200) -> tuple[float, subprocess.CompletedProcess]:
    """``shardfs pack ARGS``: (wall seconds, result); a failure raises."""
    t = time.perf_counter()
    done = shardfs("pack", *args, check=True, timeout=timeout)
    return time.perf_counter() - t, done


def save_json(path: str | None, data) -> None:
    if path:
        with open(path + ".tmp", "w") as f:
            json.dump(data, f, indent=1, default=str)
        os.replace(path + ".tmp", path)


def machine_facts(work: str) -> dict:
    import lz4
    import lz4.block

    m = machine.facts(work)
    m.update({"lz4": f"python-lz4 {lz4.__version__}, liblz4 {lz4.library_version_string()}",
              "tar": run(["tar", "--version"]).stdout.split("\n")[0]})
    return m


# ---------------------------------------------------------------------------------------------
# Datasets: JPEGs, .npy arrays
# ---------------------------------------------------------------------------------------------


def jpeg_source(ctx: Ctx) -> tuple[str, str]:
    """(directory to pack, description): the JPEGs of tools/bench.py, or a made set."""
    a = ctx.args
    if a.jpeg_src and os.path.isdir(a.jpeg_src) and files_under(a.jpeg_src):
        return a.jpeg_src, f"reused {a.jpeg_src}"
    root = os.path.join(ctx.work, f"jpeg-c{a.jpeg_classes}-p{a.jpeg_per_class}-s{a.jpeg_side}")
    marker = root + ".done.json"
    if not os.path.exists(marker):
        shutil.rmtree(root, ignore_errors=True)
        log(f"making {a.jpeg_classes * a.jpeg_per_class} JPEGs of side {a.jpeg_side} in {root}")
        t = time.perf_counter()
        make_imagefolder(root, classes=a.jpeg_classes, per_class=a.jpeg_per_class, side=a.jpeg_side)
        bs._save_json(marker, {"seconds": round(time.perf_counter() - t, 1), "when": time.strftime("%F %T")})
    why = f"{a.jpeg_src} absent; " if a.jpeg_src else ""
    return root, f"{why}made with benchlib.sample.make_imagefolder (classes={a.jpeg_classes}, " \
                 f"per_class={a.jpeg_per_class}, side={a.jpeg_side})"


def npy_array(kind: str, side: int, rng: np.random.Generator) -> np.ndarray:
    """A float32 array with the structure real preprocessed data has, so that lz4 finds something."""
    if kind == "labels":  # a segmentation mask: class ids in 16x16 blocks
        lo = rng.integers(0, 20, size=(-(-side // 16),) * 2)
        return np.kron(lo, np.ones((16, 16)))[:side, :side].astype(np.float32)
    if kind == "counts":  # small integer counts (Poisson, mean 2)
        return rng.poisson(2.0, size=(side, side)).astype(np.float32)
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float32) / side
    if kind == "image8":  # an 8-bit image (gradient + noise) scaled to [0, 1]
        base, sx, sy = rng.uniform(0, 255), *rng.uniform(-120, 120, 2)
        px = np.clip(base + xx * sx + yy * sy + rng.normal(0, 8, (side, side)), 0, 255).astype(np.uint8)
        return (px / np.float32(255)).astype(np.float32)
    field = np.zeros((side, side), np.float32)  # a smooth field: sum of 4 plane waves
    for _ in range(4):
        a, b, p = rng.uniform(1, 6, 3)
        field += np.sin(2 * np.pi * (a * xx + b * yy) + p).astype(np.float32)
    if kind == "smooth_q":  # ... quantised to 1/64 (fixed-point data stored as float)
        return (np.round(field * 64) / 64).astype(np.float32)
    return field  # "smooth": full-precision floats, which lz4 cannot shrink (blocks stored raw)


def npy_source(ctx: Ctx) -> tuple[str, list[str], str]:
    """(directory, relative paths, description), made once per parameter set (marker)."""
    a = ctx.args
    kinds = list(NPY_KINDS[:4]) if a.npy_kind == "mix" else [a.npy_kind]
    params = {"version": NPY_VERSION, "files": a.npy_files, "side": a.npy_side, "kinds": kinds, "seed": a.seed}
    name = f"npy-n{a.npy_files}-s{a.npy_side}-{a.npy_kind}-seed{a.seed}"
    root = os.path.join(ctx.work, name, "src")
    marker = root + ".done.json"
    done = bs._load_json(marker)
    if not (done and done.get("params") == params):
        shutil.rmtree(root, ignore_errors=True)
        log(f"making {a.npy_files} float32 arrays {a.npy_side}x{a.npy_side} ({'/'.join(kinds)}) in {root}")
        t = time.perf_counter()
        for i in range(a.npy_files):
            d = os.path.join(root, "arrays", f"g{i % 20:02d}")
            os.makedirs(d, exist_ok=True)
            arr = npy_array(kinds[i % len(kinds)], a.npy_side, np.random.default_rng([a.seed, i]))
            np.save(os.path.join(d, f"a{i:06d}.npy"), arr)
        subprocess.run(["sync"])
        bs._save_json(marker, {"params": params, "seconds": round(time.perf_counter() - t, 1),
                               "when": time.strftime("%F %T")})
    desc = f"{a.npy_files} float32 arrays {a.npy_side}x{a.npy_side}, kinds {'/'.join(kinds)} in turn"
    return root, files_under(root), desc


# ---------------------------------------------------------------------------------------------
# Part 1: pack throughput
# ---------------------------------------------------------------------------------------------

PACKERS = ("tar -cf", "pack tar", "pack lz4")


def pack_once(ctx: Ctx, how: str, src: str, out: str) -> dict:
    """One timed pack of src into out (emptied first, dirty pages flushed first)."""
    a = ctx.args
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    os.sync()
    others = machine.Others()
    if how == "tar -cf":
        path = os.path.join(out, "all.tar")
        t = time.perf_counter()
        done = run(["tar", "--sort=name", "-cf", path, "-C", src, "."])
        if done.returncode != 0:
            raise RuntimeError(f"tar -cf failed: {done.stderr}")
        fd = os.open(path, os.O_RDONLY)  # pack fsyncs every shard it writes: so does this
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        seconds = time.perf_counter() - t
        written, shards, internal = os.path.getsize(path), 1, None
    else:
        fmt = how.split()[1]
        seconds, done = timed_pack(src, out, "--format", fmt, "--prefix", "data", "--shard-size", str(a.shard_size),
                                   "--workers", str(a.pack_workers))
        m = re.search(r" in ([\d.]+) s", done.stdout)
        internal = float(m.group(1)) if m else None
        written, shards = shard_bytes(out), len(shard_files(out))
    return {"seconds": seconds, "written": written, "shards": shards, "mb_per_s": mbs(written, seconds),
            "pack_reported_s": internal, "others": others.done()}


def pack_bench(ctx: Ctx, label: str, src: str, keep: dict[str, str] | None = None) -> dict:
    """--repeat runs of each packer, in rotating order; ``keep`` maps packer -> a directory where
    its last output stays (for part 2); the others are removed."""
    files, nbytes = warm_read(src)
    log(f"{label}: {files} files, {nbytes / 1e6:.1f} MB, read once into the page cache")
    out_root = os.path.join(ctx.work, "pack-out")
    res = {"files": files, "source_bytes": nbytes, "runs": {h: [] for h in PACKERS}}
    for r in range(ctx.args.repeat):
        order = PACKERS[r % 3:] + PACKERS[:r % 3]
        for how in order:
            out = os.path.join(out_root, how.replace(" ", "_").replace("-", ""))
            x = pack_once(ctx, how, src, out)
            res["runs"][how].append(x)
            log(f"  {label} {r + 1}/{ctx.args.repeat} {how}: {x['seconds']:.2f} s, {x['written'] / 1e6:.1f} MB "
                f"in {x['shards']} file(s), {x['mb_per_s']:.1f} MB/s written")
            if keep and how in keep and r == ctx.args.repeat - 1:
                shutil.rmtree(keep[how], ignore_errors=True)
                os.makedirs(os.path.dirname(keep[how]), exist_ok=True)
                os.rename(out, keep[how])
    shutil.rmtree(out_root, ignore_errors=True)
    return res


def pack_rows(label: str, res: dict, workers: int) -> list[tuple[str, str, str]]:
    runs = res["runs"]
    s = {h: med([x["seconds"] for x in runs[h]]) for h in PACKERS}
    w = {h: med([x["mb_per_s"] for x in runs[h]]) for h in PACKERS}
    size = {h: runs[h][-1]["written"] for h in PACKERS}
    src_mb = res["source_bytes"] / 1e6
    rows = []
    for h in PACKERS:
        what = "`tar --sort=name -cf` + fsync" if h == "tar -cf" else f"`shardfs pack --format {h.split()[1]}`"
        note = (f"{size[h] / 1e6:.1f} MB in {runs[h][-1]['shards']} file(s); {s[h]:.2f} s"
                f"{spread([x['seconds'] for x in runs[h]])}; source {src_mb / s[h]:.0f} MB/s")
        if h != "tar -cf":
            note += f"; --workers {workers}"
        rows.append((f"{label}: {what}, MB/s written", f"{w[h]:.1f}", note + bs.disturbed(runs[h])))
    rows.append((f"{label}: ratios pack tar / tar -cf, pack lz4 / pack tar (MB/s written)",
                 f"{w['pack tar'] / w['tar -cf']:.2f} / {w['pack lz4'] / w['pack tar']:.2f}",
                 f"by time (same source): pack tar / tar -cf {s['pack tar'] / s['tar -cf']:.2f}x, "
                 f"pack lz4 / pack tar {s['pack lz4'] / s['pack tar']:.2f}x; "
                 f"lz4 bytes / tar bytes {size['pack lz4'] / size['pack tar']:.3f}"))
    return rows


# ---------------------------------------------------------------------------------------------
# Part 2: reads through a mount
# ---------------------------------------------------------------------------------------------

def read_all(root: str, rels: list[str], expected: int, nreaders: int, seed: int) -> dict:
    """Every file of ``rels`` read once in a random order by ``nreaders`` processes with open(), as np.load reads."""
    order = np.random.default_rng(seed).permutation(len(rels))
    others = machine.Others()
    res = readers.read_all([os.path.join(root, rels[int(k)]) for k in order], nreaders, "open")
    res["bytes_ok"], res["others"] = res["bytes"] == expected, others.done()
    if res["errors"] or not res["bytes_ok"]:
        log(f"  WARNING: {res['errors']} errors, {res['bytes']} bytes read, {expected} expected; "
            f"first error: {res['first_error']}")
    return res


def check_npy(mnt: str, src: str, rels: list[str], side: int, sample: int, seed: int) -> dict:
    """np.load every file of the mount (shape, dtype); for a sample, sha256 of the bytes and the
    arrays compared with the source."""
    t = time.perf_counter()
    bad_load = []
    for rel in rels:
        try:
            a = np.load(os.path.join(mnt, rel))
            if a.shape != (side, side) or a.dtype != np.float32:
                bad_load.append(f"{rel}: {a.shape} {a.dtype}")
        except Exception as exc:  # report, do not stop: this is a check
            bad_load.append(f"{rel}: {exc}")
    load_s = time.perf_counter() - t
    bad_hash = bad_array = 0
    picks = np.random.default_rng(seed).choice(len(rels), size=min(sample, len(rels)), replace=False)
    for k in picks:
        rel = rels[int(k)]
        with open(os.path.join(mnt, rel), "rb") as f:
            got = f.read()
        with open(os.path.join(src, rel), "rb") as f:
            want = f.read()
        bad_hash += hashlib.sha256(got).digest() != hashlib.sha256(want).digest()
        bad_array += not np.array_equal(np.load(io.BytesIO(got)), np.load(io.BytesIO(want)))
    return {"np_load_s": load_s, "np_load_files_per_s": len(rels) / load_s, "bad_load": len(bad_load),
            "bad_load_first": bad_load[:3], "sample": len(picks), "bad_sha256": int(bad_hash),
            "bad_array": int(bad_array)}


def read_bench(ctx: Ctx, src: str, rels: list[str], shard_dirs: dict[str, str]) -> dict:
    """For each repeat, in rotating order: plain source dir, tar mount, lz4 mount; each cold
    (page cache dropped, fresh mount) then warm (second pass, same mount)."""
    a = ctx.args
    expected = sum(os.path.getsize(os.path.join(src, r)) for r in rels)
    kinds = ("plain", "tar", "lz4")
    res: dict = {k: {"cold": [], "warm": []} for k in kinds}
    res["check"] = {}
    for r in range(a.repeat):
        seed = a.seed + 1000 + 10 * r  # the same orders for every kind within a repeat
        for kind in kinds[r % 3:] + kinds[:r % 3]:
            tag = f"{r + 1}/{a.repeat} {kind}"
            dropped = ctx.drop()
            if kind == "plain":
                for temp, s in (("cold", seed), ("warm", seed + 1)):
                    x = read_all(src, rels, expected, a.readers, s)
                    x["page_cache_dropped"] = dropped if temp == "cold" else None
                    res[kind][temp].append(x)
                    log(f"  read {tag} {temp}: {x['files_per_s']:.0f} files/s, {x['mb_per_s']:.1f} MB/s")
                continue
            idx = os.path.join(ctx.work, "index-dir", f"npy-{kind}")
            os.makedirs(idx, exist_ok=True)
            m = ctx.mount(shard_dirs[kind], f"npy-{kind}-{r}", idx)
            pid = m["pid"]
            try:
                if m["stats"]["files"] != len(rels):
                    log(f"  WARNING: the {kind} mount shows {m['stats']['files']} files, expected {len(rels)}")
                for temp, s in (("cold", seed), ("warm", seed + 1)):
                    before, cpu0 = mount_stats(ctx.mnt), machine.proc_status(pid)["cpu_s"]
                    x = read_all(ctx.mnt, rels, expected, a.readers, s)
                    after, proc = mount_stats(ctx.mnt), machine.proc_status(pid)
                    x.update({"page_cache_dropped": dropped if temp == "cold" else None,
                              "daemon_cpu_s": proc["cpu_s"] - cpu0, "daemon_rss": proc["VmRSS"],
                              "storage_bytes": after["cache"]["storage_bytes_read"]
                              - before["cache"]["storage_bytes_read"],
                              "fuse_reads": after["fuse_ops"].get("read", 0) - before["fuse_ops"].get("read", 0),
                              "read_errors": after["read_errors"], "mount_s": m["seconds"]})
                    res[kind][temp].append(x)
                    log(f"  read {tag} {temp}: {x['files_per_s']:.0f} files/s, {x['mb_per_s']:.1f} MB/s, daemon CPU "
                        f"{x['daemon_cpu_s']:.1f} s, {x['storage_bytes'] / 1e6:.1f} MB from shard files, "
                        f"{x['fuse_reads']} FUSE reads")
                if r == a.repeat - 1:
                    c = check_npy(ctx.mnt, src, rels, a.npy_side, a.verify_sample, a.seed + 7)
                    res["check"][kind] = c
                    log(f"  np.load of every file ({kind}): {c['np_load_files_per_s']:.0f} files/s, "
                        f"{c['bad_load']} bad; "
                        f"sample of {c['sample']}: {c['bad_sha256']} sha256 and {c['bad_array']} arrays differ")
            finally:
                ctx.unmount(m)
    res["expected_bytes"] = expected
    return res


def read_rows(ctx: Ctx, res: dict, sizes: dict[str, int], src_bytes: int) -> list[tuple[str, str, str]]:
    a = ctx.args
    rows = [("npy: shard bytes lz4 / tar", f"{sizes['lz4'] / sizes['tar']:.3f}",
             f"tar {sizes['tar'] / 1e6:.1f} MB, lz4 {sizes['lz4'] / 1e6:.1f} MB, "
             f"source files {src_bytes / 1e6:.1f} MB; "
             f"saved {(sizes['tar'] - sizes['lz4']) / 1e6:.1f} MB ({1 - sizes['lz4'] / sizes['tar']:.1%})")]

    def fig(kind, temp, key):
        return med([x[key] for x in res[kind][temp]])

    for temp in ("cold", "warm"):
        how = ("page cache dropped, fresh mount" if ctx.can_drop else "page cache NOT dropped") if temp == "cold" \
            else "second pass, same mount"
        for kind in ("plain", "tar", "lz4"):
            runs = res[kind][temp]
            note = how if kind != "plain" else how.replace(", fresh mount", "").replace(", same mount", "")
            if kind != "plain":
                note += (f"; daemon CPU {fig(kind, temp, 'daemon_cpu_s'):.1f} s; from shard files "
                         f"{fig(kind, temp, 'storage_bytes') / 1e6:.0f} MB; "
                         f"FUSE reads {fig(kind, temp, 'fuse_reads'):.0f}")
            note += spread([x["files_per_s"] for x in runs], "{:.0f}") + bs.disturbed(runs)
            name = "plain source dir" if kind == "plain" else f"{kind} mount"
            rows.append((f"npy: random open() read {temp}, {name}, files/s / MB/s ({a.readers} readers)",
                         f"{fig(kind, temp, 'files_per_s'):,.0f} / {fig(kind, temp, 'mb_per_s'):.0f}", note))
        rows.append((f"npy: {temp} ratios lz4 / tar, tar / plain, lz4 / plain (files/s)",
                     f"{fig('lz4', temp, 'files_per_s') / fig('tar', temp, 'files_per_s'):.2f} / "
                     f"{fig('tar', temp, 'files_per_s') / fig('plain', temp, 'files_per_s'):.2f} / "
                     f"{fig('lz4', temp, 'files_per_s') / fig('plain', temp, 'files_per_s'):.2f}", ""))
    errs = sum(x["errors"] for k in ("plain", "tar", "lz4") for t in ("cold", "warm") for x in res[k][t])
    ok = all(x["bytes_ok"] for k in ("plain", "tar", "lz4") for t in ("cold", "warm") for x in res[k][t])
    for kind in ("tar", "lz4"):
        c = res["check"].get(kind)
        if c:
            rows.append((f"npy: np.load of every file, {kind} mount (1 process, warm)",
                         f"{c['np_load_files_per_s']:,.0f} files/s",
                         f"{c['bad_load']} failed to load or had the wrong shape/dtype; sample of {c['sample']}: "
                         f"{c['bad_sha256']} sha256 differ, {c['bad_array']} arrays differ from the source"))
    rows.append(("npy: read errors / bytes check", f"{errs} / {'ok' if ok else 'MISMATCH'}",
                 "every pass read every byte of every file"))
    return rows


# ---------------------------------------------------------------------------------------------
# Part 3: mount time at 1M members
# ---------------------------------------------------------------------------------------------


def scale_dataset(ctx: Ctx) -> dict:
    """bench_scale's dataset (reused, or made smaller with --members): its plain dir and tar shards."""
    a = ctx.args
    d = a.scale_dir
    if d and os.path.exists(d + "/plain.done.json") and os.path.exists(d + "/shards.done.json"):
        n = bs._load_json(d + "/plain.done.json")["params"]["files"]
        return {"dir": d, "plain": os.path.join(d, "plain"), "tar": os.path.join(d, "shards"), "files": n,
                "desc": f"reused {d} (tools/bench_scale.py: plain dir + {len(shard_files(d + '/shards'))} tar shards)",
                "when": bs._load_json(d + "/plain.done.json")["when"]}
    n = a.members
    shards, classes = max(1, n // a.scale_shard_members), max(1, n // 1000)
    log(f"{d} is not there (or incomplete): making a {n:,}-member dataset with bench_scale's generator instead")
    name = f"f{n}-s{shards}-c{classes}"
    _lay, info = bs.generate(ctx.work, name, n, shards, classes, a.seed, 200, 600, os.cpu_count() or 1)
    root = os.path.join(ctx.work, name)
    return {"dir": root, "plain": os.path.join(root, "plain"), "tar": os.path.join(root, "shards"), "files": n,
            "desc": f"{d} ABSENT: made {n:,} members ({shards} tar shards, {classes} classes) in {root}",
            "when": info["plain"]["when"]}


def scale_lz4(ctx: Ctx, ds: dict) -> dict:
    """The plain dir packed once into lz4 shards of --scale-shard-members (marker: reused)."""
    a = ctx.args
    out = os.path.join(ctx.work, "scale-lz4", os.path.basename(ds["dir"].rstrip("/")))
    marker = out + ".done.json"
    params = {"version": SCALE_PACK_VERSION, "source": os.path.abspath(ds["plain"]), "source_when": ds["when"],
              "files": ds["files"], "shard_members": a.scale_shard_members, "shardfs": shardfs_pkg.__version__}
    done = bs._load_json(marker)
    if done and done.get("params") == params and shard_files(out):
        return {**done, "dir": out, "reused": True}
    shutil.rmtree(out, ignore_errors=True)
    if os.path.exists(marker):
        os.unlink(marker)
    workers = os.cpu_count() or 1
    cmd = [ds["plain"], out, "--format", "lz4", "--prefix", "train", "--shard-members", str(a.scale_shard_members),
           "--workers", str(workers)]
    log(f"packing {ds['files']:,} files once: shardfs pack {shlex.join(cmd)}")
    seconds, result = timed_pack(*cmd, timeout=6 * 3600)
    log(f"  {result.stdout.strip().splitlines()[0] if result.stdout.strip() else ''} ({seconds:.1f} s wall)")
    done = {"params": params, "seconds": round(seconds, 1), "workers": workers, "when": time.strftime("%F %T"),
            "summary": result.stdout.strip()}
    bs._save_json(marker, done)
    return {**done, "dir": out, "reused": False}


def mount_bench(ctx: Ctx, ds: dict, shard_dirs: dict[str, str]) -> dict:
    a = ctx.args
    res: dict = {"tiny": []}
    # The RSS of a daemon with (almost) no index: 100 members in 2 tar shards.
    bs.generate(ctx.work, "tiny", 100, 2, 10, a.seed, 200, 600, 1, plain=False)
    tiny_idx = os.path.join(ctx.work, "index-dir", "tiny")
    os.makedirs(tiny_idx, exist_ok=True)
    for r in range(a.repeat):
        m = ctx.mount(os.path.join(ctx.work, "tiny", "shards"), f"tiny-{r}", tiny_idx)
        ctx.unmount(m)
        res["tiny"].append(m["proc"])
    log(f"  tiny dataset (100 members): daemon RSS {bs.mb(med([x['VmRSS'] for x in res['tiny']]))} MB")
    for kind in ("tar", "lz4"):
        idx = os.path.join(ctx.work, "index-dir", f"scale-{kind}")
        os.makedirs(idx, exist_ok=True)
        for phase in ("first", "remount"):
            runs = res.setdefault(kind, {}).setdefault(phase, [])
            for r in range(a.repeat):
                removed = remove_indexes(shard_dirs[kind], idx) if phase == "first" else 0
                dropped = ctx.drop()
                others = machine.Others()
                m = ctx.mount(shard_dirs[kind], f"scale-{kind}-{phase}-{r}", idx)
                m["others"], m["page_cache_dropped"], m["indexes_removed"] = others.done(), dropped, removed
                try:
                    st = m["stats"]
                    if st["files"] != ds["files"]:
                        log(f"  WARNING: the {kind} mount shows {st['files']} files, expected {ds['files']}")
                finally:
                    m["unmount_s"] = ctx.unmount(m)
                runs.append(m)
                log(f"  {kind} {phase} {r + 1}/{a.repeat}: {m['seconds']:.2f} s (daemon index "
                    f"{st['index_seconds']:.2f} s, {st['indexes_built']} built, {removed} removed), "
                    f"RSS {bs.mb(m['proc']['VmRSS'])} MB, HWM {bs.mb(m['proc']['VmHWM'])} MB")
    return res


def mount_rows(ds: dict, res: dict, sizes: dict[str, int], nshards: dict[str, int], packed: dict,
               dropped: bool) -> list[tuple[str, str, str]]:
    n = ds["files"]
    tag = "1M" if n == 1_000_000 else f"{n:,} members"
    tiny = med([x["VmRSS"] for x in res["tiny"]])
    rows = [(f"{tag}: dataset", f"{n:,} members", ds["desc"]),
            (f"{tag}: shards tar / lz4", f"{nshards['tar']} / {nshards['lz4']}",
             f"{sizes['tar'] / 1e9:.2f} GB / {sizes['lz4'] / 1e9:.2f} GB "
             f"(lz4 / tar {sizes['lz4'] / sizes['tar']:.3f}); lz4 packed from the plain dir "
             + (f"earlier ({packed['when']}, " if packed["reused"] else "in this run (")
             + f"{packed['seconds']:.0f} s with --workers {packed['workers']})")]
    s = {k: {p: med([m["seconds"] for m in res[k][p]]) for p in ("first", "remount")} for k in ("tar", "lz4")}
    cache = "page cache dropped before each" if dropped else "page cache NOT dropped"
    for phase, what in (("first", "first mount s (indexes built)"), ("remount", "remount s (indexes loaded)")):
        for kind in ("tar", "lz4"):
            runs = res[kind][phase]
            rss = med([m["proc"]["VmRSS"] for m in runs])
            hwm = med([m["proc"]["VmHWM"] for m in runs])
            rows.append((f"{tag}: {what}, {kind}", f"{s[kind][phase]:.2f}",
                         f"daemon index {med([m['stats']['index_seconds'] for m in runs]):.2f} s; RSS {bs.mb(rss)} MB "
                         f"({(rss - tiny) / n:.0f} B/member above a 100-member mount), HWM {bs.mb(hwm)} MB; "
                         f"{cache}"
                         f"{spread([m['seconds'] for m in runs])}{bs.disturbed(runs)}"))
        rows.append((f"{tag}: {phase} mount ratio tar / lz4 (time)", f"{s['tar'][phase] / s['lz4'][phase]:.2f}x",
                     f"daemon RSS of a 100-member mount: {bs.mb(tiny)} MB" if phase == "first" else ""))
    return rows


# ---------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="/tmp/shardfs-bench-formats", help="datasets, outputs, mountpoint, logs")
    p.add_argument("--repeat", type=int, default=3, help="runs of every timed figure (the median is shown)")
    p.add_argument("--skip-1m", action="store_true", help="skip part 3 (mount time at 1M members)")
    p.add_argument("--skip-jpeg", action="store_true", help="skip part 1a (pack throughput on JPEGs)")
    p.add_argument("--json", help="also write every figure to this JSON file (updated after each part)")
    p.add_argument("--readers", type=int, default=2, help="reader processes for the read passes")
    p.add_argument("--pack-workers", type=int, default=1, help="shardfs pack --workers for the timed packs")
    p.add_argument("--shard-size", type=parse_size, default=parse_size("128M"), help="pack --shard-size (128M)")
    p.add_argument("--jpeg-src", default="/tmp/shardfs-bench/src",
                   help="JPEG folder to pack when it exists (default: tools/bench.py's)")
    p.add_argument("--jpeg-classes", type=int, default=20, help="JPEGs made when --jpeg-src is absent: classes")
    p.add_argument("--jpeg-per-class", type=int, default=100)
    p.add_argument("--jpeg-side", type=int, default=416)
    p.add_argument("--npy-files", type=int, default=2000, help=".npy arrays (default 2000)")
    p.add_argument("--npy-side", type=int, default=224, help="arrays are side x side float32 (224: 196 KiB)")
    p.add_argument("--npy-kind", choices=("mix",) + NPY_KINDS, default="mix",
                   help="labels: class ids in 16x16 blocks; counts: Poisson integers; image8: 8-bit image / 255; "
                        "smooth_q: smooth field quantised to 1/64; smooth: full-precision smooth field "
                        "(incompressible); mix: the first four in turn (default)")
    p.add_argument("--verify-sample", type=int, default=200, help="files compared with the source (sha256, arrays)")
    p.add_argument("--scale-dir", default="/tmp/shardfs-bench-scale/f1000000-s100-c1000",
                   help="tools/bench_scale.py's dataset to reuse for part 3")
    p.add_argument("--members", type=int, default=100_000, help="part 3 dataset size when --scale-dir is absent")
    p.add_argument("--scale-shard-members", type=int, default=10_000, help="pack --shard-members for part 3")
    p.add_argument("--no-drop-caches", action="store_true",
                   help="never drop the page cache (other benchmarks running): cold figures are then not cold")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if min(a.repeat, a.readers, a.pack_workers, a.npy_files, a.npy_side, a.members, a.scale_shard_members) < 1:
        p.error("counts must be positive")
    return a


def run_parts(ctx: Ctx, R: dict, rows: list) -> None:
    """Parts 1a, 1b + 2 and 3 in turn; R and rows grow (and --json is rewritten) after each."""
    a, work = ctx.args, ctx.work
    if not a.skip_jpeg:
        src, desc = jpeg_source(ctx)
        log(f"part 1a: pack throughput, JPEGs: {desc}")
        R["pack_jpeg"] = res = pack_bench(ctx, "JPEG", src)
        res["desc"] = desc
        rows.append(("JPEG source", f"{res['files']:,} files, {res['source_bytes'] / 1e6:,.0f} MB", desc))
        rows += pack_rows("JPEG", res, a.pack_workers)
        save_json(a.json, R)

    src, rels, desc = npy_source(ctx)
    npy_dirs = {"tar": os.path.join(work, "npy-shards", "tar"), "lz4": os.path.join(work, "npy-shards", "lz4")}
    log(f"part 1b: pack throughput, .npy: {desc}")
    R["pack_npy"] = res = pack_bench(ctx, "npy", src, keep={"pack tar": npy_dirs["tar"], "pack lz4": npy_dirs["lz4"]})
    rows.append(("npy source", f"{res['files']:,} files, {res['source_bytes'] / 1e6:,.0f} MB", desc))
    rows += pack_rows("npy", res, a.pack_workers)
    save_json(a.json, R)
    log("part 2: reads of the .npy arrays through tar and lz4 mounts")
    R["reads_npy"] = reads = read_bench(ctx, src, rels, npy_dirs)
    R["npy_shard_bytes"] = sizes = {k: shard_bytes(d) for k, d in npy_dirs.items()}
    rows += read_rows(ctx, reads, sizes, res["source_bytes"])
    save_json(a.json, R)

    if not a.skip_1m:
        log("part 3: mount time and RSS at 1M members, tar vs lz4")
        ds = scale_dataset(ctx)
        log(f"  dataset: {ds['desc']}")
        packed = scale_lz4(ctx, ds)
        dirs = {"tar": ds["tar"], "lz4": packed["dir"]}
        R["scale"] = {"dataset": ds, "lz4_pack": packed}
        R["scale"]["mounts"] = mres = mount_bench(ctx, ds, dirs)
        sizes = {k: shard_bytes(d) for k, d in dirs.items()}
        nshards = {k: len(shard_files(d)) for k, d in dirs.items()}
        R["scale"]["shard_bytes"], R["scale"]["shards"] = sizes, nshards
        rows += mount_rows(ds, mres, sizes, nshards, packed, ctx.can_drop)
        save_json(a.json, R)


def main() -> int:
    a = parse_args()
    work = os.path.abspath(a.workdir)
    os.makedirs(os.path.join(work, "logs"), exist_ok=True)
    mach = machine_facts(work)
    cmdline = shlex.join([sys.executable] + sys.argv)
    print(f"# shardfs formats benchmark: tar vs lz4\n\ncommand: {cmdline}\nmachine: {machine.describe(mach)}\n"
          f"workdir: {work}\n", flush=True)
    can_drop = not a.no_drop_caches and drop_caches()
    log(f"page cache drop: {'yes' if can_drop else 'NO (--no-drop-caches, or not root)'}")
    R: dict = {"machine": mach, "command": cmdline, "params": vars(a), "page_cache_dropped": can_drop}
    rows: list[tuple[str, str, str]] = []
    t_start = time.perf_counter()
    with Mounts() as mounts:
        try:
            run_parts(Ctx(a, work, mounts, can_drop), R, rows)
        except KeyboardInterrupt:
            print("interrupted (mounts are unmounted): reporting what was measured", file=sys.stderr)
    R["table"], R["total_s"] = rows, time.perf_counter() - t_start
    save_json(a.json, R)
    if rows:
        print(f"\n## Results\n\ncommand: `{cmdline}`  \nmachine: {machine.describe(mach)}  \n"
              f"timed figures are medians of {a.repeat} runs; MB = 10^6 bytes; page cache "
              + ("dropped before cold figures and mount timings" if can_drop else "NEVER dropped (cold = not cold)")
              + f"; total {R['total_s'] / 60:.1f} min\n")
        tables.print_rows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
