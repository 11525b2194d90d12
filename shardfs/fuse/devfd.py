"""A FUSE connection mounted before the daemon starts: the mountpoint ``/dev/fd/N``.

Container runtimes (Apptainer's ``--fusemount``, Kubernetes CSI drivers for FUSE filesystems) open
/dev/fuse, mount it with mount(2) and start the filesystem with ``/dev/fd/N`` in place of the
mountpoint; libfuse (3.3 and newer) then serves that descriptor, and the loop ends when the mount
is unmounted. ``shardfs run`` in a user namespace mounts one itself the same way (``mount_fuse``).
"""

from __future__ import annotations

import ctypes
import os
import re
import stat

from shardfs.errors import UsageError

DEVICE = os.makedev(10, 229)  # /dev/fuse
# <linux/mount.h>
MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
MNT_DETACH = 2


def descriptor(mountpoint: str) -> int | None:
    """N of a mountpoint ``/dev/fd/N`` (libfuse's own rule: nothing else in the name), else None."""
    found = re.fullmatch(r"/dev/fd/(\d+)", mountpoint)
    return int(found[1]) if found else None


def check(mountpoint: str) -> None:
    """A /dev/fd/N mountpoint must be an open /dev/fuse descriptor (one the caller mounted)."""
    fd = descriptor(mountpoint)
    try:
        st = os.fstat(fd)
    except OSError:
        raise UsageError(f"{mountpoint}: descriptor {fd} is not open: whoever starts shardfs with a /dev/fd/N "
                         f"mountpoint opens /dev/fuse, mounts it and passes the descriptor on") from None
    if not stat.S_ISCHR(st.st_mode) or st.st_rdev != DEVICE:
        raise UsageError(f"{mountpoint}: descriptor {fd} is not /dev/fuse")


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def mount_fuse(mountpoint: str, fsname: str, options: list[str] = ()) -> int:
    """Open /dev/fuse and mount it read-only at ``mountpoint`` with mount(2), as a container runtime
    does (needs CAP_SYS_ADMIN: root, or the owner of a user namespace); returns the descriptor for
    the daemon's ``/dev/fd/N``. Only this process's uid may use the mount unless ``allow_other``."""
    fd = os.open("/dev/fuse", os.O_RDWR)
    data = ",".join([f"fd={fd}", "rootmode=40000", f"user_id={os.getuid()}", f"group_id={os.getgid()}",
                     "default_permissions", *options])
    if _libc().mount(fsname.encode(), mountpoint.encode(), b"fuse.shardfs", MS_RDONLY | MS_NOSUID | MS_NODEV,
                     data.encode()) != 0:
        err = ctypes.get_errno()
        os.close(fd)
        raise OSError(err, f"mount(2) of /dev/fuse at {mountpoint}: {os.strerror(err)}")
    return fd


def unmount(mountpoint: str, lazy: bool = False) -> None:
    """umount2(2): a mount made by ``mount_fuse`` (no fusermount3 involved)."""
    if _libc().umount2(mountpoint.encode(), MNT_DETACH if lazy else 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount of {mountpoint}: {os.strerror(err)}")
