#!/usr/bin/env python3
"""Soak a live mount: requests in bursts wider than the daemon's worker pool, with pauses between
them so workers fall idle; the daemon's RSS and thread count sampled after every burst.

Each request is a ``getxattr`` of a file's shard offset: the kernel never caches xattrs, so every one
reaches the daemon and runs the Python side of a request. A burst is ``--width`` threads (spread over
``--procs`` processes, so the client's GIL does not narrow it) each sending ``--per-thread`` requests.

    .venv/bin/python tools/soak.py MOUNTPOINT --requests 1000000      # prints one line per sample, then a summary
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from shardfs.fuse.ops import XATTR_OFFSET  # noqa: E402
from shardfs.fuse.stats import STATS_XATTR  # noqa: E402


def daemon_pid(mnt: str) -> int:
    return json.loads(os.getxattr(mnt, STATS_XATTR))["pid"]


def sample(pid: int) -> dict:
    """RSS (bytes), thread count and the ids of the threads alive now."""
    with open(f"/proc/{pid}/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    return {"rss": int(status["VmRSS"].split()[0]) * 1024, "threads": int(status["Threads"]),
            "tids": {int(t) for t in os.listdir(f"/proc/{pid}/task")}}


def _files(mnt: str, limit: int = 256) -> list[str]:
    found = []
    for d, _, names in os.walk(mnt):
        found += [os.path.join(d, n) for n in names[: limit - len(found)]]
        if len(found) >= limit:
            break
    return found


def _burster(files: list[str], threads: int, per_thread: int, go, done) -> None:
    """One client process: waits for a go, sends a burst from ``threads`` threads, reports, repeats."""
    def work(k: int) -> None:
        for i in range(per_thread):
            os.getxattr(files[(k * 7 + i) % len(files)], XATTR_OFFSET)

    while go.get() is not None:
        pool = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        done.put(threads * per_thread)


def soak(mnt: str, requests: int, width: int = 96, procs: int = 4, per_thread: int = 50, pause: float = 0.05,
         report=None) -> list[dict]:
    """Bursts until ``requests`` were sent; returns one sample per burst (plus one before)."""
    pid, files = daemon_pid(mnt), _files(mnt)
    if not files:
        raise SystemExit(f"{mnt}: no files to send requests about")
    ctx = mp.get_context("fork")
    go, done = ctx.Queue(), ctx.Queue()
    threads = [width // procs + (p < width % procs) for p in range(procs)]
    clients = [ctx.Process(target=_burster, args=(files, n, per_thread, go, done)) for n in threads]
    for c in clients:
        c.start()
    samples = [{**sample(pid), "requests": 0, "seconds": 0.0}]
    started, sent = time.monotonic(), 0
    try:
        while sent < requests:
            for _ in clients:
                go.put(1)
            for _ in clients:
                sent += done.get(timeout=600)
            time.sleep(pause)  # workers fall idle: a pool that shrinks would shed threads now
            samples.append({**sample(pid), "requests": sent, "seconds": round(time.monotonic() - started, 1)})
            if report:
                report(samples[-1])
    finally:
        for _ in clients:
            go.put(None)
        for c in clients:
            c.join(timeout=30)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mountpoint")
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--width", type=int, default=96, help="concurrent requests in a burst")
    parser.add_argument("--procs", type=int, default=4, help="client processes the width is spread over")
    parser.add_argument("--per-thread", type=int, default=50, help="requests each thread sends per burst")
    parser.add_argument("--pause", type=float, default=0.05, help="seconds between bursts")
    args = parser.parse_args()
    every = max(1, args.requests // (args.width * args.per_thread) // 20)
    count = {"n": 0}

    def report(s: dict) -> None:
        count["n"] += 1
        if count["n"] % every == 0:
            print(f"{s['seconds']:8.1f} s {s['requests']:>9} requests  RSS {s['rss'] / 2**20:7.1f} MiB  "
                  f"threads {s['threads']}", flush=True)

    samples = soak(args.mountpoint, args.requests, args.width, args.procs, args.per_thread, args.pause, report)
    first, last = samples[1], samples[-1]
    tids = set().union(*(s["tids"] for s in samples))
    print(f"after the first burst: RSS {first['rss'] / 2**20:.1f} MiB, {first['threads']} threads; at the end "
          f"({last['requests']} requests, {last['seconds']:.0f} s): RSS {last['rss'] / 2**20:.1f} MiB, "
          f"{last['threads']} threads; RSS max {max(s['rss'] for s in samples) / 2**20:.1f} MiB; "
          f"{len(tids)} thread ids seen in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
