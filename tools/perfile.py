#!/usr/bin/env python3
"""Per-file costs through a shardfs mount, side by side with the plain directory (by hand, as root).

Each figure is the median of --rounds rounds (spread: min-max of the round medians), in µs per file:

* ``open_read``: ``open(p, 'rb').read()`` of a file read moments before (page cache warm), as
  torchvision's pil_loader opens files; ``open_read_unbuf``: the same with ``buffering=0``;
  ``isatty``: ``os.isatty`` on an open file (the TCGETS ioctl the buffered open sends);
* ``stat_cold``: ``os.stat`` of every file after ``drop_caches 3`` (one LOOKUP each);
* ``list_fresh`` / ``list_warm``: an ImageFolder-style listing (scandir of the root, sorted scandir of
  each folder) right after a remount and ``drop_caches 3``, then again; µs per entry;
* ``tiny_cold``: open+read (``buffering=0``) of every file after ``drop_caches 3`` with the shards in
  the daemon's RAM cache (one LOOKUP and one READ each), and the daemon's CPU per file
  (/proc/PID/stat, ``daemon_cpu_tiny_cold``); ``tiny_cold_open``: the same with ``open(p, 'rb')``
  (a LOOKUP and the isatty ioctl, which brings the bytes along: no READ);
* ``readers``: cached reads (page cache dropped with ``drop_caches 1``, shards in RAM) by 1 and 2
  reader processes, files/s, and the ratio.

    .venv/bin/python tools/perfile.py                      # 20,000 files of 300-600 B in 200 folders
    .venv/bin/python tools/perfile.py --size 110000 --files 4000
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import time

from benchlib.caches import drop_caches
from benchlib.readers import read_all

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODE = ROOT  # the checkout whose shardfs mounts (--code: A/B of two branches)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def generate(work: str, files: int, folders: int, shards: int, size: int) -> tuple[str, str]:
    """A plain directory and the same files as tar shards (reused when present)."""
    plain, tars = os.path.join(work, "plain"), os.path.join(work, "shards")
    if os.path.exists(os.path.join(work, "done")):
        return plain, tars
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(tars)
    rng = random.Random(0)
    writers = [tarfile.open(os.path.join(tars, f"s{s:04d}.tar"), "w", format=tarfile.USTAR_FORMAT)
               for s in range(shards)]
    for k in range(files):
        name = f"c{k % folders:05d}/f{k:07d}.bin"
        data = rng.randbytes(rng.randint(size // 2, size))
        os.makedirs(os.path.join(plain, os.path.dirname(name)), exist_ok=True)
        with open(os.path.join(plain, name), "wb") as f:
            f.write(data)
        info = tarfile.TarInfo(name)
        info.size, info.mtime = len(data), 1_600_000_000
        writers[k % shards].addfile(info, io.BytesIO(data))
    for w in writers:
        w.close()
    open(os.path.join(work, "done"), "w").close()
    return plain, tars


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def shardfs(*args: str) -> subprocess.CompletedProcess:
    # cwd too: `python -m` puts the working directory ahead of PYTHONPATH
    env = {**os.environ, "PYTHONPATH": CODE + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "shardfs", *args], capture_output=True, text=True, env=env,
                          cwd=CODE)


class Mount:
    def __init__(self, shards: str, mnt: str, extra: list[str]):
        self.shards, self.mnt, self.extra, self.pid = shards, mnt, extra, None

    def __enter__(self):
        os.makedirs(self.mnt, exist_ok=True)
        done = shardfs("mount", self.shards, self.mnt, "--log-file", self.mnt + ".log", *self.extra)
        if done.returncode:
            raise RuntimeError(done.stderr)
        # from the mount's own report: the stats xattr's name differs between versions
        self.pid = int(json.loads(shardfs("stats", "--json", self.mnt).stdout)["pid"])
        return self

    def __exit__(self, *exc):
        shardfs("umount", self.mnt)
        if os.path.ismount(self.mnt):
            subprocess.run(["fusermount3", "-u", "-z", self.mnt])

    def ops(self) -> dict:
        return json.loads(shardfs("stats", "--json", self.mnt).stdout)["fuse_ops"]


def files_of(root: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)


def per_file(fn, paths: list[str]) -> float:
    t = time.perf_counter_ns()
    for p in paths:
        fn(p)
    return (time.perf_counter_ns() - t) / 1000 / len(paths)


def open_read(p: str) -> None:
    with open(p, "rb") as f:
        f.read()


def open_read_unbuf(p: str) -> None:
    with open(p, "rb", buffering=0) as f:
        f.read()


def imagefolder_listing(root: str) -> int:
    n = 0
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.is_dir():
            n += len(sorted(e.name for e in os.scandir(entry.path) if e.is_file()))
    return n


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):9.1f}  ({min(values):.1f}-{max(values):.1f})"


def measure(root: str, daemon_pid, remount, rounds: int, sample: int) -> dict[str, list[float]]:
    res: dict[str, list[float]] = {}
    add = lambda k, v: res.setdefault(k, []).append(v)  # noqa: E731
    for _ in range(rounds):
        remount()
        drop_caches(3)
        t = time.perf_counter_ns()
        n = imagefolder_listing(root)
        add("list_fresh", (time.perf_counter_ns() - t) / 1000 / n)
        t = time.perf_counter_ns()
        imagefolder_listing(root)
        add("list_warm", (time.perf_counter_ns() - t) / 1000 / n)
        paths = files_of(root)
        random.Random(1).shuffle(paths)
        for p in paths:
            open_read(p)  # shards into the daemon's RAM cache
        pid = daemon_pid()
        for key, read in (("tiny_cold", open_read_unbuf), ("tiny_cold_open", open_read)):
            drop_caches(3)
            cpu = cpu_seconds(pid) if pid else 0.0
            add(key, per_file(read, paths))
            if pid:
                add(f"daemon_cpu_{key}", (cpu_seconds(pid) - cpu) * 1e6 / len(paths))
        drop_caches(3)
        add("stat_cold", per_file(os.stat, paths))
        few = paths[:sample]
        per_file(open_read, few)
        add("open_read", per_file(open_read, few))
        add("open_read_unbuf", per_file(open_read_unbuf, few))
        with open(few[0], "rb", buffering=0) as f:
            fd = f.fileno()
            t = time.perf_counter_ns()
            for _ in range(sample):
                os.isatty(fd)
            add("isatty", (time.perf_counter_ns() - t) / 1000 / sample)
        rates = []
        for readers in (1, 2):
            drop_caches(1)
            rates.append(read_all(paths, readers, "open")["files_per_s"])
        add("files_s_1_reader", rates[0])
        add("files_s_2_readers", rates[1])
        add("2_readers_ratio", rates[1] / rates[0])
    return res


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--folders", type=int, default=200)
    parser.add_argument("--shards", type=int, default=10)
    parser.add_argument("--size", type=int, default=600, help="largest file; sizes are size/2..size")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sample", type=int, default=2000, help="files for the warm per-op figures")
    parser.add_argument("--workdir", default="/tmp/shardfs-perfile")
    parser.add_argument("--mount-arg", action="append", default=[], metavar="ARG")
    parser.add_argument("--code", default=ROOT, help="checkout whose shardfs serves the mount (default: this one)")
    args = parser.parse_args()
    global CODE
    CODE = os.path.abspath(args.code)

    work = f"{args.workdir}-{args.files}-{args.folders}-{args.shards}-{args.size}"
    plain, tars = generate(work, args.files, args.folders, args.shards, args.size)
    table = {"plain": measure(plain, lambda: None, lambda: None, args.rounds, args.sample)}
    mount = Mount(tars, os.path.join(work, "mnt"), args.mount_arg)

    def remount() -> None:
        if mount.pid:
            mount.__exit__()
        mount.__enter__()

    try:
        table["shardfs"] = measure(mount.mnt, lambda: mount.pid, remount, args.rounds, args.sample)
        ops = mount.ops()
    finally:
        if mount.pid:
            mount.__exit__()
    print(f"shardfs from {CODE}; {args.files} files of {args.size // 2}-{args.size} B in {args.folders} folders, {args.shards} shards; "
          f"µs per file (files/s for readers), median of {args.rounds} rounds (min-max)")
    print(f"{'figure':22s} {'plain':>26s} {'shardfs':>26s}")
    for key, values in table["shardfs"].items():
        plain_values = table["plain"].get(key)
        print(f"{key:22s} {summary(plain_values) if plain_values else '':>26s} {summary(values):>26s}")
    print("daemon requests in the last round:", json.dumps(ops))
    return 0


if __name__ == "__main__":
    sys.exit(main())
