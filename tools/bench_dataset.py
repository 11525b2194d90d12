"""tools/bench.py's dataset: real JPEGs of ImageNet's mean size, their tar shards, a squashfs image.

Made once in the workdir and reused: marker.json records each stage with the parameters it was
made with; a stage is remade (with the stages after it) only when its parameters changed.
`on_capped_storage` makes the JPEGs and shards on benchlib.capped's slow shared storage instead
(tools/bench_tier.py, tools/bench_peers.py).
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import shutil
import tarfile
import time

from benchlib import capped, sample
from benchlib.cli import run, shardfs

MARKER_VERSION = 3
TARGET_JPEG_BYTES = 110_000  # ImageNet train mean


def _gen_class(job) -> int:
    """One class folder, made by benchlib.sample in a scratch dir and moved into place."""
    c, per_class, side, scratch, train = job
    tmp = os.path.join(scratch, f"c{c}")
    shutil.rmtree(tmp, ignore_errors=True)
    sample.make_imagefolder(tmp, classes=1, per_class=per_class, side=side, seed=1000 + c)
    src = os.path.join(tmp, "train", "n00000000")
    for name in os.listdir(src):  # file names carry the class name: rename them too
        os.rename(os.path.join(src, name), os.path.join(src, name.replace("n00000000", f"n{c:08d}", 1)))
    os.rename(src, os.path.join(train, f"n{c:08d}"))
    shutil.rmtree(tmp, ignore_errors=True)
    return c


def tune_side(scratch: str) -> tuple[int, float]:
    """The JPEG side that gives the ImageNet mean (~110 KB) with this Pillow/libjpeg."""
    top = sample.make_imagefolder(os.path.join(scratch, "probe"), classes=2, per_class=30, side=320, seed=4242)
    sizes = [os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(top) for f in fs]
    shutil.rmtree(os.path.join(scratch, "probe"), ignore_errors=True)
    mean320 = sum(sizes) / len(sizes)
    return int(round(320 * math.sqrt(TARGET_JPEG_BYTES / mean320) / 16) * 16), mean320


def _rm(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _save(path: str, marker: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(marker, f, indent=1)
    os.replace(path + ".tmp", path)


def _load(path: str, rebuild: bool) -> dict:
    try:
        with open(path) as f:
            have = json.load(f)
    except (OSError, ValueError):
        return {}
    return {} if rebuild or have.get("version") != MARKER_VERSION else have


def make_jpegs(args, work: str) -> dict:
    src, scratch = os.path.join(work, "src"), os.path.join(work, "scratch")
    for sub in ("src", "shards", "scratch", "image.sqsh"):
        _rm(os.path.join(work, sub))
    os.makedirs(scratch)
    print(f"dataset: making JPEGs in {src} ...", flush=True)
    t0 = time.perf_counter()
    if args.side == "auto":
        side, mean320 = tune_side(scratch)
        print(f"  side=320 gives {mean320 / 1e3:.1f} KB per JPEG here; using side={side} for ~110 KB")
    else:
        side = int(args.side)
    train = os.path.join(src, "train")
    per_class = max(1, args.images // args.classes)
    reuse = getattr(args, "jpegs_from", None)
    if reuse:  # the same JPEGs another run made (generation is seeded by class): copied, not remade
        have = sample.files_under(reuse)
        if len(have) != per_class * args.classes:
            raise SystemExit(f"--jpegs-from {reuse}: {len(have)} JPEGs, not {per_class} in each of {args.classes} classes")
        shutil.copytree(os.path.join(reuse, "train"), train)
    else:
        os.makedirs(train)
        jobs = [(c, per_class, side, scratch, train) for c in range(args.classes)]
        with mp.get_context("fork").Pool(os.cpu_count() or 1) as pool:
            for done, _ in enumerate(pool.imap_unordered(_gen_class, jobs), 1):
                if done % max(1, args.classes // 10) == 0:
                    print(f"  {done}/{args.classes} classes", flush=True)
    _rm(scratch)
    files = sample.files_under(src)
    image_bytes = sum(os.path.getsize(os.path.join(src, f)) for f in files)
    out = {"side": side, "files": len(files), "image_bytes": image_bytes, "mean_jpeg_bytes": image_bytes / len(files),
           "seconds": time.perf_counter() - t0}
    print(f"  {len(files)} JPEGs, {image_bytes / 1e9:.2f} GB, mean {out['mean_jpeg_bytes'] / 1e3:.1f} KB "
          f"({out['seconds']:.0f} s)", flush=True)
    return out


def make_shards(args, work: str, files: int, image_bytes: int) -> dict:
    """`shardfs pack` (shuffled tar shards); benchlib.sample's round-robin packer when it fails."""
    src, out = os.path.join(work, "src"), os.path.join(work, "shards")
    _rm(out)
    t0 = time.perf_counter()
    opts = ["--format", "tar", "--shuffle", "--shard-size", f"{args.shard_size >> 20}M", "--prefix", "train",
            "--workers", str(os.cpu_count() or 1)]
    done = shardfs("pack", src, out, *opts)
    packer = "shardfs pack " + " ".join(opts)
    shards = sorted(os.path.join(out, n) for n in os.listdir(out) if n.endswith(".tar")) if os.path.isdir(out) else []
    if done.returncode != 0 or not shards or not _first_member(shards[0]).startswith("train/"):
        nshards = max(1, math.ceil((image_bytes + 1536 * files) / args.shard_size))
        print(f"  WARNING: `{packer}` failed ({done.returncode}): {done.stderr.strip()[-300:]}; "
              f"packing round-robin into {nshards} shards instead")
        _rm(out)
        shards = sample.pack_tar_round_robin(src, out, nshards)
        packer = f"benchlib.sample.pack_tar_round_robin ({nshards} shards)"
    res = {"paths": shards, "packer": packer, "tar_bytes": sum(os.path.getsize(p) for p in shards),
           "seconds": time.perf_counter() - t0}
    print(f"  packed {len(shards)} tar shards, {res['tar_bytes'] / 1e9:.2f} GB, with {packer} "
          f"({res['seconds']:.0f} s)", flush=True)
    return res


