#!/usr/bin/env python3
"""Compressed tar shards: a by-hand benchmark (not a test). Every timed figure is the median of
--repeat rounds with its spread; the machine is shared (2 cores, other agents): read ratios
within one run, not absolute figures across runs.

1. Codecs: decompression speed on one core (the decompressed MB/s), from memory, of a tar
   stream of JPEGs and one of tiny files: gzip (as ``gzip -6`` writes it) through the standard
   library (zlib) and through ISA-L (PyPI isal: ``igzip``, what shardfs uses, and ``igzip_threaded``
   with one extra thread); zstd (``zstd -3``) through zstandard; xz (``xz -6``) and bzip2 (``-9``)
   through the standard library.
2. Mounts of the JPEGs in --shards shards, as tar, .tar.gz and .tar.zst (the same files):
   * first mount (indexes deleted, page cache dropped) plus a first epoch (every file, random
     order, --readers processes), against the bound of one decompression of every shard with the
     fastest library on one core or the shards' sequential read (cold), the slower of the two;
     and what the daemon read from the device (/proc/PID/io read_bytes) over the shards' size;
   * a later epoch on the same mount, against tar shards';
   * a decode epoch as training runs it (ImageFolder with pil_loader, RandomResizedCrop, a
     DataLoader of --readers workers) after the later epoch, against the plain directory's
     (``--skip-decode``: none);
   * the plain directory the shards were packed from: a first epoch (page cache dropped) and a later
     one, read the same way. What the first epoch takes there is what no filesystem over the same
     files can beat; where it is slower than the bound (zstd: the bound is the storage's read), each
     mount's first figure is also given over it;
   * ratarmount (its own gzip/zstd readers) and archivemount (one mount per shard: it takes one
     archive) on the same .tar.gz files: first mount plus first epoch, then a later epoch.

    .venv/bin/python tools/bench_ctar.py --workdir /tmp/bench-ctar                # ~10 min on 2 cores
    .venv/bin/python tools/bench_ctar.py --per-class 20 --repeat 1 --skip-baselines  # a quick look

Run as root (the page cache is dropped before the first-mount figures). Mounts are always undone.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import io
import lzma
import bz2
import os
import shutil
import subprocess
import sys
import tarfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench import decode_pass, warm_up_decoder  # noqa: E402
from benchlib import readers, tables  # noqa: E402
from benchlib.caches import drop_caches  # noqa: E402
from benchlib.mounts import Mounts  # noqa: E402
from benchlib.sample import make_imagefolder, pack_tar_round_robin  # noqa: E402

CHUNK = 1 << 20


def _read_through(reader) -> int:
    n = 0
    while data := reader.read(CHUNK):
        n += len(data)
    return n


def decoders() -> dict:
    """name -> (codec, decompress(bytes) -> decompressed length), each on this thread (one core;
    igzip_threaded: plus its one reader thread)."""
    import zstandard
    from isal import igzip, igzip_threaded

    return {
        "gzip: zlib (stdlib)": ("gz", lambda d: _read_through(gzip.GzipFile(fileobj=io.BytesIO(d)))),
        "gzip: isal igzip": ("gz", lambda d: _read_through(igzip.GzipFile(fileobj=io.BytesIO(d)))),
        "gzip: isal igzip_threaded(1)": ("gz", lambda d: _read_through(igzip_threaded.open(io.BytesIO(d), "rb",
                                                                                             threads=1))),
        "zstd: zstandard": ("zst", lambda d: _read_through(zstandard.ZstdDecompressor().stream_reader(
            io.BytesIO(d), read_across_frames=True))),
        "xz: lzma (stdlib)": ("xz", lambda d: _read_through(lzma.LZMAFile(io.BytesIO(d)))),
        "bzip2: bz2 (stdlib)": ("bz2", lambda d: _read_through(bz2.BZ2File(io.BytesIO(d)))),
    }


COMPRESS = {"gz": ["gzip", "-6", "-c"], "zst": ["zstd", "-3", "-q", "-c"], "xz": ["xz", "-6", "-c"],
            "bz2": ["bzip2", "-9", "-c"]}
SUFFIX = {"tar": ".tar", "gz": ".tar.gz", "zst": ".tar.zst"}


def shard_files(folder: str) -> list[str]:
    """The shards of one kind's folder (not the indexes beside them)."""
    kind = os.path.basename(folder)
    return sorted(glob.glob(os.path.join(folder, "*" + SUFFIX[kind])))


