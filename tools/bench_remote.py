#!/usr/bin/env python3
"""Shard fetch rate from remote stores over loopback, against local disk (run by hand).

Makes a dataset of tar shards (default 12 x 25 MB of 100 KB incompressible members), serves
the same shards from moto's S3 server and from nginx, and for each source mounts them
afresh (index already cached, RAM cache empty) and reads every file through the mount with
8 threads, so every shard streams into the cache whole (8 MiB ranged GETs, --loaders at once).
Prints MB/s (shard bytes / wall time), median of --runs runs, and the ratio to local disk
measured in the same run.

    .venv/bin/python tools/bench_remote.py [--shards 12] [--shard-mb 25] [--runs 3] [--work DIR]

Needs the remote extra, moto[server] and nginx (tools/setup.sh installs them). Every server
and mount it starts is stopped (by pid) and unmounted on the way out, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from benchlib.cli import shardfs
from benchlib.mounts import stop_child
from benchlib.servers import ACCESS_KEY, SECRET_KEY, start_moto, start_nginx

MEMBER = 100_000


def make_shards(out: str, shards: int, shard_mb: int) -> int:
    os.makedirs(out, exist_ok=True)
    per_shard = shard_mb * 1_000_000 // MEMBER
    total = 0
    for s in range(shards):
        path = os.path.join(out, f"train-{s:06d}.tar")
        if not os.path.exists(path):
            with tarfile.open(path + ".tmp", "w", format=tarfile.USTAR_FORMAT) as tar:
                for i in range(per_shard):
                    info = tarfile.TarInfo(f"train/c{i % 10}/s{s:03d}_{i:05d}.bin")
                    info.size, info.mtime = MEMBER, 1.7e9
                    tar.addfile(info, io.BytesIO(os.urandom(MEMBER)))
            os.replace(path + ".tmp", path)
        total += os.path.getsize(path)
    return total


def drop_page_cache(folder: str) -> None:
    for name in os.listdir(folder):
        fd = os.open(os.path.join(folder, name), os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def read_all(root: str) -> int:
    paths = [os.path.join(d, f) for d, _, files in os.walk(root) for f in files]

    def read(path: str) -> int:
        with open(path, "rb") as f:
            return len(f.read())

    with ThreadPoolExecutor(8) as pool:
        return sum(pool.map(read, paths))


def one_run(source: str, options: list[str], mnt: str, env: dict, log: str, expect: int) -> tuple[float, dict]:
    shardfs("mount", source, mnt, "--cache-size", "4G", "--log-file", log, *options, env=env, check=True)
    try:
        started = time.perf_counter()
        got = read_all(mnt)
        seconds = time.perf_counter() - started
        stats = json.loads(os.getxattr(mnt, "user.shardfs.stats"))
    finally:
        shardfs("umount", mnt, env=env, check=True)
    if got != expect:
        raise RuntimeError(f"{source}: read {got} bytes, expected {expect}")
    return seconds, stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=12)
    ap.add_argument("--shard-mb", type=int, default=25)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "shardfs-bench-remote"))
    args = ap.parse_args()

    import boto3

    work = args.work
    shards_dir = os.path.join(work, "shards")
    shard_bytes = make_shards(shards_dir, args.shards, args.shard_mb)
    member_bytes = args.shards * (args.shard_mb * 1_000_000 // MEMBER) * MEMBER
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    env = {**os.environ, "XDG_CACHE_HOME": os.path.join(work, "cache"), "AWS_ACCESS_KEY_ID": ACCESS_KEY,
           "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": "us-east-1"}
    print(f"dataset: {args.shards} shards, {shard_bytes / 1e6:.0f} MB, {member_bytes // MEMBER} members of 100 KB; "
          f"{os.cpu_count()} cores", flush=True)

    procs: list[subprocess.Popen] = []
    try:
        proc, endpoint = start_moto(subprocess.DEVNULL)
        procs.append(proc)
        s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=ACCESS_KEY,
                          aws_secret_access_key=SECRET_KEY, region_name="us-east-1")
        s3.create_bucket(Bucket="bench")
        for name in sorted(os.listdir(shards_dir)):
            s3.upload_file(os.path.join(shards_dir, name), "bench", f"ds/{name}")
        proc, http = start_nginx(os.path.join(work, "nginx"), shards_dir)
        procs.append(proc)

        last = f"{args.shards - 1:06d}"
        sources = [
            ("local disk", shards_dir, []),
            ("S3 (moto)", "s3://bench/ds/", ["--option", f"endpoint_url={endpoint}"]),
            ("HTTP (nginx)", f"{http}/train-{{000000..{last}}}.tar", []),
        ]
        rows = []
        for label, source, options in sources:
            log = os.path.join(work, f"{label.split()[0].lower()}.log")
            one_run(source, options, mnt, env, log, member_bytes)  # builds (or loads) the index
            times, retries = [], 0
            for _ in range(args.runs):
                drop_page_cache(shards_dir)
                seconds, stats = one_run(source, options, mnt, env, log, member_bytes)
                times.append(seconds)
                retries += stats.get("remote", {}).get("retries", 0)
            median = statistics.median(times)
            rows.append((label, shard_bytes / median / 1e6, [shard_bytes / t / 1e6 for t in times], retries))
            print(f"  {label}: {', '.join(f'{t:.2f} s' for t in times)}", flush=True)
    finally:
        for proc in reversed(procs):
            stop_child(proc)

    base = rows[0][1]
    runs = [" / ".join(f"{r:.0f}" for r in rates) for _, _, rates, _ in rows]
    width = max(len("runs MB/s"), *map(len, runs))
    print(f"\n{'source':<14} {'MB/s (median)':>14}  {'runs MB/s':<{width}} {'vs local':>9} {'retries':>8}")
    for (label, rate, _, retries), each in zip(rows, runs):
        print(f"{label:<14} {rate:>14.0f}  {each:<{width}} {rate / base:>9.2f} {retries:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
