"""Mounting and unmounting: checks first, a detached daemon that is live before we return."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from shardfs.dirs import cache_dir
from shardfs.service.config import MountConfig, storage_env, to_args
from shardfs.errors import ShardfsError, UsageError, one_line
from shardfs.fuse import devfd
from shardfs.service import forked
from shardfs.storage.placement import KERNEL_FILESYSTEMS, filesystem_type
from shardfs.fuse.lib import check_can_mount
from shardfs.view.sources import find_shards

log = logging.getLogger("shardfs")

# A starting daemon reports each shard it has indexed: indexing a huge dataset may take
# hours, but this long without a word means it is stuck (a hung filesystem, a silent server).
STALL_TIMEOUT = 300.0  # the default of `shardfs mount --ready-timeout`
Child = subprocess.Popen | forked.ForkedDaemon  # a daemon started by a new interpreter, or forked


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
    """Refuse a missing or busy mountpoint; clean a stale one left by a killed daemon. A /dev/fd/N
    (devfd) is mounted already, by whoever opened it."""
    if devfd.descriptor(mountpoint) is not None:
        devfd.check(mountpoint)
        return
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
    kind = filesystem_type(mountpoint)
    if kind in KERNEL_FILESYSTEMS:
        raise UsageError(f"mountpoint {mountpoint} is on {kind}, a filesystem of the kernel's own: "
                         "mount on a directory of yours")
    if os.path.ismount(mountpoint):
        raise UsageError(f"{mountpoint} is busy: something is mounted there (shardfs umount {mountpoint})")
    if os.getuid() != 0 and not os.access(mountpoint, os.W_OK):  # fusermount3's own rule
        raise UsageError(f"mountpoint {mountpoint} is not writable by you: a user mounts only on a directory "
                         "of their own (mkdir one)")


def default_log_file(mountpoint: str) -> str:
    real = os.path.realpath(mountpoint)
    tag = hashlib.sha256(real.encode()).hexdigest()[:8]
    name = os.path.basename(real.rstrip("/")) or "root"
    return os.path.join(cache_dir(), "logs", f"{name}-{tag}.log")


def mount_detached(cfg: MountConfig, stall_timeout: float = STALL_TIMEOUT,
                   serve: Callable[[MountConfig, int], int] | None = None) -> int:
    """Start the daemon in its own session; return once the mount answers. serve(cfg, ready_fd):
    the daemon's work (`shardfs mount --foreground`'s), run in a forked child of this process
    (forked.py); without it, or where this process may not fork, a new interpreter runs
    ``shardfs mount --foreground``."""
    check_can_mount(cfg.allow_other, cfg.mountpoint)
    fork = serve is not None and forked.can_fork()
    if not fork:  # else the forked child checks them first (_checked_daemon)
        _check_sources_and_mountpoint(cfg)
    cfg = dataclasses.replace(cfg, log_file=cfg.log_file or default_log_file(cfg.mountpoint))
    os.makedirs(os.path.dirname(os.path.abspath(cfg.log_file)), exist_ok=True)
    open(cfg.log_file, "a").close()  # a log file the daemon cannot write: said here, in one line
    read_end, write_end = os.pipe()
    fuse_fd = devfd.descriptor(cfg.mountpoint)  # a /dev/fd/N mounted already: the daemon serves it
    keep = (write_end,) if fuse_fd is None else (write_end, fuse_fd)
    try:
        if fork:
            child = forked.start(lambda: _checked_daemon(serve, cfg, write_end), keep)
        else:
            cmd = [sys.executable, "-m", "shardfs", "mount", *to_args(cfg), "--foreground", "--ready-fd", str(write_end)]
            child = subprocess.Popen(cmd, pass_fds=keep, start_new_session=True, env=storage_env(cfg),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    finally:
        os.close(write_end)
    try:
        info, why = _wait_ready(child, read_end, stall_timeout)
    finally:
        os.close(read_end)
    if info is not None and "refused" in info:  # the forked daemon's check of the sources
        print(f"shardfs: {info['refused']}", file=sys.stderr)
        child.wait()
        return info["exit_code"]
    if info is None:
        if child.poll() is None:  # alive but stuck: it is ours to stop
            stop_session(child)
            why += f"; stopped it (pid {child.pid})"
        print(f"shardfs: mount failed: {why} (log: {cfg.log_file})", file=sys.stderr)
        return child.returncode if child.returncode and child.returncode > 0 else 1
    print(
        f"shardfs: mounted {info['files']} files from {info['shards']} shards at {cfg.mountpoint} "
        f"(pid {info['pid']}, index {info['index_seconds']:.2f} s, log {cfg.log_file})"
    )
    return 0


def _check_sources_and_mountpoint(cfg: MountConfig) -> None:
    """Fail fast, with the message, before the daemon starts its work."""
    find_shards(cfg.sources)
    prepare_mountpoint(cfg.mountpoint)


def _checked_daemon(serve: Callable[[MountConfig, int], int], cfg: MountConfig, ready_fd: int) -> int:
    """The forked child: first the checks that a command starting a new interpreter makes itself
    (here, after the fork: the formats' imports start threads), a refusal handed to the command to
    print as its one line; then the daemon."""
    try:
        _check_sources_and_mountpoint(cfg)
    except (ShardfsError, OSError) as exc:
        return refuse(ready_fd, exc)
    return serve(cfg, ready_fd)


def refuse(ready_fd: int, exc: ShardfsError | OSError) -> int:
    """A daemon that gives up before it is ready: its one line goes to the `shardfs mount` that waits
    for it (which prints it as its own), not beside that command's "mount failed" line."""
    error = one_line(exc)
    os.write(ready_fd, json.dumps({"refused": str(error), "exit_code": error.exit_code}).encode() + b"\n")
    return error.exit_code


def _wait_ready(child: Child, fd: int, stall_timeout: float) -> tuple[dict | None, str]:
    """The daemon's ready line (its figures), or None and why not. Progress lines
    ({"progress": ...}) restart the clock; silence for ``stall_timeout`` seconds ends the wait."""
    with _IndexBar() as bar:
        return _wait_lines(child, fd, stall_timeout, bar)


def _wait_lines(child: Child, fd: int, stall_timeout: float, bar: _IndexBar) -> tuple[dict | None, str]:
    last, pending = "starting", b""
    deadline = time.monotonic() + stall_timeout
    waiting = select.poll()  # (select() fails on a descriptor over 1,023: a caller with many files open)
    waiting.register(fd, select.POLLIN)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None, f"the daemon made no progress for {stall_timeout:g} s (last step: {last})"
        if not waiting.poll(max(1, int(min(left, 1.0) * 1000))):
            if child.poll() is not None:  # dead, though a process it forked may hold the pipe
                return None, f"the daemon exited with status {child.returncode} (last step: {last})"
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            try:
                code = child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                return None, f"the daemon closed its pipe without mounting (last step: {last})"
            return None, f"the daemon exited with status {code} (last step: {last})"
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            message = json.loads(line)
            if "progress" not in message:
                return message, ""
            last = message["progress"]
            if "index" in message:
                bar.show(message["index"])
            deadline = time.monotonic() + stall_timeout


class _IndexBar:
    """How far the daemon's index build is, as a bar on a terminal (tqdm, as `pack` draws its own);
    shown once an index is being built (a remount loads them at once and shows none)."""

    def __init__(self):
        self.bar = None

    def show(self, f: dict) -> None:
        if self.bar is None and not f["built"] and f["shards"] == f["of"]:
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=f["of"], unit="shard", desc="indexing", disable=None, file=sys.stderr)
        left = f" ~{f['seconds_left']:.0f} s left" if f["seconds_left"] is not None else ""
        self.bar.n = f["shards"]
        self.bar.set_postfix_str(f"{f['members']:,} members, {f['MBps']:.0f} MB/s{left}", refresh=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()


def daemon_pid(mountpoint: str) -> int | None:
    """The daemon's pid, if it answers within a few seconds (a hung one must not hang umount)."""
    from shardfs.service.status import probe

    return probe(mountpoint)[1].get("pid")


def _detach(mountpoint: str, lazy: bool, direct: bool) -> str | None:
    """Unmount; None, or why not. direct: umount2(2) here, for a mount made with mount(2) in a user
    namespace of our own (userns.py), where fusermount3 and umount(8) would run without its capabilities."""
    if direct:
        try:
            devfd.unmount(mountpoint, lazy)
            return None
        except OSError as exc:
            return exc.strerror
    done = subprocess.run(_unmount_command(mountpoint, lazy), capture_output=True, text=True)
    return None if done.returncode == 0 else done.stderr.strip() or f"exit status {done.returncode}"


def unmount(mountpoint: str, lazy: bool = False, wait: float = 30.0, direct: bool = False) -> int:
    if is_stale(mountpoint):
        lazy = True  # the daemon is gone: nothing to wait for
    elif not os.path.ismount(mountpoint):
        raise UsageError(f"{mountpoint} is not mounted")
    elif not (filesystem_type(mountpoint) or "").startswith("fuse"):
        raise UsageError(f"{mountpoint} is not a shardfs mount (it is {filesystem_type(mountpoint)})")
    pid = daemon_pid(mountpoint)
    why = _detach(mountpoint, lazy, direct)
    if why:
        if "busy" in why.lower():
            raise UsageError(f"{mountpoint} is busy (a process has files open there); "
                             f"close them, or use --lazy: {why}")
        raise UsageError(f"cannot unmount {mountpoint}: {why}")
    # Return once the daemon has logged its summary and exited, so scripts can rely on it.
    deadline = time.monotonic() + wait
    while pid and process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid and process_alive(pid):
        raise DaemonOutlived(f"{mountpoint} is unmounted, but its daemon (pid {pid}) is still running after "
                             f"{wait:g} s: files are still open (a lazy unmount), or it is stuck (see its log)")
    return 0


class DaemonOutlived(ShardfsError):
    """The mount is gone but its daemon has not exited within the wait (exit status 1)."""


def process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop_session(proc: Child, grace: float = 10.0) -> None:
    """End a child started with ``start_new_session`` and what it forked (index builders):
    SIGTERM to its process group, SIGKILL after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def force_unmount(mountpoint: str, direct: bool = False) -> None:
    """Unmount and wait for the daemon; fall back to a lazy unmount when busy. Never raises.
    direct: see _detach."""
    try:
        unmount(mountpoint, direct=direct)
    except DaemonOutlived:
        pass  # unmounted: the daemon ends on its own once its last reader lets go
    except UsageError:
        if os.path.ismount(mountpoint) or is_stale(mountpoint):
            _detach(mountpoint, lazy=True, direct=direct)