def compress(kind: str, data: bytes) -> bytes:
    return subprocess.run(COMPRESS[kind], input=data, stdout=subprocess.PIPE, check=True).stdout


def tiny_tar(count: int) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for i in range(count):
            payload = (b"%d," % i) * (20 + i % 60)
            info = tarfile.TarInfo(f"tiny/{i // 1000:04d}/{i:08d}.txt")
            info.size, info.mtime = len(payload), 1_650_000_000
            tar.addfile(info, io.BytesIO(payload))
    return out.getvalue()


def codec_figures(sets: dict[str, bytes], repeat: int) -> dict:
    """{set: {decoder: [MB/s per round]}}, and the compressed sizes."""
    results, sizes = {}, {}
    for set_name, plain in sets.items():
        packed = {kind: compress(kind, plain) for kind in COMPRESS}
        sizes[set_name] = {"tar": len(plain), **{k: len(v) for k, v in packed.items()}}
        results[set_name] = {name: [] for name in decoders()}
        for _ in range(repeat):  # rounds interleaved: a noisy spell hits every decoder alike
            for name, (kind, decode) in decoders().items():
                t = time.perf_counter()
                n = decode(packed[kind])
                results[set_name][name].append(n / (time.perf_counter() - t) / 1e6)
                assert n == len(plain), name
    return {"mbps": results, "sizes": sizes}


def fastest_seconds(paths: list[str], repeat: int) -> float:
    """One decompression of every shard with the fastest library on one core (from memory)."""
    best = []
    for _ in range(repeat):
        total = 0.0
        for path in paths:
            data = open(path, "rb").read()
            kind = "gz" if path.endswith(".gz") else "zst"
            decode = decoders()["gzip: isal igzip" if kind == "gz" else "zstd: zstandard"][1]
            t = time.perf_counter()
            decode(data)
            total += time.perf_counter() - t
        best.append(total)
    return tables.median(best)


def sequential_read_seconds(paths: list[str]) -> float:
    drop_caches()
    t = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.read(8 << 20):
                pass
    return time.perf_counter() - t


def daemon_read_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))


def files_of(roots: list[str]) -> list[str]:
    return [os.path.join(d, n) for root in roots for d, _, names in os.walk(root) for n in names]


def shardfs_rounds(shard_dir: str, work: str, args, mounts: Mounts) -> dict:
    """First mount + first epoch (cold, indexes deleted), then a later epoch, per round."""
    out = {"first": [], "later": [], "decode": [], "read_ratio": [], "counted_ratio": [], "decompressed": []}
    shard_bytes = sum(os.path.getsize(p) for p in shard_files(shard_dir))
    for r in range(args.repeat):
        for idx in glob.glob(os.path.join(shard_dir, "*.shardfs-idx")):
            os.unlink(idx)
        drop_caches()
        mnt = os.path.join(work, "mnt", "shardfs")
        t = time.perf_counter()
        m = mounts.shardfs([shard_dir], mnt, "--cache-size", args.cache_size, log=os.path.join(work, "shardfs.log"))
        files = files_of([mnt])
        first = readers.read_all(files, args.readers, seed=r)
        out["first"].append(time.perf_counter() - t)
        assert first["errors"] == 0, first["first_error"]
        out["read_ratio"].append(daemon_read_bytes(m.pid) / shard_bytes)
        out["later"].append(readers.read_all(files, args.readers, seed=100 + r)["seconds"])
        decode(mnt, r, args, out)
        stats = m.stats()
        out["counted_ratio"].append(stats["cache"]["storage_bytes_read"] / shard_bytes)
        out["decompressed"].append(stats.get("decompressed", {}).get("streams", 0))
        mounts.unmount(m)
    return out