def _first_member(shard: str) -> str:
    with tarfile.open(shard) as tf:
        return next((m.name for m in tf if m.isfile()), "").lstrip("./")


def make_squashfs(work: str) -> dict | None:
    """mksquashfs of the JPEG folder (default compression), for squashfuse_ll and the kernel driver."""
    if not shutil.which("mksquashfs"):
        print("  no mksquashfs (apt-get install squashfs-tools): no squashfs baselines")
        return None
    sqsh = os.path.join(work, "image.sqsh")
    _rm(sqsh)
    t0 = time.perf_counter()
    done = run(["mksquashfs", os.path.join(work, "src"), sqsh, "-noappend", "-quiet", "-no-progress"])
    if done.returncode != 0:
        print(f"  WARNING: mksquashfs failed: {done.stderr.strip()[-300:]}")
        return None
    res = {"path": sqsh, "bytes": os.path.getsize(sqsh), "seconds": time.perf_counter() - t0}
    print(f"  squashfs image {res['bytes'] / 1e9:.2f} GB ({res['seconds']:.0f} s)", flush=True)
    return res


def build(args, work: str) -> dict:
    """Make (or reuse) work/src/train/<class>/*.JPEG, work/shards/*.tar and work/image.sqsh."""
    path = os.path.join(work, "marker.json")
    have = _load(path, args.rebuild)
    marker: dict = {"version": MARKER_VERSION}
    want = {"images": args.images, "classes": args.classes, "side": args.side}
    old = have.get("src") or {}
    if old.get("params") == want and os.path.isdir(os.path.join(work, "src", "train")):
        marker["src"] = old
        print(f"dataset: reusing the JPEGs in {work}/src")
    else:
        have = {}  # everything after depends on the JPEGs
        _save(path, marker)
        marker["src"] = {"params": want, **make_jpegs(args, work)}
    _save(path, marker)

    want = {"shard_size": args.shard_size, "packer": "shardfs-pack"}
    old = have.get("shards") or {}
    if old.get("params") == want and old.get("paths") and all(os.path.exists(p) for p in old["paths"]):
        marker["shards"] = old
        print(f"dataset: reusing {len(old['paths'])} tar shards ({old['packer']})")
    else:
        marker["shards"] = {"params": want, **make_shards(args, work, marker["src"]["files"],
                                                          marker["src"]["image_bytes"])}
    _save(path, marker)

    old = have.get("squashfs") or {}
    marker["squashfs"] = old if old.get("path") and os.path.exists(old["path"]) else make_squashfs(work)
    _save(path, marker)
    return marker


CAPPED_VERSION = 1


def on_capped_storage(args, work: str, stack) -> tuple[str, str, dict]:
    """The capped shared storage (benchlib.capped) attached, holding --dataset-size bytes of JPEGs
    (src/train/<class>/) and their `shardfs pack` shards (shards/); remade when the parameters
    (dataset size, classes, side, shard size) changed. Returns (mountpoint, loop device, marker)."""
    def fill(shared: str) -> dict:
        args.images = args.dataset_size // TARGET_JPEG_BYTES
        jpegs = make_jpegs(args, shared)
        shards = make_shards(args, shared, jpegs["files"], jpegs["image_bytes"])
        return {"files": jpegs["files"], "image_bytes": jpegs["image_bytes"], "side": jpegs["side"],
                "make_s": jpegs["seconds"], "pack_s": shards["seconds"], "packer": shards["packer"]}

    want = {"version": CAPPED_VERSION, "dataset_size": args.dataset_size, "classes": args.classes,
            "side": args.side, "shard_size": args.shard_size}
    # room for the JPEGs, the shards and bench_tier's sweep shard sets (a sparse file: free until used)
    room = int(args.dataset_size * (2.4 + 1.2 * len(getattr(args, "sweep_shards", ())))) + (256 << 20)
    return capped.dataset(work, want, room, fill, args.rebuild, stack)
