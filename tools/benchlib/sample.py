"""A small built-in sample: real JPEGs in ImageFolder class folders, and tar shards of them.

Used by the demo, the tests and the benchmarks, so all of them run on real image data
without downloading anything. Needs Pillow.
"""

from __future__ import annotations

import hashlib
import os
import tarfile

import numpy as np


def make_imagefolder(root: str, classes: int = 10, per_class: int = 20, side: int = 96,
                     seed: int = 0, split: str = "train") -> str:
    """Write ``root/<split>/<class>/<n>.JPEG`` and return ``root/<split>``.

    Images are smooth colour fields plus noise: they decode like photos and, at
    side=320, come out near ImageNet's ~110 KB mean.
    """
    from PIL import Image

    rng = np.random.default_rng(seed)
    top = os.path.join(root, split)
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float32) / side
    for c in range(classes):
        folder = os.path.join(top, f"n{c:08d}")
        os.makedirs(folder, exist_ok=True)
        for i in range(per_class):
            base = rng.uniform(0, 255, size=3)
            slope = rng.uniform(-120, 120, size=(2, 3))
            field = base + xx[..., None] * slope[0] + yy[..., None] * slope[1]
            noise = rng.normal(0, 40, size=(side, side, 3))
            pixels = np.clip(field + noise, 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(os.path.join(folder, f"n{c:08d}_{i}.JPEG"), quality=90)
    return top


def files_under(root: str) -> list[str]:
    """Relative paths of every file below root, sorted."""
    found = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            found.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(found)


def dirs_under(root: str) -> list[str]:
    """Relative paths of every directory below root, sorted."""
    return sorted(os.path.relpath(os.path.join(top, name), root) for top, names, _ in os.walk(root) for name in names)


def digests(root: str) -> dict[str, str]:
    """The sha256 of every file below root, by relative path."""
    found = {}
    for rel in files_under(root):
        with open(os.path.join(root, rel), "rb") as f:
            found[rel] = hashlib.sha256(f.read()).hexdigest()
    return found


def pack_tar_round_robin(root: str, out_dir: str, shards: int = 4, prefix: str = "train") -> list[str]:
    """Tar shards of every file under root, dealt round-robin so that classes span shards.

    A stand-in for ``shardfs pack`` with no options: enough for the sample and tests.
    """
    os.makedirs(out_dir, exist_ok=True)
    files = files_under(root)
    paths = [os.path.join(out_dir, f"{prefix}-{i:06d}.tar") for i in range(shards)]
    outs = [tarfile.open(p, "w", format=tarfile.PAX_FORMAT) for p in paths]
    try:
        for i, rel in enumerate(files):
            outs[i % shards].add(os.path.join(root, rel), arcname=rel, recursive=False)
    finally:
        for out in outs:
            out.close()
    return paths
