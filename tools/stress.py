#!/usr/bin/env python3
"""Stress a mount: many reader processes, a dataset larger than the cache budget, every byte checked.

    .venv/bin/python tools/stress.py --readers 8 --seconds 300            # the long run (minutes)
    .venv/bin/python tools/stress.py --readers 4 --seconds 15 --files 300  # what the default tests run

Readers pick random files (and random ranges of them), hash what they read and compare with
the digests recorded when the shards were made, and drop the file's pages after each read
(POSIX_FADV_DONTNEED) so that every read reaches the daemon rather than the kernel's page cache.
A monitor samples the daemon's RSS, open descriptors and cache use every second. Exit status 1
when anything went wrong: a read error, a wrong byte, memory over budget, descriptors leaking.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import tarfile
import tempfile
import threading
import time

import shardfs

OVERHEAD = 160 << 20  # threads, the lz4 block cache, allocator slack: what RSS may exceed budget + index by


def make_dataset(out: str, files: int, shards: int, min_size: int, max_size: int, seed: int) -> dict[str, str]:
    rng = random.Random(seed)
    digests = {}
    os.makedirs(out, exist_ok=True)
    tars = [tarfile.open(os.path.join(out, f"stress-{s:04d}.tar"), "w") for s in range(shards)]
    try:
        for i in range(files):
            data = rng.randbytes(rng.randrange(min_size, max_size))
            name = f"c{i % 17:02d}/f{i:07d}.bin"
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tars[i % shards].addfile(info, io.BytesIO(data))
            digests[name] = hashlib.sha256(data).hexdigest()
    finally:
        for tf in tars:
            tf.close()
    return digests


def reader(root: str, digests: dict[str, str], sizes: dict[str, int], deadline: float, seed: int, queue) -> None:
    rng = random.Random(seed)
    names = sorted(digests)
    files = nbytes = errors = wrong = 0
    last = time.monotonic()
    while time.monotonic() < deadline:
        name = rng.choice(names)
        path = os.path.join(root, name)
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                if rng.random() < 0.8:  # whole file, as a data loader reads it
                    chunks = []
                    while chunk := os.read(fd, 1 << 20):
                        chunks.append(chunk)
                    data = b"".join(chunks)
                    wrong += hashlib.sha256(data).hexdigest() != digests[name]
                else:  # a random range, checked against a whole-file read of the same bytes
                    off = rng.randrange(sizes[name])
                    part = os.pread(fd, rng.randrange(1, 300_000), off)
                    whole = os.pread(fd, sizes[name], 0)
                    wrong += hashlib.sha256(whole).hexdigest() != digests[name] or whole[off:off + len(part)] != part
                    data = part
                nbytes += len(data)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        except OSError as exc:
            errors += 1
            queue.put(("error", f"{name}: {exc}"))
        files += 1
        if time.monotonic() - last >= 1.0:
            queue.put(("progress", files, nbytes, errors, wrong))
            files = nbytes = errors = wrong = 0
            last = time.monotonic()
    queue.put(("progress", files, nbytes, errors, wrong))
    queue.put(("done",))


def sample_daemon(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def run(readers: int, seconds: float, files: int, shards: int, min_size: int, max_size: int,
        cache_fraction: float, workdir: str | None = None, seed: int = 1, log=print) -> dict:
    work = workdir or tempfile.mkdtemp(prefix="shardfs-stress-")
    shard_dir = os.path.join(work, "shards")
    log(f"making {files} files in {shards} shards under {shard_dir} ...")
    digests = make_dataset(shard_dir, files, shards, min_size, max_size, seed)
    total = sum(os.path.getsize(os.path.join(shard_dir, n)) for n in os.listdir(shard_dir) if n.endswith(".tar"))
    budget = max(1, int(total * cache_fraction))
    ctx = mp.get_context("spawn")
    with shardfs.mounted(shard_dir, cache_size=str(budget)) as root:
        figures = json.loads(os.getxattr(root, "user.shardfs.stats"))
        pid = figures["pid"]
        rss0, fds0 = sample_daemon(pid)
        sizes = {name: os.path.getsize(os.path.join(root, name)) for name in digests}
        queue = ctx.Queue()
        deadline = time.monotonic() + seconds
        procs = [ctx.Process(target=reader, args=(root, digests, sizes, deadline, seed + r, queue))
                 for r in range(readers)]
        for p in procs:
            p.start()
        samples, totals, per_second, errors = [], [0, 0, 0, 0], {}, []
        started, done = time.monotonic(), 0
        stop = threading.Event()

        def monitor() -> None:
            while not stop.wait(1.0):
                rss, fds = sample_daemon(pid)
                cache = json.loads(os.getxattr(root, "user.shardfs.stats"))["cache"]
                samples.append((rss, fds, cache["used_bytes"]))

        watcher = threading.Thread(target=monitor, daemon=True)
        watcher.start()
        while done < readers:
            msg = queue.get(timeout=seconds + 120)
            if msg[0] == "progress":
                second = int(time.monotonic() - started)
                per_second[second] = per_second.get(second, 0) + msg[2]
                for i in range(4):
                    totals[i] += msg[1 + i]
            elif msg[0] == "error":
                errors.append(msg[1])
            else:
                done += 1
        for p in procs:
            p.join()
        stop.set()
        watcher.join()
        end = json.loads(os.getxattr(root, "user.shardfs.stats"))
        rss_end, fds_end = sample_daemon(pid)
    elapsed = time.monotonic() - started
    # Throughput per 10 s window, to show it is stable (the first window includes warm-up).
    windows = [sum(per_second.get(s, 0) for s in range(w, w + 10)) / 10 / 1e6
               for w in range(0, int(elapsed) - 9, 10)] or [totals[1] / elapsed / 1e6]
    peak_rss = max([rss_end] + [s[0] for s in samples])
    result = {
        "readers": readers, "seconds": round(elapsed, 1), "files_read": totals[0], "bytes_verified": totals[1],
        "read_errors": totals[2], "wrong_bytes": totals[3], "error_lines": errors[:10],
        "dataset_bytes": total, "budget_bytes": budget, "cache_used_max": max([s[2] for s in samples] or [0]),
        "daemon_rss_start": rss0, "daemon_rss_peak": peak_rss, "fds_start": fds0, "fds_end": fds_end,
        "fds_max": max([s[1] for s in samples] or [fds_end]),
        "throughput_MBps": round(totals[1] / elapsed / 1e6, 1),
        "throughput_10s_windows_MBps": [round(w, 1) for w in windows],
        "storage_bytes_read": end["cache"]["storage_bytes_read"], "daemon_read_errors": end["read_errors"],
    }
    result["memory_ok"] = peak_rss <= rss0 + budget + OVERHEAD and result["cache_used_max"] <= budget
    # Two descriptors per shard (buffered, O_DIRECT) are opened on first use and kept;
    # anything beyond that is a leak.
    result["fds_ok"] = result["fds_max"] <= fds0 + 2 * shards + 8
    result["ok"] = (not totals[2] and not totals[3] and result["memory_ok"] and result["fds_ok"]
                    and end["read_errors"] == 0)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--files", type=int, default=4000)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--min-size", type=int, default=1000)
    parser.add_argument("--max-size", type=int, default=400_000)
    parser.add_argument("--cache-fraction", type=float, default=0.25, help="budget as a share of the dataset")
    parser.add_argument("--workdir")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    result = run(args.readers, args.seconds, args.files, args.shards, args.min_size, args.max_size,
                 args.cache_fraction, args.workdir)
    windows = result["throughput_10s_windows_MBps"]
    print(f"\n{result['readers']} readers for {result['seconds']} s over {result['dataset_bytes'] / 1e6:.0f} MB "
          f"of shards with a {result['budget_bytes'] / 1e6:.0f} MB cache budget")
    print(f"files read {result['files_read']}, bytes verified {result['bytes_verified'] / 1e9:.2f} GB, "
          f"read errors {result['read_errors']}, wrong bytes {result['wrong_bytes']}")
    print(f"throughput {result['throughput_MBps']} MB/s; per 10 s window min/median/max "
          f"{min(windows)}/{statistics.median(windows)}/{max(windows)} MB/s")
    print(f"daemon RSS {result['daemon_rss_start'] / 1e6:.0f} -> peak {result['daemon_rss_peak'] / 1e6:.0f} MB "
          f"(budget {result['budget_bytes'] / 1e6:.0f} MB; cache used at most {result['cache_used_max'] / 1e6:.0f} MB); "
          f"descriptors {result['fds_start']} -> {result['fds_end']} (max {result['fds_max']})")
    print(f"storage read {result['storage_bytes_read'] / 1e9:.2f} GB; verdict: {'OK' if result['ok'] else 'FAILED'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
