"""Mounting and unmounting: checks first, a detached daemon that is live before we return."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time

from shardfs.dirs import cache_dir
from shardfs.service.config import MountConfig, storage_env, to_args
from shardfs.errors import UsageError
from shardfs.fuse.lib import check_can_mount
from shardfs.view.sources import find_shards
from shardfs.fuse.stats import STATS_XATTR

log = logging.getLogger("shardfs")

READY_TIMEOUT = 3600  # indexing a huge dataset for the first time can take a while


def _unmount_command(mountpoint: str, lazy: bool) -> list[str]:
    tool = shutil.which("fusermount3")
    if tool:
        return [tool, "-u"] + (["-z"] if lazy else []) + [mountpoint]
    return ["umount"] + (["-l"] if lazy else []) + [mountpoint]


def is_stale(mountpoint: str) -> bool:
    """A FUSE mount whose daemon is gone ("Transport endpoint is not connected").

    statfs always reaches the daemon; a plain stat may be answered from the attribute cache.
    """
    try:
        os.statvfs(mountpoint)
        return False
    except OSError as exc:
        return exc.errno == errno.ENOTCONN


def prepare_mountpoint(mountpoint: str) -> None:
    """Refuse a missing or busy mountpoint; clean a stale one left by a killed daemon."""
    if is_stale(mountpoint):
        subprocess.run(_unmount_command(mountpoint, lazy=True), capture_output=True)
        print(f"shardfs: cleaned a stale mount at {mountpoint} (its daemon had died)", file=sys.stderr)
    try:
        os.stat(mountpoint)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise UsageError(f"mountpoint {mountpoint} does not exist: create it (mkdir -p {mountpoint})") from None
        raise UsageError(f"mountpoint {mountpoint}: {exc.strerror}") from None
    if not os.path.isdir(mountpoint):
        raise UsageError(f"mountpoint {mountpoint} is not a directory")
    if os.path.ismount(mountpoint):
        raise UsageError(f"{mountpoint} is busy: something is mounted there (shardfs umount {mountpoint})")


def default_log_file(mountpoint: str) -> str:
    real = os.path.realpath(mountpoint)
    tag = hashlib.sha256(real.encode()).hexdigest()[:8]
    name = os.path.basename(real.rstrip("/")) or "root"
    return os.path.join(cache_dir(), "logs", f"{name}-{tag}.log")


def mount_detached(cfg: MountConfig) -> int:
    """Start ``shardfs mount --foreground`` in its own session; return once the mount answers."""
    check_can_mount(cfg.allow_other)
    find_shards(cfg.sources)  # fail fast, with the message, before starting anything
    prepare_mountpoint(cfg.mountpoint)
    cfg = dataclasses.replace(cfg, log_file=cfg.log_file or default_log_file(cfg.mountpoint))
    os.makedirs(os.path.dirname(os.path.abspath(cfg.log_file)), exist_ok=True)
    read_end, write_end = os.pipe()
    cmd = [sys.executable, "-m", "shardfs", "mount", *to_args(cfg), "--foreground", "--ready-fd", str(write_end)]
    child = subprocess.Popen(cmd, pass_fds=(write_end,), start_new_session=True, env=storage_env(cfg),
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as ready:
        line = ready.readline()  # EOF without a line: the daemon died before mounting
    if not line:
        code = child.wait(timeout=READY_TIMEOUT)
        print(f"shardfs: mount failed (daemon exit status {code}; log: {cfg.log_file})", file=sys.stderr)
        return code or 1
    info = json.loads(line)
    print(
        f"shardfs: mounted {info['files']} files from {info['shards']} shards at {cfg.mountpoint} "
        f"(pid {info['pid']}, index {info['index_seconds']:.2f} s, log {cfg.log_file})"
    )
    return 0


def daemon_pid(mountpoint: str) -> int | None:
    try:
        return json.loads(os.getxattr(mountpoint, STATS_XATTR))["pid"]
    except (OSError, ValueError, KeyError):
        return None


def unmount(mountpoint: str, lazy: bool = False, wait: float = 30.0) -> int:
    if is_stale(mountpoint):
        lazy = True  # the daemon is gone: nothing to wait for
    elif not os.path.ismount(mountpoint):
        raise UsageError(f"{mountpoint} is not mounted")
    pid = daemon_pid(mountpoint)
    done = subprocess.run(_unmount_command(mountpoint, lazy), capture_output=True, text=True)
    if done.returncode != 0:
        why = done.stderr.strip() or f"exit status {done.returncode}"
        if "busy" in why.lower():
            raise UsageError(f"{mountpoint} is busy (a process has files open there); "
                             f"close them, or use --lazy: {why}")
        raise UsageError(f"cannot unmount {mountpoint}: {why}")
    # Return once the daemon has logged its summary and exited, so scripts can rely on it.
    deadline = time.monotonic() + wait
    while pid and process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return 0


def process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def force_unmount(mountpoint: str) -> None:
    """Unmount and wait for the daemon; fall back to a lazy unmount when busy. Never raises."""
    try:
        unmount(mountpoint)
    except UsageError:
        if os.path.ismount(mountpoint) or is_stale(mountpoint):
            subprocess.run(_unmount_command(mountpoint, lazy=True), capture_output=True)
