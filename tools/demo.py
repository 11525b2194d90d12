#!/usr/bin/env python3
"""The main job on a built-in sample: pack real JPEGs into tar shards, mount them, train-style read
one epoch with unmodified torchvision ImageFolder + DataLoader, print figures, unmount."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch
from benchlib import sample
from benchlib.cli import shardfs
from torchvision import datasets, transforms


def epoch(root: str, workers: int) -> tuple[int, float]:
    """What a training script does with its data folder; returns (images, seconds)."""
    ds = datasets.ImageFolder(root, transform=transforms.Compose([transforms.RandomResizedCrop(96),
                                                                  transforms.ToTensor()]))
    loader = torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True, num_workers=workers)
    started, seen = time.perf_counter(), 0
    for images, _labels in loader:
        seen += len(images)
    return seen, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--classes", type=int, default=20)
    parser.add_argument("--per-class", type=int, default=40)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="shardfs-demo-") as tmp:
        t = time.perf_counter()
        src = sample.make_imagefolder(os.path.join(tmp, "src"), args.classes, args.per_class, side=160)
        per_shard = -(-args.classes * args.per_class // args.shards)
        packed = shardfs("pack", os.path.join(tmp, "src"), os.path.join(tmp, "shards"), "--prefix", "train",
                         "--shuffle", "--seed", "1", "--shard-members", str(per_shard))
        if packed.returncode != 0:
            print(packed.stderr, file=sys.stderr)
            return 1
        shards = [os.path.join(tmp, "shards", n) for n in os.listdir(os.path.join(tmp, "shards")) if n.endswith(".tar")]
        size = sum(os.path.getsize(p) for p in shards)
        print(f"sample: {args.classes * args.per_class} JPEGs in {args.classes} classes, packed by `shardfs pack` "
              f"into {len(shards)} shuffled tar shards ({size / 1e6:.1f} MB) in {time.perf_counter() - t:.1f} s")

        mnt = os.path.join(tmp, "mnt")
        os.mkdir(mnt)
        t = time.perf_counter()
        done = shardfs("mount", os.path.join(tmp, "shards"), mnt)
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            return 1
        mount_s = time.perf_counter() - t
        try:
            print(done.stdout.strip())
            # Alternate so that neither side gets the warm-up; keep the faster of two epochs each.
            n_plain, plain_s = epoch(src, args.workers)
            n, first_s = epoch(os.path.join(mnt, "train"), args.workers)
            plain_s = min(plain_s, epoch(src, args.workers)[1])
            mounted_s = min(first_s, epoch(os.path.join(mnt, "train"), args.workers)[1])
            stats = json.loads(os.getxattr(mnt, "user.shardfs.stats"))
        finally:
            umount = shardfs("umount", mnt)
            if umount.returncode != 0:
                print(umount.stderr, file=sys.stderr)
        assert n == n_plain
        print(f"mount (indexes written by pack): {mount_s:.2f} s")
        print(f"ImageFolder epoch on the mount:  {n} images, first {n / first_s:,.0f} images/s, "
              f"best {n / mounted_s:,.0f} images/s")
        print(f"same epoch on the plain folder:  {n_plain / plain_s:,.0f} images/s "
              f"(mount/plain = {plain_s / mounted_s:.2f}x)")
        print(f"daemon: {stats['fuse_ops'].get('read', 0)} reads, {stats['bytes_served'] / 1e6:.1f} MB served, "
              f"{stats['read_errors']} errors, peak RSS {stats['rss_peak_bytes'] / 1e6:.0f} MB")
        print("unmounted." if not os.path.ismount(mnt) else "WARNING: still mounted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
