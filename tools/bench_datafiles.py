#!/usr/bin/env python3
"""By-hand benchmark of issue 24 (NOT a test): the same JPEGs as the hub's Parquet (written by
`datasets`), the JSC course's Arrow IPC file and HDF5 file, and tar shards (`shardfs pack`), each
mounted by shardfs from shared storage capped like an HDD-backed store (tools/bench_tier.py's
loop-mounted ext4 image and blkio cgroup, reused), read as training code reads.

Per format and round:

  mount           `shardfs mount` with its indexes deleted (built) and again (loaded), capped
  index bytes     the .shardfs-idx files per member
  listing         ImageFolder's listing of a fresh mount (benchlib.readers)
  cold open()     drop_caches, a fresh mount, every file once in a random order, --readers
                  processes with open(p, 'rb').read(); next to the sequential bound of the same
                  files (dd iflag=direct of them all: bytes/s / bytes per image = files/s)
  warm open()     the same pass again on that mount
  decode          torchvision ImageFolder + DataLoader (--workers, the transform below) on the
                  mount (all four mounts up, every file read once more beforehand, as the
                  anchors' files are); against its own Dataset and, for the data files,
                  ImageFolder on the plain JPEG folder, taking turns (--decode-slices passes
                  each, the order turning and reversing); images/s of each pass's steady state
                  (from every worker's first batch to the last whole round of workers);
                  formats in an order rotated by round
  own Dataset     the format's own Dataset class on the same files, same transform and DataLoader:
                  `datasets.load_dataset("parquet")` (its Arrow cache made beforehand, not timed),
                  the course's Arrow and HDF5 classes (shared/seeds); for tar, ImageFolder on the
                  plain JPEG folder (local disk) as a reference. All of them (data files,
                  the Arrow cache, the JPEGs) in the page cache first.

Targets: decode through the mount >= 0.95x the format's own Dataset class and >= 0.95x tar's;
cold reads >= 0.8x the sequential bound. Ratios are taken within a round; medians [min-max].

Run as root (loop device, blkio cgroup, drop_caches):

    .venv/bin/python tools/bench_datafiles.py --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import io
import os
import random
import shutil
import statistics
import sys
import time

import bench_tier as tier  # the capped shared storage
from benchlib import capped
from benchlib.caches import drop_caches
from benchlib.cli import shardfs
from benchlib.mounts import Mounts
from benchlib.readers import read_all, timed_listing
from benchlib.rounds import until_interrupted
from benchlib.sample import make_imagefolder
from benchlib.tables import cell

FORMATS = ("parquet", "arrow", "hdf5", "tar")


# ---------------------------------------------------------------------------------------------
# the files, written as their users write them


def samples(jpegs: str) -> tuple[list[str], list[tuple[int, str, str]]]:
    """(class names, (label, file name, path) of every JPEG) of an ImageFolder tree."""
    train = os.path.join(jpegs, "train")
    classes = sorted(os.listdir(train))
    return classes, [(i, n, os.path.join(train, c, n)) for i, c in enumerate(classes)
                     for n in sorted(os.listdir(os.path.join(train, c)))]


def write_parquet(classes, rows, out: str, files: int) -> None:
    """As the Hugging Face hub: datasets' to_parquet with Image() and ClassLabel names."""
    import datasets

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=classes)})
    ds = datasets.Dataset.from_dict({"image": [{"bytes": open(p, "rb").read(), "path": n} for _, n, p in rows],
                                     "label": [label for label, _, _ in rows]}, features=features)
    for i in range(files):
        ds.shard(files, i, contiguous=True).to_parquet(os.path.join(out, f"train-{i:05d}-of-{files:05d}.parquet"))


def write_arrow(rows, out: str) -> None:
    """As the JSC course: one record batch per sample, image_data binary, label uint16."""
    import pyarrow as pa

    schema = pa.schema([pa.field("image_data", pa.binary()), pa.field("label", pa.uint16())])
    with pa.OSFile(os.path.join(out, "ImageNet-train.arrow"), "wb") as f, pa.ipc.new_file(f, schema) as writer:
        for label, _, path in rows:
            with open(path, "rb") as img:
                data = img.read()
            writer.write(pa.record_batch([pa.array([data], type=pa.binary()), pa.array([label], type=pa.uint16())],
                                         schema=schema))


