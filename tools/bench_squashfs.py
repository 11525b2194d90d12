#!/usr/bin/env python3
"""By-hand benchmark of SquashFS images served by shardfs against squashfuse_ll and a plain
directory (NOT a test; issue 40's targets).

The same sample JPEGs (benchlib.sample, ~110 KB at side 320) as a plain directory and as
mksquashfs images with 128 KiB blocks, lz4 and zstd. Per round and method (order rotated,
caches dropped, fresh mount): the listing, a cold random-order open() read of every file, the
same warm, and an ImageFolder + DataLoader decode epoch. Then a directory of --images-many images
of the same files (or, with --tiny-per-image N, of N tiny files each), mounted as one tree by
shardfs: its first mount's index time against `unsquashfs -lls` of every image. Medians of the
rounds with their [min-max] spread; ratios measured in the same run. Run as root (drop_caches):

    .venv/bin/python tools/bench_squashfs.py --images 2000 --rounds 3
    .venv/bin/python tools/bench_squashfs.py --images 1000 --index-only --rounds 7     # 10 files an image
    .venv/bin/python tools/bench_squashfs.py --tiny-per-image 1000 --index-only --rounds 5

What the index time measures, per round, page cache dropped before each step:
- shardfs: `shardfs mount` (the whole command, until the mount answers) with no index and no saved
  view anywhere, minus the same command again (the indexes and the saved view now exist), so the
  part of the first mount that the images' indexes cost (builds, saving the index files, the tree
  merged), not the daemon's start, which a remount pays too; the whole first mount is printed too;
- `unsquashfs -lls IMAGE` for each image, one after another (it takes one image), output to
  /dev/null, each process's start included: what listing the images costs a user of squashfs-tools.

``--remount-members N`` measures only issue 40's remount and memory per member: N tiny members in
--remount-images images (benchlib.many_members: first mount, remount with the saved view and
without it, the daemon's resident memory per member):

    .venv/bin/python tools/bench_squashfs.py --remount-members 4000000 --remount-images 4 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

from bench import decode_pass
from benchlib import many_members, sample, tables
from benchlib.caches import drop_caches
from benchlib.methods import Data, Plain, ShardFS, SquashfuseLL
from benchlib.mounts import Mounts
from benchlib.rounds import listing_pass, one_round, read_pass, rounds_used, run_rounds
from benchlib.tables import median

PASSES = [("list_fresh", listing_pass), ("cold", read_pass("open", 0)), ("warm", read_pass("open", 100)),
          ("decode", decode_pass)]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="/tmp/shardfs-bench-squashfs")
    p.add_argument("--images", type=int, default=2000, help="JPEGs in the dataset")
    p.add_argument("--classes", type=int, default=20)
    p.add_argument("--side", type=int, default=320)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--readers", type=int, default=2)
    p.add_argument("--images-many", type=int, default=100,
                   help="images of the directory mounted as one tree (0: none, the epochs alone)")
    p.add_argument("--tiny-per-image", type=int, default=0, metavar="N",
                   help="those images hold N files of 200-1,000 random bytes each (100 folders), not the JPEGs")
    p.add_argument("--retries", type=int, default=1)
    p.add_argument("--index-only", action="store_true", help="only the many-images index time, no epochs")
    p.add_argument("--remount-members", type=int, default=0, metavar="N",
                   help="issue 40's remount and memory per member: N tiny members in --remount-images images "
                        "(tar2sqfs, kept in --workdir), --rounds rounds; alone, without the other parts")
    p.add_argument("--remount-images", type=int, default=4)
    return p.parse_args()


def mksquashfs(src: str, image: str, comp: str) -> None:
    subprocess.run(["mksquashfs", src, image, "-comp", comp, "-b", "128K", "-noappend", "-quiet", "-no-progress",
                    "-no-xattrs"], check=True, capture_output=True)


def make_data(args) -> tuple[str, dict[str, Data]]:
    work = args.workdir
    plain = os.path.join(work, "plain")
    if not os.path.isdir(plain):
        sample.make_imagefolder(plain, classes=args.classes, per_class=args.images // args.classes, side=args.side)
    datas = {"plain": Data(plain=plain, shard_dir=plain, work=work)}
    for comp in ("lz4", "zstd"):
        shard_dir = os.path.join(work, comp)
        image = os.path.join(shard_dir, f"train-{comp}.sqfs")
        if not os.path.exists(image):
            os.makedirs(shard_dir, exist_ok=True)
            mksquashfs(plain, image, comp)
        datas[comp] = Data(plain=plain, shard_dir=shard_dir, work=work, squashfs=image,
                           index_dir=os.path.join(work, "indexes", comp))
    return plain, datas


def methods_of(datas: dict[str, Data]) -> dict:
    out = {"plain": Plain(datas["plain"])}
    for comp in ("lz4", "zstd"):
        out[f"shardfs-{comp}"] = ShardFS(datas[comp], name=f"shardfs-{comp}")
        sq = SquashfuseLL(datas[comp])
        sq.name = f"squashfuse_ll-{comp}"
        out[sq.name] = sq
    return out


def many_images(args, plain: str) -> str:
    """--images-many images: file i of the JPEGs in image i % N, each holding train/<class>/<file>;
    or, with --tiny-per-image, each holding its own tiny files train/<folder>/<file>."""
    tiny = args.tiny_per_image
    out = os.path.join(args.workdir, f"many-{args.images_many}" + (f"-tiny-{tiny}" if tiny else ""))
    if os.path.isdir(out) and sum(n.endswith(".sqfs") for n in os.listdir(out)) == args.images_many:
        return out
    os.makedirs(out, exist_ok=True)
    files = [] if tiny else sample.files_under(plain)  # train/<class>/<file>
    rng = random.Random(0)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for k in range(args.images_many):
            part = os.path.join(tmp, str(k))
            for rel in files[k :: args.images_many]:
                os.makedirs(os.path.dirname(os.path.join(part, rel)), exist_ok=True)
                os.link(os.path.join(plain, rel), os.path.join(part, rel))
            for i in range(tiny):
                path = os.path.join(part, "train", f"{i % 100:03d}", f"{k:04d}-{i:06d}.bin")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(rng.randbytes(rng.randint(200, 1000)))
            mksquashfs(part, os.path.join(out, f"part-{k:04d}.sqfs"), "zstd")
            shutil.rmtree(part)
    return out


def index_times(args, many: str, mounts: Mounts) -> dict[str, list[float]]:
    """Per round: shardfs's first mount (no index, no saved view) minus its remount, and
    `unsquashfs -lls` of every image one after another; page cache dropped before each."""
    images = sorted(os.path.join(many, n) for n in os.listdir(many) if n.endswith(".sqfs"))
    got: dict[str, list[float]] = {"shardfs first mount s": [], "shardfs remount s": [], "shardfs index s": [],
                                   "unsquashfs -lls s": []}
    data = Data(plain=many, shard_dir=many, work=args.workdir)
    for r in range(args.rounds):
        cache = tempfile.mkdtemp(dir=args.workdir)
        os.environ["XDG_CACHE_HOME"] = cache  # no saved view, no index from an earlier round
        index_dir = os.path.join(cache, "idx")
        method = ShardFS(Data(plain=many, shard_dir=many, work=data.work, index_dir=index_dir), name="shardfs-many")
        method.forget_indexes()  # any index beside the images (a mount without --index-dir wrote it)
        times = []
        for _ in range(2):
            drop_caches()
            t0 = time.perf_counter()
            m = method.mount(mounts)
            times.append(time.perf_counter() - t0)
            mounts.unmount(m)
        shutil.rmtree(cache)
        drop_caches()
        t0 = time.perf_counter()
        for image in images:
            subprocess.run(["unsquashfs", "-lls", image], check=True, stdout=subprocess.DEVNULL)
        got["unsquashfs -lls s"].append(time.perf_counter() - t0)
        got["shardfs first mount s"].append(times[0])
        got["shardfs remount s"].append(times[1])
        got["shardfs index s"].append(times[0] - times[1])
        print(f"round {r + 1}: first mount {times[0]:.2f} s, remount {times[1]:.2f} s, "
              f"unsquashfs -lls {got['unsquashfs -lls s'][-1]:.2f} s", flush=True)
    return got


def main() -> int:
    args = parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    if args.remount_members:
        with Mounts() as mounts:
            _, targets = many_members.run(mounts, args.workdir, "squashfs", args.remount_members, args.remount_images,
                                          args.rounds)
        print()
        tables.print_targets(targets, "issue 40 target")
        return 0
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(dir=args.workdir)
    plain, datas = make_data(args)
    methods = methods_of(datas)
    names = sample.files_under(plain)
    files = len(names)
    print(f"{files} JPEGs, {sum(os.path.getsize(os.path.join(plain, f)) for f in names) / files / 1e3:.0f} KB mean; "
          f"machine shared with other jobs: figures are noisy", flush=True)
    targets: list[dict] = []
    with Mounts() as mounts:
        if not args.index_only:
            targets = epochs(args, methods, files, mounts)
        idx = index_times(args, many_images(args, plain), mounts) if args.images_many else None
    print()
    if idx is None:  # --images-many 0: the epochs alone
        tables.print_targets(targets, "issue 40 target")
        return 0
    what = f"{args.tiny_per_image} tiny files each" if args.tiny_per_image else f"{files // args.images_many} JPEGs each"
    for k, v in idx.items():
        print(f"{args.images_many} images of {what} as one tree, {k}: {median(v):.2f} [{min(v):.2f}-{max(v):.2f}]")
    ratios = [s / u for s, u in zip(idx["shardfs index s"], idx["unsquashfs -lls s"])]
    print(f"index time / unsquashfs -lls, round by round: {median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]; "
          f"whole first mount / unsquashfs -lls: "
          f"{median(idx['shardfs first mount s']) / median(idx['unsquashfs -lls s']):.2f}x")
    targets.append(tables.target(f"{args.images_many} images: index time <= 1.5x unsquashfs -lls", "shardfs",
                                 median(idx["shardfs index s"]), median(idx["unsquashfs -lls s"]), "<= 1.5"))
    print()
    tables.print_targets(targets, "issue 40 target")
    return 0


def epochs(args, methods: dict, files: int, mounts: Mounts) -> list[dict]:
    """The rounds of every method, their table, and the epoch targets."""
    res = run_rounds(methods, args.rounds, lambda meth, r: one_round(meth, mounts, PASSES, r, args.readers, 0.0, files),
                     args.retries, 0.25)
    used, used_row = rounds_used(res["rounds"])
    rate = {"cold": "files_per_s", "warm": "files_per_s", "decode": "images_per_s"}
    rows = [used_row] + [(label, "{:,.0f}", {n: [r[k][rate[k]] for r in rs] for n, rs in used.items()}, "plain")
                         for k, label in (("cold", "cold open() files/s"), ("warm", "warm open() files/s"),
                                          ("decode", "decode epoch images/s"))]
    tables.print_table(list(methods), rows)
    summ = {n: {k: median([r[k][rate[k]] for r in rs]) for k in rate} for n, rs in used.items()}
    targets, t = [], tables.target
    for comp in ("lz4", "zstd"):
        s, sq, p = summ.get(f"shardfs-{comp}"), summ.get(f"squashfuse_ll-{comp}") or {}, summ.get("plain") or {}
        if s:
            targets += [t(f"{comp}: cold open() files/s >= 1.3x squashfuse_ll", f"shardfs-{comp}", s["cold"],
                          sq.get("cold"), ">= 1.3"),
                        t(f"{comp}: warm open() files/s >= 1.3x squashfuse_ll", f"shardfs-{comp}", s["warm"],
                          sq.get("warm"), ">= 1.3"),
                        t(f"{comp}: decode images/s >= 0.95x plain", f"shardfs-{comp}", s["decode"],
                          p.get("decode"), ">= 0.95")]
    return targets


if __name__ == "__main__":
    sys.exit(main())