def plain_rounds(plain: str, args) -> dict:
    """The plain directory's epochs: a first (page cache dropped), then a later one."""
    out = {"first": [], "later": [], "decode": []}
    for r in range(args.repeat):
        drop_caches()
        t = time.perf_counter()
        files = files_of([plain])  # (the listing is in the first epoch, as a mount's is)
        first = readers.read_all(files, args.readers, seed=r)
        out["first"].append(time.perf_counter() - t)
        assert first["errors"] == 0, first["first_error"]
        out["later"].append(readers.read_all(files, args.readers, seed=100 + r)["seconds"])
        decode(plain, r, args, out)
    return out


def decode(root: str, r: int, args, out: dict) -> None:
    if not args.skip_decode:
        out["decode"].append(decode_pass(root, {"round": r, "readers": args.readers})["images_per_s"])


def baseline_rounds(name: str, shards: list[str], work: str, args, mounts: Mounts) -> dict:
    out = {"first": [], "later": []}
    for r in range(args.repeat):
        for p in shards:
            for leftover in glob.glob(p + ".index.sqlite"):
                os.unlink(leftover)
        drop_caches()
        t = time.perf_counter()
        if name == "ratarmount":
            mnt = os.path.join(work, "mnt", name)
            exe = os.path.join(os.path.dirname(sys.executable), "ratarmount")
            made = [mounts.spawn([exe, "-f", *shards, mnt], mnt, os.path.join(work, f"{name}.log"))]
        else:  # archivemount: one archive per mount
            made = []
            for i, p in enumerate(shards):
                mnt = os.path.join(work, "mnt", f"{name}-{i}")
                made.append(mounts.spawn(["archivemount", "-f", "-o", "ro,readonly", p, mnt], mnt,
                                         os.path.join(work, f"{name}.log")))
        files = files_of([m.mnt for m in made])
        first = readers.read_all(files, args.readers, seed=r)
        out["first"].append(time.perf_counter() - t)
        out["later"].append(readers.read_all(files, args.readers, seed=100 + r)["seconds"])
        assert first["errors"] == 0, (name, first["first_error"])
        for m in made:
            mounts.unmount(m)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="/tmp/bench-ctar")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--per-class", type=int, default=200)
    ap.add_argument("--side", type=int, default=320, help="JPEG side (320: ~110 KB, ImageNet's mean)")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--tiny", type=int, default=100_000, help="tiny files in the codecs' second set")
    ap.add_argument("--codec-mb", type=int, default=64, help="the JPEG stream's first MB the codecs are timed on")
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cache-size", default="2G")
    ap.add_argument("--skip-baselines", action="store_true")
    ap.add_argument("--skip-decode", action="store_true", help="no ImageFolder + DataLoader decode epochs")
    ap.add_argument("--only", choices=("codecs", "mounts", "prepare"),
                    help="one part alone (prepare: make the files and shards, time nothing)")
    args = ap.parse_args()

    work = args.workdir
    plain = os.path.join(work, "plain")
    if not os.path.isdir(plain):
        make_imagefolder(plain, args.classes, args.per_class, args.side)
    dirs = {k: os.path.join(work, k) for k in ("tar", "gz", "zst")}
    if not os.path.isdir(dirs["tar"]):
        pack_tar_round_robin(os.path.join(plain, "train"), dirs["tar"], args.shards)
    for kind in ("gz", "zst"):
        os.makedirs(dirs[kind], exist_ok=True)
        for p in shard_files(dirs["tar"]):
            out = os.path.join(dirs[kind], os.path.basename(p)[: -len(".tar")] + SUFFIX[kind])
            if not os.path.exists(out):
                with open(out, "wb") as f:
                    f.write(compress(kind, open(p, "rb").read()))
    tar_paths = shard_files(dirs["tar"])
    if args.only == "prepare":
        return
    jpeg_stream = b"".join(open(p, "rb").read() for p in tar_paths)

    if args.only != "mounts":
        codec_part(jpeg_stream, args)
    if args.only != "codecs":
        mount_part(dirs, os.path.join(plain, "train"), work, args)


