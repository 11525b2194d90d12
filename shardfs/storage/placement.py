"""Where a disk tier may go by default: node-local scratch of a batch job, never a network filesystem."""

from __future__ import annotations

import os

# Filesystems on a local block device. Anything else (nfs, lustre, gpfs, cifs, fuse.*, ceph,
# beegfs, tmpfs, overlay ...) is shared, remote or RAM: a tier there saves nothing, or costs RAM.
LOCAL_FILESYSTEMS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "zfs", "bcachefs", "jfs"}
SCRATCH_ENV = ("SLURM_TMPDIR", "TMPDIR")
SCRATCH_DIRS = ("/local", "/scratch/local")


def filesystem_type(path: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The type of the filesystem holding ``path`` (the mount with the longest matching prefix)."""
    real = os.path.realpath(path)
    best, fstype = "", None
    with open(mountinfo) as f:
        for line in f:
            left, _, right = line.partition(" - ")
            point = left.split()[4].replace("\\040", " ")
            inside = real == point or real.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best):
                best, fstype = point, right.split()[0]
    return fstype


# The kernel's own filesystems (/proc, /sys, /dev, ...): no place for a mount, a cache or a log.
KERNEL_FILESYSTEMS = {"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs",
                      "bpf", "configfs", "pstore", "mqueue", "hugetlbfs", "fusectl", "binfmt_misc", "efivarfs"}


def unusable_folder(path: str, read_only_ok: bool = False) -> str | None:
    """Why files could not be made in the folder ``path`` (created as needed), or None: checked
    before a mount starts, so that a cache, index or log folder named wrong is one line at once.
    read_only_ok: a folder that is there may be one to read from only (indexes made by others)."""
    existing = os.path.abspath(path)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{existing} is not a directory"
    kind = filesystem_type(existing)
    if kind in KERNEL_FILESYSTEMS:
        return f"{existing} is on {kind}, a filesystem of the kernel's own: name a folder on disk"
    if read_only_ok and existing == os.path.abspath(path):
        return None
    if os.statvfs(existing).f_flag & os.ST_RDONLY:
        return f"{existing} is on a read-only filesystem: name a folder on a writable one"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing}: permission denied: name a folder of yours"
    return None


def is_local_disk(path: str) -> bool:
    try:
        return os.path.isdir(path) and filesystem_type(path) in LOCAL_FILESYSTEMS
    except OSError:
        return False


def job_scratch_tier(env: dict | None = None) -> str | None:
    """``<scratch>/shardfs-cache-<uid>`` on the job's node-local scratch, if it has one."""
    env = os.environ if env is None else env
    for place in [env.get(name) for name in SCRATCH_ENV] + list(SCRATCH_DIRS):
        if place and is_local_disk(place):
            return os.path.join(place, f"shardfs-cache-{os.getuid()}")
    return None
