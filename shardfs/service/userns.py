"""`shardfs run` where fusermount3 cannot mount: a user and mount namespace of our own.

A user other than root mounts FUSE through the setuid fusermount3. Where it is missing, or cannot
work (not setuid root; no_new_privs set, as in many containers), but unprivileged user namespaces are
allowed (RHEL 8+, Debian 11+, Ubuntu), `shardfs run` enters a new user namespace that maps only the
user's own uid and gid (to themselves: the command runs as the same user) and a new mount namespace
with private propagation, mounts /dev/fuse there with mount(2), and the daemon serves it as
/dev/fd/N (fuse/devfd.py), as Apptainer does without setuid. The mount is seen by the command and
its children only, and ends with them. FUSE in a user namespace needs kernel 4.18 (RHEL 8) or newer.

The kernel makes a user namespace only for a process with one thread, and by the time `shardfs run`
knows it needs one, libraries it imported may have started some (OpenBLAS under numpy): it starts
itself again (exec, the same pid) with ENV set, and enters the namespace before importing them.
This module imports nothing heavy for that reason.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import sys
from collections.abc import Iterator

from shardfs.errors import UsageError
from shardfs.fuse import devfd

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_REC, MS_PRIVATE = 0x4000, 1 << 18
ENV = "SHARDFS_USER_NAMESPACE"  # set for the process started again: why fusermount3 will not do
ALLOW = ("ask an admin to install fuse3 (fusermount3, setuid root) or to allow unprivileged user namespaces "
         "(sysctl user.max_user_namespaces > 0; Debian 10: kernel.unprivileged_userns_clone=1; Ubuntu 24.04: "
         "kernel.apparmor_restrict_unprivileged_userns=0)")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


_entered = False
WHY_NOT = {errno.ENOSPC: "the limit of user namespaces is reached: user.max_user_namespaces",
           errno.EPERM: "not permitted: a sysctl or security policy forbids them",
           errno.EINVAL: "this process has threads"}


def restart(argv: list[str], problem: str) -> None:
    """Start this command line (``shardfs`` ARGV) again in this process, to enter the namespace first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "shardfs", *argv], {**os.environ, ENV: problem})


def enter_if_asked() -> None:
    """The start of a process that ``restart`` started: into the namespace, before anything else."""
    problem = os.environ.pop(ENV, None)  # neither the daemon nor the command gets it
    if problem:
        enter(problem)


def entered() -> bool:
    return _entered


def enter(problem: str) -> None:
    """Into a new user namespace (our uid and gid mapped to themselves) and mount namespace; the
    process keeps full capabilities there until it runs another program. ``problem``: why
    fusermount3 will not do (for the message when the kernel refuses this too)."""
    uid, gid = os.getuid(), os.getgid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
        code = ctypes.get_errno()
        why = WHY_NOT.get(code, os.strerror(code))
        raise UsageError(f"cannot mount: {problem}, and a user namespace cannot be made here ({why}): {ALLOW}")
    _write("/proc/self/setgroups", "deny")  # required before gid_map by an unprivileged writer
    _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
    _write("/proc/self/gid_map", f"{gid} {gid} 1\n")
    # nothing mounted here reaches the namespace we came from (its shared mounts are slaves here already)
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise UsageError(f"cannot make the new mount namespace private: {os.strerror(ctypes.get_errno())}")
    global _entered
    _entered = True


@contextlib.contextmanager
def mounted(sources: list[str], mountpoint: str | None, problem: str, **options) -> Iterator[str]:
    """As shardfs.mounted, in the namespace ``enter`` made, for this process and what it starts."""
    from shardfs.service.api import mountpoint_or_temporary, serving
    from shardfs.service.mount import default_log_file

    with mountpoint_or_temporary(mountpoint) as path:
        # named after the mountpoint, not after /dev/fd/N (which every such mount would share); before
        # the mount: until its daemon answers, a look at the path waits
        options = {**options, "log_file": options.get("log_file") or default_log_file(path)}
        try:
            fd = devfd.mount_fuse(os.path.abspath(path), "shardfs")
        except OSError as exc:
            raise UsageError(f"cannot mount: {problem}, and in a user namespace {exc.strerror} "
                             f"(FUSE there needs kernel 4.18 or newer): {ALLOW}") from None
        try:
            with serving(sources, path, options, fuse_fd=fd) as root:
                yield root
        finally:
            with contextlib.suppress(OSError):  # a daemon that never started: its mount is still there
                devfd.unmount(os.path.abspath(path), lazy=True)