def write_hdf5(rows, out: str) -> None:
    """As the JSC course: a group per split, vlen uint8 images, int16 targets."""
    import h5py
    import numpy as np

    with h5py.File(os.path.join(out, "ImageNet.h5"), "w") as f:
        group = f.create_group("train")
        images = group.create_dataset("images", (len(rows),), dtype=h5py.vlen_dtype(np.dtype(np.uint8)))
        targets = group.create_dataset("targets", (len(rows),), dtype=np.dtype("int16"))
        for idx, (label, _, path) in enumerate(rows):
            with open(path, "rb") as img:
                images[idx] = np.frombuffer(img.read(), dtype=np.uint8)
            targets[idx] = label


def make_files(args, shared: str, jpegs: str) -> dict:
    classes, rows = samples(jpegs)
    for fmt in FORMATS:
        os.makedirs(os.path.join(shared, fmt), exist_ok=True)
    write_parquet(classes, rows, os.path.join(shared, "parquet"), args.parquet_files)
    write_arrow(rows, os.path.join(shared, "arrow"))
    write_hdf5(rows, os.path.join(shared, "hdf5"))
    shardfs("pack", jpegs, os.path.join(shared, "tar"), "--prefix", "train", "--shard-size", "64M", check=True)
    return {"files": len(rows), "image_bytes": sum(os.path.getsize(p) for _, _, p in rows)}


def data_files(shared: str, fmt: str) -> list[str]:
    ext = {"parquet": ".parquet", "arrow": ".arrow", "hdf5": ".h5", "tar": ".tar"}[fmt]
    return sorted(glob.glob(os.path.join(shared, fmt, f"*{ext}")))


# ---------------------------------------------------------------------------------------------
# the formats' own Dataset classes (the course's, from shared/seeds; datasets' for Parquet)


class CourseArrow:
    def __init__(self, path: str, transform):
        import pyarrow as pa

        self.path, self.transform, self.reader = path, transform, None
        with pa.OSFile(path, "rb") as f:
            self.n = pa.ipc.open_file(f).num_record_batches

    def __len__(self):
        return self.n

    def __getitem__(self, idx):
        import pyarrow as pa
        from PIL import Image

        if self.reader is None:
            self.reader = pa.ipc.open_file(pa.OSFile(self.path, "rb"))
        row = self.reader.get_batch(idx)
        with io.BytesIO(row["image_data"][0].as_py()) as stream, Image.open(stream) as img:
            return self.transform(img.convert("RGB")), row["label"][0].as_py()


class CourseHdf5:
    def __init__(self, path: str, transform, split: str = "train"):
        import h5py

        self.path, self.split, self.transform, self.imgs = path, split, transform, None
        with h5py.File(path, "r") as f:
            self.n = len(f[split]["targets"])

    def __len__(self):
        return self.n

    def __getitem__(self, idx):
        import h5py
        from PIL import Image

        if self.imgs is None:
            group = h5py.File(self.path, "r")[self.split]
            self.imgs, self.targets = group["images"], group["targets"]
        with io.BytesIO(self.imgs[idx].tobytes()) as stream, Image.open(stream) as img:
            return self.transform(img.convert("RGB")), int(self.targets[idx])


def hub_dataset(files: list[str], cache: str, transform):
    import datasets

    ds = datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=cache)
    ds.set_transform(lambda b: {"x": [transform(im.convert("RGB")) for im in b["image"]], "label": b["label"]})
    return ds


def transform():
    from torchvision import transforms

    return transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                               transforms.ToTensor()])


def decode_seconds(ds, workers: int, batch: int, picked: list[int]) -> tuple[int, float]:
    """(images, seconds) of a DataLoader over the samples ``picked`` of ``ds`` in its steady state:
    from the moment every worker has delivered its first batch to the last batch of a whole round
    of workers (whole batches only). Timing from the very first batch instead counts the other
    workers' first batches, made mostly before the clock starts, by as much as 1/batches of the
    pass, and by an amount that depends on how far apart the workers happened to start."""
    import torch

    loader = torch.utils.data.DataLoader(torch.utils.data.Subset(ds, picked), batch_size=batch,
                                         num_workers=workers, drop_last=True)
    arrived = [time.perf_counter() for _ in loader]
    per_round = max(workers, 1)  # batches, one from each worker
    rounds = len(arrived) // per_round
    if rounds < 2:
        raise ValueError(f"{len(picked)} images make {len(arrived)} batches: too few for {workers} workers")
    first, last = per_round - 1, rounds * per_round - 1
    return (last - first) * batch, arrived[last] - arrived[first]


