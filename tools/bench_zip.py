#!/usr/bin/env python3
"""Zip shards: a by-hand benchmark (not a test), every figure the median of --repeat rounds with
its spread [min-max], all through the real CLIs.

1. First mount of a zip of --members tiny stored members (default 1,000,000, in folders of 1,000
   as ``zip -r`` lists them; made once with zipfile and kept in --workdir): wall time of ``shardfs
   mount`` with no index (none beside the zip, a fresh --index-dir each round; the page cache not
   dropped: the zip is read from it), the daemon's RSS and CPU; then a remount (index kept).
   ``--tar``: the same for a tar of the same members (tar's compiled scanner), for reference.
2. The same real JPEGs (benchlib.sample) as a stored zip (``zip -0``) and a deflate zip (``zip``),
   each served by shardfs, fuse-zip (Debian's) and ratarmount: mount time, then a cold epoch
   (page cache dropped, every file read once in a random order by --readers processes) and a warm
   epoch (again, same mount), files/s; the plain directory for reference.
3. ``--remount-members N``: N tiny members in --remount-zips zips: first mount, remount with the
   saved view and without it, the daemon's resident memory per member (benchlib.many_members).

Run as root (the page cache is dropped before cold epochs)::

    .venv/bin/python tools/bench_zip.py --json /tmp/bench-zip.json
    .venv/bin/python tools/bench_zip.py --members 100000 --classes 10 --per-class 100 --repeat 2   # a quick look
    .venv/bin/python tools/bench_zip.py --skip-first-mount --skip-epochs --remount-members 4000000 --remount-zips 4

Mounts are always undone, also on SIGTERM / Ctrl-C; processes are only signalled by the pid this
run started.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile

from benchlib import many_members, readers, tables
from benchlib.caches import drop_caches
from benchlib.machine import print_header, proc_status
from benchlib.methods import Ratarmount
from benchlib.mounts import Mounts
from benchlib.sample import files_under, make_imagefolder


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def many_members_zip(path: str, members: int) -> str:
    """``members`` members of 20-30 bytes in folders of 1,000, stored, made once."""
    if os.path.exists(path):
        return path
    log(f"writing {path} ({members} members)")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with zipfile.ZipFile(path + ".part", "w", zipfile.ZIP_STORED) as z:
        for i in range(members):
            info = zipfile.ZipInfo(f"c{i // 1000:05d}/{i:08d}.txt", (2024, 1, 1, 0, 0, 0))
            info.external_attr = 0o100644 << 16
            z.writestr(info, b"member %d\n" % i)
    os.rename(path + ".part", path)
    return path


def many_members_tar(path: str, members: int) -> str:
    """The same members as a GNU tar (tar's compiled scanner, for reference), made once."""
    if os.path.exists(path):
        return path
    log(f"writing {path} ({members} members)")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tarfile.open(path + ".part", "w", format=tarfile.GNU_FORMAT) as tf:
        for i in range(members):
            data = b"member %d\n" % i
            info = tarfile.TarInfo(f"c{i // 1000:05d}/{i:08d}.txt")
            info.size, info.mtime, info.mode = len(data), 1704067200, 0o644
            tf.addfile(info, io.BytesIO(data))
    os.rename(path + ".part", path)
    return path


def jpeg_zips(work: str, classes: int, per_class: int) -> tuple[str, dict[str, str]]:
    """The JPEG tree, and zips of it: {"stored": path, "deflate": path}, each in a folder of its own."""
    plain = os.path.join(work, f"jpeg-{classes}x{per_class}")
    if not os.path.isdir(os.path.join(plain, "train")):
        log(f"making {classes} x {per_class} JPEGs")
        make_imagefolder(plain + ".part", classes=classes, per_class=per_class, side=320)
        os.rename(plain + ".part", plain)
    zips = {}
    for kind, flags in (("stored", ["-0"]), ("deflate", [])):
        folder = os.path.join(work, f"zip-{kind}-{classes}x{per_class}")
        path = os.path.join(folder, "train.zip")
        if not os.path.exists(path):
            os.makedirs(folder, exist_ok=True)
            subprocess.run(["zip", "-q", "-r", *flags, path + ".part.zip", "train"], cwd=plain, check=True)
            os.rename(path + ".part.zip", path)
        zips[kind] = path
    return plain, zips


def shardfs_mount(mounts: Mounts, zip_path: str, mnt: str, index_dir: str, logs: str):
    return mounts.shardfs([os.path.dirname(zip_path)], mnt, "--index-dir", index_dir,
                          log=os.path.join(logs, "shardfs.log"))


def fuse_zip_mount(mounts: Mounts, zip_path: str, mnt: str, index_dir: str, logs: str):
    return mounts.spawn(["fuse-zip", "-f", "-r", zip_path, mnt], mnt, os.path.join(logs, "fuse-zip.log"))


def ratarmount_mount(mounts: Mounts, zip_path: str, mnt: str, index_dir: str, logs: str):
    index = os.path.join(index_dir, "ratarmount.index.sqlite")
    return mounts.spawn([Ratarmount.exe(), "-f", "--index-file", index, zip_path, mnt], mnt,
                        os.path.join(logs, "ratarmount.log"))


METHODS = {"shardfs": shardfs_mount, "fuse-zip": fuse_zip_mount, "ratarmount": ratarmount_mount}


def available(name: str) -> str | None:
    if name == "fuse-zip" and not shutil.which("fuse-zip"):
        return "fuse-zip not installed (apt-get install fuse-zip)"
    if name == "ratarmount" and not Ratarmount.exe():
        return "ratarmount not installed"
    return None


def forget_index(zip_path: str, index_dir: str) -> None:
    """No index of the zip anywhere (beside it, where shardfs keeps them by default; in index_dir)."""
    if os.path.exists(zip_path + ".shardfs-idx"):
        os.unlink(zip_path + ".shardfs-idx")
    shutil.rmtree(index_dir, ignore_errors=True)
    os.makedirs(index_dir)


def timed_mount(mounts: Mounts, how, zip_path: str, mnt: str, index_dir: str, logs: str):
    start = time.perf_counter()
    m = how(mounts, zip_path, mnt, index_dir, logs)
    return m, time.perf_counter() - start


def first_mounts(args, mounts: Mounts, work: str, logs: str) -> dict:
    archives = {"zip": many_members_zip(os.path.join(work, f"many-{args.members}", "many.zip"), args.members)}
    if args.tar:
        archives["tar"] = many_members_tar(os.path.join(work, f"many-{args.members}-tar", "many.tar"), args.members)
    results = {}
    for kind, path in archives.items():
        out = results[kind] = {"first": [], "remount": [], "rss_mb": [], "first_cpu": [], "remount_cpu": []}
        for r in range(args.repeat):
            index_dir = os.path.join(work, f"index-many-{kind}")
            forget_index(path, index_dir)
            for key in ("first", "remount"):
                m, secs = timed_mount(mounts, shardfs_mount, path, os.path.join(work, "mnt", "many"), index_dir, logs)
                files = sum(1 for _ in os.scandir(os.path.join(m.mnt, "c00000")))
                status = proc_status(m.pid)
                out[f"{key}_cpu"].append(status.get("cpu_s"))  # the daemon's: on a busy machine, what wall time hides
                if key == "first":
                    out["rss_mb"].append(status.get("VmRSS", 0) / 2**20)
                mounts.unmount(m)
                out[key].append(secs)
                log(f"{kind} round {r + 1}: {key} mount of {args.members} members {secs:.2f} s ({files} in c00000)")
    return results


def epochs(args, mounts: Mounts, work: str, logs: str, plain: str, zips: dict[str, str]) -> dict:
    results: dict = {}
    reference = [os.path.join("train", p) for p in files_under(os.path.join(plain, "train"))]
    for kind, path in zips.items():
        for name in ["plain", *METHODS]:
            if name != "plain" and (why := available(name)):
                log(f"{name}: skipped ({why})")
                continue
            row = results.setdefault(f"{kind}/{name}", {"mount": [], "cold": [], "warm": []})
            for r in range(args.repeat):
                index_dir = os.path.join(work, f"index-{kind}-{name}")
                forget_index(path, index_dir)
                if name == "plain":
                    root, m = plain, None
                else:
                    m, secs = timed_mount(mounts, METHODS[name], path, os.path.join(work, "mnt", name), index_dir, logs)
                    row["mount"].append(secs)
                    root = m.mnt
                paths = [os.path.join(root, p) for p in reference]
                drop_caches()
                cold = readers.read_all(paths, args.readers, seed=r)
                warm = readers.read_all(paths, args.readers, seed=r + 1000)
                if cold["errors"] or warm["errors"]:
                    raise RuntimeError(f"{kind}/{name}: read errors: {cold['first_error'] or warm['first_error']}")
                row["cold"].append(cold["files_per_s"])
                row["warm"].append(warm["files_per_s"])
                if m is not None:
                    mounts.unmount(m)
                log(f"{kind}/{name} round {r + 1}: cold {cold['files_per_s']:.0f} files/s, "
                    f"warm {warm['files_per_s']:.0f} files/s")
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default="/tmp/shardfs-bench-zip")
    p.add_argument("--members", type=int, default=1_000_000)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--per-class", type=int, default=200)
    p.add_argument("--readers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--skip-first-mount", action="store_true")
    p.add_argument("--tar", action="store_true", help="also a tar of the same members, for reference")
    p.add_argument("--skip-epochs", action="store_true")
    p.add_argument("--remount-members", type=int, default=0, metavar="N",
                   help="issue 40's remount and memory per member: N members split over --remount-zips zips "
                        "(written record by record, kept in --workdir), --repeat rounds (0: not measured)")
    p.add_argument("--remount-zips", type=int, default=4)
    p.add_argument("--remount-deflate", action="store_true", help="the same with every member deflated")
    p.add_argument("--json")
    args = p.parse_args()
    work = os.path.abspath(args.workdir)
    logs = os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    print_header(work)
    print("This machine is shared (2 cores, other jobs running): read figures with their spreads.")
    out: dict = {"args": vars(args)}
    with Mounts() as mounts:
        if not args.skip_first_mount:
            for kind, fm in first_mounts(args, mounts, work, logs).items():
                out[f"first_mount_{kind}"] = fm
                print(f"\n{args.members} stored members, one {kind}: first mount {tables.cell(fm['first'], '{:.2f} s')}, "
                      f"remount {tables.cell(fm['remount'], '{:.2f} s')}, daemon RSS {tables.cell(fm['rss_mb'], '{:.0f} MB')}; "
                      f"the daemon's CPU: first mount {tables.cell(fm['first_cpu'], '{:.2f} s')}, "
                      f"remount {tables.cell(fm['remount_cpu'], '{:.2f} s')}")
        if not args.skip_epochs:
            plain, zips = jpeg_zips(work, args.classes, args.per_class)
            ep = out["epochs"] = epochs(args, mounts, work, logs, plain, zips)
            n = args.classes * args.per_class
            print(f"\n{n} JPEGs, {args.readers} readers, files/s (ratio to shardfs in the same archive):")
            print(f"{'archive/method':24} {'mount s':>18} {'cold files/s':>26} {'warm files/s':>26}")
            for key, row in ep.items():
                base = ep.get(key.split("/")[0] + "/shardfs", {})
                cells = [tables.cell(row["mount"], "{:.2f}")] + [
                    tables.cell(row[k], "{:.0f}", tables.median(base.get(k, [])) if not key.endswith("/shardfs") else None)
                    for k in ("cold", "warm")]
                print(f"{key:24} {cells[0]:>18} {cells[1]:>26} {cells[2]:>26}")
        targets = []
        for kind in ("zip", "zip-deflate")[: (2 if args.remount_deflate else 1) if args.remount_members else 0]:
            got, more = many_members.run(mounts, work, kind, args.remount_members, args.remount_zips, args.repeat)
            out[f"remount_{kind}"] = got
            targets += more
        if targets:
            print()
            tables.print_targets(targets, "issue 40 target")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
