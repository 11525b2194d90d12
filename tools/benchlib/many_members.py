"""Millions of tiny members as zips and squashfs images, made once and kept, and the figures of
their mounts: first mount, remount with the saved view and without it, the daemon's resident
memory per member (issue 40: "4,000,000 members in squashfs images and in zips: remount at most
3 s, at most 120 B per member").

Member i is ``c{i // 1000:05d}/{i:08d}.txt`` holding ``member i\\n``; --shards archives hold
consecutive runs of members, so folders never span two archives. Zips are written record by
record here (zipfile takes minutes at 4M; ``unzip -l`` and zipfile read these, zip64 end records
past 65,535 members); squashfs images by ``tar2sqfs`` fed a tar stream on a pipe (no file on disk
per member).
"""

from __future__ import annotations

import io
import os
import struct
import subprocess
import tarfile
import time
import zlib

from .caches import drop_caches
from .machine import proc_status
from .mounts import Mounts
from .tables import absolute, cell, median

MTIME = 1704067200  # 2024-01-01 00:00:00 UTC
DOS_DATE, DOS_TIME = ((2024 - 1980) << 9) | (1 << 5) | 1, 0
UNIX_FILE = 0o100644 << 16
TINY = 100  # members of the archive whose mount is the baseline of "resident per member"


def member(i: int) -> tuple[bytes, bytes]:
    return b"c%05d/%08d.txt" % (i // 1000, i), b"member %d\n" % i


def write_zip(path: str, start: int, count: int, deflate: bool = False) -> None:
    """Members start..start+count as one zip, stored (or deflated: each member compressed on its
    own, as every zip writer does), with zip64 end records when over 65,535 members."""
    local = struct.Struct("<IHHHHHIIIHH")
    central = struct.Struct("<IHHHHHHIIIHHHHHII")
    offsets, crcs, sizes = [], [], []
    method = 8 if deflate else 0
    with open(path + ".part", "wb", buffering=1 << 22) as f:
        offset = 0
        for i in range(start, start + count):
            name, data = member(i)
            crc = zlib.crc32(data)
            stored = _deflated(data) if deflate else data
            offsets.append(offset)
            crcs.append(crc)
            sizes.append((len(stored), len(data)))
            record = local.pack(0x04034B50, 20, 0, method, DOS_TIME, DOS_DATE, crc, len(stored), len(data), len(name), 0)
            f.write(record + name + stored)
            offset += len(record) + len(name) + len(stored)
        cd_start = offset
        for k, i in enumerate(range(start, start + count)):
            name, _ = member(i)
            record = central.pack(0x02014B50, (3 << 8) | 20, 20, 0, method, DOS_TIME, DOS_DATE, crcs[k], *sizes[k],
                                  len(name), 0, 0, 0, 0, UNIX_FILE, offsets[k])
            f.write(record + name)
            offset += len(record) + len(name)
        cd_size = offset - cd_start
        if count > 0xFFFF or offset > 0xFFFFFFFF:
            f.write(struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, count, count, cd_size, cd_start))
            f.write(struct.pack("<IIQI", 0x07064B50, 0, offset, 1))
        f.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, min(count, 0xFFFF), min(count, 0xFFFF),
                            min(cd_size, 0xFFFFFFFF), min(cd_start, 0xFFFFFFFF), 0))
    os.rename(path + ".part", path)


def _deflated(data: bytes) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, -15)  # raw deflate, as zip holds it
    return c.compress(data) + c.flush()


def write_squashfs(path: str, start: int, count: int, comp: str = "zstd") -> None:
    """Members start..start+count as one squashfs image: a tar stream made here, piped to tar2sqfs."""
    with open(path + ".log", "w") as log:  # (beside the image: a shardfs mount of the folder ignores it)
        proc = subprocess.Popen(["nice", "-n", "5", "tar2sqfs", "-q", "-f", "-j", "1", "-c", comp, "-b", "131072",
                                 "-d", f"mtime={MTIME}", path + ".part"],
                                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT)
        with tarfile.open(fileobj=proc.stdin, mode="w|", format=tarfile.GNU_FORMAT) as tf:
            for i in range(start, start + count):
                name, data = member(i)
                info = tarfile.TarInfo(name.decode())
                info.size, info.mtime, info.mode = len(data), MTIME, 0o644
                tf.addfile(info, io.BytesIO(data))
        proc.stdin.close()
        if proc.wait() != 0:
            raise RuntimeError(f"tar2sqfs failed for {path}: see {path}.log")
    os.unlink(path + ".log")
    os.rename(path + ".part", path)


WRITERS = {"zip": (write_zip, ".zip"), "zip-deflate": (lambda *a: write_zip(*a, deflate=True), ".zip"),
           "squashfs": (write_squashfs, ".sqfs")}