def own_dataset(ctx, fmt: str):
    files = data_files(ctx.shared, fmt)
    if fmt == "parquet":
        return hub_dataset(files, os.path.join(ctx.work, "hf-cache"), transform())
    if fmt == "arrow":
        return CourseArrow(files[0], transform())
    if fmt == "hdf5":
        return CourseHdf5(files[0], transform())
    from torchvision.datasets import ImageFolder

    return ImageFolder(os.path.join(ctx.jpegs, "train"), transform=transform())


# ---------------------------------------------------------------------------------------------
# one round


def timed_mount(ctx, fmt: str, name: str):
    t0 = time.perf_counter()
    m = ctx.mounts.shardfs([os.path.join(ctx.shared, fmt)], os.path.join(ctx.work, "mnt", name),
                           log=os.path.join(ctx.work, f"{name}.log"))
    return m, time.perf_counter() - t0


def one_format(ctx, fmt: str, r: int):
    """Mounts, index, listing, cold and warm reads of one format; (figures, its mount, still up)."""
    a, out = ctx.args, {}
    files = data_files(ctx.shared, fmt)
    for idx in glob.glob(os.path.join(ctx.shared, fmt, "*.shardfs-idx")):
        os.unlink(idx)
    drop_caches()
    m, out["mount_built_s"] = timed_mount(ctx, fmt, fmt)
    ctx.mounts.unmount(m)
    idx = glob.glob(os.path.join(ctx.shared, fmt, "*.shardfs-idx"))
    out["index_bytes_per_member"] = sum(os.path.getsize(p) for p in idx) / ctx.marker["files"]

    out["seq"] = tier.sequential_bound(files, ctx.marker["files"], ctx.cap)
    drop_caches()
    m, out["mount_loaded_s"] = timed_mount(ctx, fmt, fmt)
    try:
        root = os.path.join(m.mnt, "train")
        paths, out["listing_s"] = timed_listing(root)
        if len(paths) != ctx.marker["files"]:
            raise RuntimeError(f"{fmt}: the listing has {len(paths)} of {ctx.marker['files']} files")
        for name, seed in (("cold", r), ("warm", r + 100)):
            got = read_all(paths, a.readers, "open", seed)
            if got["errors"] or got["files"] != len(paths):
                raise RuntimeError(f"{fmt} {name}: {got['errors']} errors ({got['first_error']})")
            out[f"{name}_fps"] = got["files_per_s"]
    except BaseException:
        ctx.mounts.unmount(m)
        raise
    print(f"  {fmt}: mount {out['mount_built_s']:.1f}/{out['mount_loaded_s']:.2f} s, "
          f"{out['index_bytes_per_member']:.0f} B/member, listing {out['listing_s']:.2f} s, cold "
          f"{out['cold_fps']:.0f} (bound {out['seq']['fps']:.0f}), warm {out['warm_fps']:.0f} files/s", flush=True)
    return out, m