def codec_part(jpeg_stream: bytes, args) -> None:
    print(f"## Codecs (one core, from memory; {args.repeat} rounds)\n")
    codecs = codec_figures({"JPEGs": jpeg_stream[: args.codec_mb << 20], "tiny files": tiny_tar(args.tiny)},
                           args.repeat)
    for set_name, sizes in codecs["sizes"].items():
        print(f"{set_name}: tar {sizes['tar'] / 1e6:.1f} MB; " +
              ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sizes.items() if k != "tar"))
    print()
    sets = list(codecs["mbps"])
    zlib_key = "gzip: zlib (stdlib)"
    print("| decompressed MB/s | " + " | ".join(sets) + " |\n|---|" + "---:|" * len(sets))
    for name in decoders():
        print(f"| {name} | " + " | ".join(tables.cell(codecs["mbps"][s][name], "{:.0f}",
                                                       tables.median(codecs["mbps"][s][zlib_key]) if name != zlib_key
                                                       else None) for s in sets) + " |")
    print()


LABELS = {"plain directory": "plain directory (first: an epoch, no mount)", "tar": "shardfs, tar",
          "gz": "shardfs, .tar.gz", "zst": "shardfs, .tar.zst"}


def mount_part(dirs: dict, plain: str, work: str, args) -> None:
    if not args.skip_decode:
        warm_up_decoder(plain, args.readers)
    results = {"plain directory": plain_rounds(plain, args)}
    with Mounts() as mounts:
        for kind in ("tar", "gz", "zst"):
            results[kind] = shardfs_rounds(dirs[kind], work, args, mounts)
        if not args.skip_baselines:
            gz_paths = shard_files(dirs["gz"])
            if os.path.exists(os.path.join(os.path.dirname(sys.executable), "ratarmount")):
                results["ratarmount .tar.gz"] = baseline_rounds("ratarmount", gz_paths, work, args, mounts)
            if shutil.which("archivemount"):
                results["archivemount .tar.gz"] = baseline_rounds("archivemount", gz_paths, work, args, mounts)

    nfiles = len(files_of([plain]))  # what the work directory holds (made by an earlier run's options)
    shards = len(shard_files(dirs["tar"]))
    if (nfiles, shards) != (args.classes * args.per_class, args.shards):
        print(f"(the work directory holds {nfiles} JPEGs in {shards} shards, made by an earlier run: "
              f"not --classes x --per-class, --shards; another --workdir makes new ones)\n")
    print(f"## Mounts: {nfiles} JPEGs in {shards} shards, {args.readers} readers, {args.repeat} rounds\n")
    seq = {k: sequential_read_seconds(shard_files(dirs[k])) for k in ("tar", "gz", "zst")}
    for kind in ("gz", "zst"):
        dec = fastest_seconds(shard_files(dirs[kind]), args.repeat)
        bound = max(dec, seq[kind])
        first = tables.median(results[kind]["first"])
        print(f"{kind}: one decompression of every shard, fastest library, one core {dec:.2f} s; sequential read "
              f"{seq[kind]:.2f} s; bound {bound:.2f} s; first mount + first epoch {first:.2f} s"
              f"{tables.spread(results[kind]['first'])}: {tables.ratio(bound / first)} the bound; storage reads "
              f"{tables.median(results[kind]['counted_ratio']):.2f}x the shards (the daemon's count; all its device "
              f"reads, its own code after the page cache drop too: {tables.median(results[kind]['read_ratio']):.2f}x); "
              "decompressions per mount "
              f"{results[kind]['decompressed']}")
        plain_first = tables.median(results["plain directory"]["first"])
        if plain_first > bound:
            print(f"  {kind}: the plain directory's first epoch ({plain_first:.2f} s) is slower than the bound: "
                  f"{tables.ratio(plain_first / first)} of it")
    print()
    tar_later = tables.median(results["tar"]["later"])
    plain_decode = tables.median(results["plain directory"]["decode"]) if not args.skip_decode else None
    print("| method | first mount + first epoch, s | later epoch, s | later epoch files/s | decode epoch images/s |"
          "\n|---|---:|---:|---:|---:|")
    for name, r in results.items():
        label = LABELS.get(name, name)
        rate = [nfiles / s for s in r["later"]]
        print(f"| {label} | {tables.cell(r['first'], '{:.2f}')} | "
              f"{tables.cell(r['later'], '{:.2f}', tar_later if name != 'tar' else None)} | "
              f"{tables.cell(rate, '{:.0f}')} | "
              f"{tables.cell(r.get('decode', []), '{:.0f}', plain_decode if name != 'plain directory' else None)} |")


if __name__ == "__main__":
    main()