def archives(work: str, kind: str, members: int, shards: int) -> str:
    """A folder of ``shards`` archives of ``kind`` holding ``members`` members, made once (an
    interrupted run resumes: each archive appears by a rename when whole)."""
    folder = os.path.join(work, f"{kind}-{members}-in-{shards}")
    os.makedirs(folder, exist_ok=True)
    write, suffix = WRITERS[kind]
    per = -(-members // shards)
    for s in range(shards):
        path = os.path.join(folder, f"part-{s:04d}{suffix}")
        if not os.path.exists(path):
            t = time.perf_counter()
            write(path, s * per, min(per, members - s * per))
            print(f"[{time.strftime('%H:%M:%S')}] wrote {path} ({os.path.getsize(path) / 1e6:.0f} MB) in "
                  f"{time.perf_counter() - t:.0f} s", flush=True)
    return folder


def _forget(folder: str, index_dir: str, views_only: bool = False) -> None:
    """No saved view (and unless ``views_only``, no index) of the archives in ``folder``."""
    for d in (index_dir, folder):
        for name in os.listdir(d) if os.path.isdir(d) else ():
            if name.endswith(".shardfs-view") or (not views_only and name.endswith(".shardfs-idx")):
                os.unlink(os.path.join(d, name))


def _view_saved(index_dir: str, deadline_s: float = 120.0) -> bool:
    """Wait for the mount's saved view to appear (written by a thread once mounted)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if any(n.endswith(".shardfs-view") for n in os.listdir(index_dir)):
            return True
        time.sleep(0.2)
    return False


def _first_members(folder: str, members: int, shards: int) -> list[str]:
    """The first member of each archive ``archives`` wrote in ``folder``."""
    per = -(-members // shards)
    return [member(s * per)[0].decode() for s in range(shards)]


def _loaded(m, deadline_s: float = 120.0) -> dict:
    """The mount's cache figures once no shard is being loaded into it."""
    end = time.monotonic() + deadline_s
    while True:
        cache = (m.stats() or {}).get("cache") or {}
        if not cache.get("shards_loading") or time.monotonic() >= end:
            return cache
        time.sleep(0.2)


def _mount(mounts: Mounts, folder: str, mnt: str, index_dir: str, log: str, want_view: bool,
           read: list[str] | None = None) -> dict:
    """One timed ``shardfs mount`` (page cache dropped first), its stats and the daemon's memory:
    ``rss`` once usable, ``rss_settled`` after the saved view was written (when one is written).
    ``read``: then these files are read, one after another (``read_s``: each read's wall time,
    what a reader waits for an archive's data layout), and the memory again (``rss_read``, and the
    RAM cache's bytes then, ``cache_bytes``)."""
    drop_caches()
    load = os.getloadavg()[0]
    t = time.perf_counter()
    m = mounts.shardfs([folder], mnt, "--index-dir", index_dir, log=log)
    seconds = time.perf_counter() - t
    st = m.stats() or {}
    status = proc_status(m.pid)
    out = {"seconds": seconds, "load": load, "files": st.get("files"), "view_mapped": bool(st.get("view_mapped")),
           "index_seconds": st.get("index_seconds"), "rss": status.get("VmRSS", 0), "hwm": status.get("VmHWM", 0),
           "cpu_s": status.get("cpu_s")}
    if want_view and not out["view_mapped"]:
        _view_saved(index_dir)
        time.sleep(1.0)  # (the writer lets go of what it held once the file is renamed into place)
    out["rss_settled"] = proc_status(m.pid).get("VmRSS", 0)
    if read:
        out["read_s"] = []
        for rel in read:
            t = time.perf_counter()
            with open(os.path.join(mnt, rel), "rb") as f:
                f.read()
            out["read_s"].append(time.perf_counter() - t)
        cache = _loaded(m)  # (a shard being loaded counts in full in the cache's bytes, not yet in RSS)
        status = proc_status(m.pid)
        out["rss_read"], out["hwm_read"] = status.get("VmRSS", 0), status.get("VmHWM", 0)
        out["cache_bytes"] = cache.get("used_bytes", 0)
    mounts.unmount(m)
    return out


def measure(mounts: Mounts, work: str, kind: str, members: int, shards: int, rounds: int) -> dict:
    """Per round: a first mount (no index, no saved view), a remount mapping the view it saved (then
    one file read from each archive: its data layout opened), a remount with the view removed (it merges the index files, and saves the view again); and the
    same three mounts of a TINY-member archive of the kind, whose resident memory is the baseline:
    resident per member = (daemon RSS - the same step's RSS with the tiny archive) / members."""
    logs = os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    mnt = os.path.join(work, "mnt", kind)
    got: dict = {}
    for label, n, s in (("tiny", TINY, 1), ("big", members, shards)):
        folder = archives(work, kind, n, s)
        index_dir = os.path.join(work, "index", os.path.basename(folder))
        os.makedirs(index_dir, exist_ok=True)
        runs = got[label] = {"first": [], "view": [], "merge": []}
        for r in range(rounds):
            _forget(folder, index_dir)
            for step in ("first", "view", "merge"):
                if step == "merge":
                    _forget(folder, index_dir, views_only=True)
                one = _mount(mounts, folder, mnt, index_dir, os.path.join(logs, f"{kind}-{label}.log"), step != "view",
                             _first_members(folder, n, s) if step == "view" else None)
                if one["files"] != n:
                    raise RuntimeError(f"{folder}: the mount shows {one['files']} files, expected {n}")
                runs[step].append(one)
                print(f"[{time.strftime('%H:%M:%S')}] {kind} {n} members in {s}, round {r + 1}, {step}: "
                      f"{one['seconds']:.2f} s (view mapped: {one['view_mapped']}), RSS {one['rss'] / 2**20:.0f} MB, "
                      f"settled {one['rss_settled'] / 2**20:.0f} MB, HWM {one['hwm'] / 2**20:.0f} MB, "
                      f"load {one['load']:.1f}", flush=True)
                if "read_s" in one:
                    print(f"    one file read from each archive: {', '.join(f'{x:.2f}' for x in one['read_s'])} s; "
                          f"then RSS {one['rss_read'] / 2**20:.0f} MB, HWM {one['hwm_read'] / 2**20:.0f} MB, RAM cache "
                          f"{one['cache_bytes'] / 2**20:.0f} MB", flush=True)
    got["tiny_rss"] = {step: median([m["rss_settled"] for m in runs]) for step, runs in got["tiny"].items()}
    tiny_read = median([m["rss_read"] - m["cache_bytes"] for m in got["tiny"]["view"]])
    for step, runs in got["big"].items():
        for m in runs:
            m["bytes_per_member"] = (m["rss_settled"] - got["tiny_rss"][step]) / members
            if "rss_read" in m:
                m["bytes_per_member_read"] = (m["rss_read"] - m["cache_bytes"] - tiny_read) / members
    return got


STEPS = {"first": "first mount (no index)", "view": "remount, saved view mapped",
         "merge": "remount, no saved view (index files merged)"}


def report(kind: str, members: int, shards: int, got: dict) -> list[str]:
    """Lines: each step's wall time, resident per member and load, medians [min-max]."""
    tiny = ", ".join(f"{v / 2**20:.0f}" for v in got["tiny_rss"].values())
    lines = [f"{members:,} members in {shards} {kind} archive(s); resident per member = (daemon RSS once usable "
             f"and any view written - the same mount's RSS with a {TINY}-member archive, {tiny} MB) / members; "
             "page cache dropped before each mount"]
    for step, runs in got["big"].items():
        lines.append(f"  {STEPS[step]:45} {cell([m['seconds'] for m in runs], '{:.2f}')} s, "
                     f"{cell([m['bytes_per_member'] for m in runs], '{:.0f}')} B/member, "
                     f"HWM {cell([m['hwm'] / 2**20 for m in runs], '{:.0f}')} MB, "
                     f"daemon CPU {cell([m['cpu_s'] for m in runs], '{:.2f}')} s, "
                     f"load {cell([m['load'] for m in runs], '{:.1f}')}")
    view = got["big"]["view"]
    lines.append(f"  {'then one file read from each archive':45} first read {cell([max(m['read_s']) for m in view], '{:.2f}')} s "
                 f"(the slowest of the archives), {cell([m['bytes_per_member_read'] for m in view], '{:.0f}')} B/member "
                 f"(RSS - the RAM cache's bytes - the same with the tiny archive), "
                 f"HWM {cell([m['hwm_read'] / 2**20 for m in view], '{:.0f}')} MB")
    return lines


def targets(kind: str, members: int, got: dict) -> list[dict]:
    """Issue 40's: remount (the saved view mapped, as every remount after the first) at most 3 s;
    at most 120 B resident per member, the worst step's median."""
    big = got["big"]
    worst = max([median([m["bytes_per_member"] for m in runs]) for runs in big.values()]
                + [median([m["bytes_per_member_read"] for m in big["view"]])])
    return [absolute(f"{kind}, {members:,} members: remount <= 3 s", "shardfs",
                     median([m["seconds"] for m in big["view"]]), "<= 3", " s"),
            absolute(f"{kind}, {members:,} members: resident per member <= 120 B (worst of the mounts, reads)", "shardfs",
                     worst, "<= 120", " B")]


def run(mounts: Mounts, work: str, kind: str, members: int, shards: int, rounds: int) -> tuple[dict, list[dict]]:
    """``measure``, its lines printed; the figures and the targets."""
    got = measure(mounts, work, kind, members, shards, rounds)
    print()
    print("\n".join(report(kind, members, shards, got)), flush=True)
    return got, targets(kind, members, got)