def decode_passes(ctx, r: int, figures: dict, mounts: dict) -> None:
    """Decode through each mount, through each format's own Dataset and (for the data files)
    through ImageFolder on the plain JPEG folder: what ImageFolder itself costs, without the mount.
    The random images are cut into --decode-slices slices, each read by every side in turn, the
    order turning from slice to slice and running backwards every other cycle (A B, B A, ...), so
    that a drift of the machine's speed falls alike on all; formats in an order rotated by round.
    Every side reads from the page cache, as a later epoch does: every file of the mounts and
    every file the anchors read (the data files, `datasets`' Arrow cache, the JPEG folder) is read
    beforehand (the cold passes of later formats dropped the caches)."""
    from torchvision.datasets import ImageFolder

    a = ctx.args
    mounted = [os.path.join(d, n) for m in mounts.values() for d, _, names in os.walk(m.mnt) for n in names]
    for path in anchor_files(ctx) + mounted:
        with open(path, "rb") as f:
            while f.read(8 << 20):
                pass
    order = FORMATS[r % len(FORMATS):] + FORMATS[:r % len(FORMATS)]
    for fmt in order:
        sides = {"decode_ips": ImageFolder(os.path.join(mounts[fmt].mnt, "train"), transform=transform()),
                 "own_ips": own_dataset(ctx, fmt)}
        if fmt != "tar":  # tar's own Dataset is that folder already
            sides["folder_ips"] = ImageFolder(os.path.join(ctx.jpegs, "train"), transform=transform())
        # the same random images for every format (each writes the JPEGs in the same order)
        picked = random.Random(r).sample(range(ctx.marker["files"]), min(a.decode_images, ctx.marker["files"]))
        keys = list(sides)
        keys = keys[r % len(keys):] + keys[:r % len(keys)]
        done = {key: [0, 0.0] for key in keys}
        for i in range(a.decode_slices):
            turn = keys[i % len(keys):] + keys[:i % len(keys)]
            for key in turn[::-1] if (i // len(keys)) % 2 else turn:
                n, secs = decode_seconds(sides[key], a.workers, a.batch, picked[i::a.decode_slices])
                done[key][0] += n
                done[key][1] += secs
        for key, (n, secs) in done.items():
            figures[fmt][key] = n / secs
        folder = f", {figures[fmt]['folder_ips']:.0f} with ImageFolder on the plain folder" if "folder_ips" in done else ""
        print(f"  {fmt}: decode {figures[fmt]['decode_ips']:.0f} img/s through the mount, "
              f"{figures[fmt]['own_ips']:.0f} with its own Dataset{folder}", flush=True)


def anchor_files(ctx) -> list[str]:
    """What the own Datasets read: the data files, `datasets`' Arrow cache, the JPEG folder."""
    found = [p for fmt in FORMATS for p in data_files(ctx.shared, fmt)]
    for top in (os.path.join(ctx.work, "hf-cache"), os.path.join(ctx.jpegs, "train")):
        found += [os.path.join(d, n) for d, _, names in os.walk(top) for n in names]
    return found


def one_round(ctx, r: int) -> dict:
    figures, mounts = {}, {}
    try:
        for fmt in FORMATS:
            figures[fmt], mounts[fmt] = one_format(ctx, fmt, r)
        decode_passes(ctx, r, figures, mounts)
    finally:
        for m in mounts.values():
            ctx.mounts.unmount(m)
    return figures


# ---------------------------------------------------------------------------------------------
# report


def report(rounds: list[dict]) -> None:
    def col(fmt, key, sub=None):
        return [rd[fmt][key][sub] if sub else rd[fmt][key] for rd in rounds]

    def ratio(fmt, num, den, den_fmt=None, den_sub=None):
        return [rd[fmt][num] / (rd[den_fmt or fmt][den][den_sub] if den_sub else rd[den_fmt or fmt][den])
                for rd in rounds]

    def folder(fmt):  # the plain folder's side: tar's own Dataset is that folder
        return "own_ips" if fmt == "tar" else "folder_ips"

    print()
    print(f"Medians [min-max] of {len(rounds)} rounds:")
    print()
    print("| figure | " + " | ".join(FORMATS) + " |")
    print("|---|" + "---:|" * len(FORMATS))
    lines = [
        ("mount, indexes built, s", lambda f: cell(col(f, "mount_built_s"), "{:.2f}")),
        ("mount, indexes loaded, s", lambda f: cell(col(f, "mount_loaded_s"), "{:.2f}")),
        ("index bytes per member", lambda f: cell(col(f, "index_bytes_per_member"), "{:.0f}")),
        ("ImageFolder listing, fresh mount, s", lambda f: cell(col(f, "listing_s"), "{:.3f}")),
        ("cold open(), files/s", lambda f: cell(col(f, "cold_fps"), "{:,.0f}")),
        ("sequential bound of the files, files/s", lambda f: cell(col(f, "seq", "fps"), "{:,.0f}")),
        ("cold / sequential bound (target 0.8x)", lambda f: cell(ratio(f, "cold_fps", "seq", den_sub="fps"),
                                                                  "{:.2f}x")),
        ("warm open(), files/s", lambda f: cell(col(f, "warm_fps"), "{:,.0f}")),
        ("decode, ImageFolder + DataLoader on the mount, img/s", lambda f: cell(col(f, "decode_ips"), "{:.0f}")),
        ("decode, the format's own Dataset, img/s", lambda f: cell(col(f, "own_ips"), "{:.0f}")),
        ("decode, ImageFolder on the plain JPEG folder, img/s", lambda f: cell(col(f, folder(f)), "{:.0f}")),
        ("mount decode / own Dataset (target 0.95x)", lambda f: cell(ratio(f, "decode_ips", "own_ips"), "{:.2f}x")),
        ("mount decode / plain folder decode", lambda f: cell(ratio(f, "decode_ips", folder(f)), "{:.2f}x")),
        ("plain folder decode / own Dataset",
         lambda f: "-" if f == "tar" else cell(ratio(f, "folder_ips", "own_ips"), "{:.2f}x")),
        ("mount decode / tar's mount decode (target 0.95x)",
         lambda f: cell(ratio(f, "decode_ips", "decode_ips", den_fmt="tar"), "{:.2f}x")),
    ]
    for title, fn in lines:
        print(f"| {title} | " + " | ".join(fn(f) for f in FORMATS) + " |")
    print()
    print("tar's own Dataset: ImageFolder on the plain JPEG folder (local disk, page cache), the same\n"
          "folder as the plain-folder row: ImageFolder's own cost against each format's Dataset class.")
    for f in FORMATS:
        checks = [("cold >= 0.8x bound", ratio(f, "cold_fps", "seq", den_sub="fps"), 0.8),
                  ("decode >= 0.95x own", ratio(f, "decode_ips", "own_ips"), 0.95)]
        if f != "tar":
            checks.append(("decode >= 0.95x tar", ratio(f, "decode_ips", "decode_ips", den_fmt="tar"), 0.95))
        print(f"{f}: " + "; ".join(f"{name} {'PASS' if statistics.median(v) >= want else 'FAIL'} "
                                   f"({statistics.median(v):.2f}x)" for name, v, want in checks))


# ---------------------------------------------------------------------------------------------


class Ctx:
    pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="/var/tmp/shardfs-bench-datafiles")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--per-class", type=int, default=200)
    parser.add_argument("--side", type=int, default=416, help="JPEG side (416: ~110 KB, ImageNet's mean)")
    parser.add_argument("--parquet-files", type=int, default=4, help="train-0000K-of-0000N.parquet files")
    parser.add_argument("--iops", type=int, default=200, help="read IOPS cap of the shared storage")
    parser.add_argument("--bps", type=int, default=150_000_000, help="read bytes/s cap")
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--decode-images", type=int, default=2000,
                        help="images each side decodes per round (a random sample, the same for every format)")
    parser.add_argument("--decode-slices", type=int, default=4,
                        help="passes the images are cut into, the sides taking turns (A B, B A, ...)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ctx = Ctx()
    ctx.args, ctx.work = args, capped.begin(parser, args)
    os.environ["HF_DATASETS_CACHE"] = os.path.join(ctx.work, "hf-cache")
    ctx.jpegs = os.path.join(ctx.work, f"jpegs-{args.side}")
    want = args.classes * args.per_class
    if not os.path.isdir(ctx.jpegs) or len(samples(ctx.jpegs)[1]) != want:
        shutil.rmtree(ctx.jpegs, ignore_errors=True)
        t0 = time.perf_counter()
        make_imagefolder(ctx.jpegs, classes=args.classes, per_class=args.per_class, side=args.side)
        print(f"made {want} JPEGs in {time.perf_counter() - t0:.0f} s")
    image_bytes = sum(os.path.getsize(p) for _, _, p in samples(ctx.jpegs)[1])
    with contextlib.ExitStack() as stack:
        image = os.path.join(ctx.work, "shared.img")
        capped.make_image(image, int(image_bytes * 4 * 1.3) + (256 << 20))
        ctx.shared = os.path.join(ctx.work, "shared")
        ctx.dev = capped.attach_image(image, ctx.shared, stack)
        stack.callback(shutil.rmtree, os.path.join(ctx.work, "hf-cache"), True)
        t0 = time.perf_counter()
        ctx.marker = make_files(args, ctx.shared, ctx.jpegs)
        m = ctx.marker
        print(f"dataset: {m['files']} JPEGs, mean {m['image_bytes'] / m['files'] / 1e3:.1f} KB, as "
              + ", ".join(f"{f} {sum(os.path.getsize(p) for p in data_files(ctx.shared, f)) / 1e6:.0f} MB"
                          for f in FORMATS)
              + f" (written in {time.perf_counter() - t0:.0f} s); shared storage {ctx.dev} capped at "
              f"{args.iops} IOPS, {args.bps / 1e6:.0f} MB/s", flush=True)
        for fmt in ("parquet",):  # datasets' Arrow cache of the Parquet files, made before any timing
            own_dataset(ctx, fmt)
        ctx.cap = None
        stack.callback(lambda: ctx.cap and ctx.cap.close())
        ctx.mounts = stack.enter_context(Mounts())
        ctx.cap = capped.ReadCap(ctx.dev, args.iops, args.bps)
        rounds = until_interrupted(args.rounds, lambda r: one_round(ctx, r))
        if rounds:
            report(rounds)
    return 0 if rounds else 1


if __name__ == "__main__":
    sys.exit(main())
