"""Slow shared storage for benchmarks: an ext4 image on a loop device, its reads capped by a
cgroup v1 blkio group (like an HDD-backed store), and a dataset made on it once and reused.

The image is attached with direct I/O on its backing file, so its reads are not served a second
time from the host file's page cache. The cap holds for the processes in the group and for every
child they start (readers, `shardfs mount` and its daemon), not for the machine's own disk (where
disk tiers and staged copies live). Run as root.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

BLKIO = "/sys/fs/cgroup/blkio"


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    """Run a command; raise with its stderr when it fails."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return done


def undo(cmd: list[str]) -> None:
    """A clean-up step: say so when it fails, carry on with the others."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"WARNING: `{' '.join(cmd)}` failed: {done.stderr.strip()}", file=sys.stderr)


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def make_image(path: str, size: int) -> None:
    if os.path.exists(path):
        os.unlink(path)
    with open(path, "wb") as f:
        f.truncate(size)
    run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=0,lazy_journal_init=0", path])


def attach_image(image: str, mountpoint: str, stack: contextlib.ExitStack) -> str:
    """losetup + mount; undone by `stack`. Returns the loop device."""
    dev = run(["losetup", "--find", "--show", "--direct-io=on", image]).stdout.strip()
    stack.callback(undo, ["losetup", "-d", dev])
    os.makedirs(mountpoint, exist_ok=True)
    run(["mount", dev, mountpoint])
    stack.callback(undo, ["umount", mountpoint])
    return dev


def device_read_bytes(dev: str) -> int:
    """Bytes read from the device by anyone (/sys/block/loopN/stat: sectors read)."""
    with open(f"/sys/block/{os.path.basename(dev)}/stat") as f:
        return int(f.read().split()[2]) * 512


class ReadCap:
    """A blkio cgroup capping reads from one device; this process (and so its children) in it,
    unless ``join`` is false (then ``enter`` puts a child in it as it starts)."""

    def __init__(self, dev: str, iops: int, bps: int, name: str = "bench", join: bool = True):
        rdev = os.stat(dev).st_rdev
        self.majmin = f"{os.major(rdev)}:{os.minor(rdev)}"
        self.path = os.path.join(BLKIO, f"shardfs-{name}-{os.getpid()}")
        os.mkdir(self.path)
        write(os.path.join(self.path, "blkio.throttle.read_iops_device"), f"{self.majmin} {iops}")
        write(os.path.join(self.path, "blkio.throttle.read_bps_device"), f"{self.majmin} {bps}")
        self.joined = join
        if join:
            self.enter()

    def enter(self) -> None:
        """Put the calling process in the group (also as a subprocess's preexec_fn: after the fork)."""
        write(os.path.join(self.path, "cgroup.procs"), str(os.getpid()))

    def holds(self, pid: int) -> bool:
        with open(os.path.join(self.path, "cgroup.procs")) as f:
            return str(pid) in f.read().split()

    def reads(self) -> tuple[int, int]:
        """(requests, bytes) the group's processes have read from the device so far, as the cap
        counts them (io_serviced, io_service_bytes): what the capped storage served them, counted
        by the kernel, independently of what the daemons say."""
        got = {}
        for name in ("blkio.throttle.io_serviced", "blkio.throttle.io_service_bytes"):
            with open(os.path.join(self.path, name)) as f:
                got[name] = next((int(p[2]) for p in map(str.split, f) if p[:2] == [self.majmin, "Read"]), 0)
        return got["blkio.throttle.io_serviced"], got["blkio.throttle.io_service_bytes"]

    def read_bytes(self) -> int:
        return self.reads()[1]

    def close(self) -> None:
        if self.joined:
            write(os.path.join(BLKIO, "cgroup.procs"), str(os.getpid()))
        for _ in range(50):  # exited children leave the group a moment later
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)
        with open(os.path.join(self.path, "cgroup.procs")) as f:
            print(f"WARNING: cgroup {self.path} still holds {f.read().split()}: left in place", file=sys.stderr)


def dataset(work: str, want: dict, image_size: int, fill, rebuild: bool,
            stack: contextlib.ExitStack) -> tuple[str, str, dict]:
    """The shared storage work/shared (image work/shared.img), attached, with its dataset: reused
    when work/marker.json records the same `want`, else a fresh image that `fill(shared)` fills
    (it returns what the marker keeps). Returns (mountpoint, loop device, marker)."""
    image, shared = os.path.join(work, "shared.img"), os.path.join(work, "shared")
    marker_path = os.path.join(work, "marker.json")
    try:
        with open(marker_path) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        marker = {}
    reuse = marker.get("params") == want and os.path.exists(image) and not rebuild
    if not reuse:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(marker_path)
        make_image(image, image_size)
    dev = attach_image(image, shared, stack)
    if reuse:
        print(f"dataset: reusing {image} ({marker['files']} JPEGs)")
        return shared, dev, marker
    marker = {"params": want, **fill(shared)}
    with open(marker_path, "w") as f:
        json.dump(marker, f, indent=1)
    return shared, dev, marker


def shard_files(shared: str) -> list[str]:
    top = os.path.join(shared, "shards")
    return sorted(os.path.join(top, n) for n in os.listdir(top) if n.endswith(".tar"))


def begin(parser, args) -> str:
    """A capped-storage benchmark's start: root (loop devices, blkio cgroups, drop_caches), SIGTERM
    that unwinds its ExitStacks, its work folder made, its first lines printed. Returns the folder."""
    from .machine import print_header
    from .mounts import sigterm_unwinds

    if os.geteuid() != 0:
        parser.error("run as root: loop devices, blkio cgroups and drop_caches need it")
    sigterm_unwinds()
    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    print_header(work)
    return work
