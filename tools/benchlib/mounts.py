"""Mount lifecycles: wait until a daemon has mounted, unmount in order, stop a child we started.

Processes are only ever signalled by a pid this run started (or the daemon of a mount it made),
never by name. ``Mounts`` remembers every live mount and undoes them all on the way out, also
when SIGTERM or Ctrl-C ends the run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import time

from shardfs.service.mount import is_stale, process_alive

from .cli import run, shardfs

STATS_XATTR = "user.shardfs.stats"


def stop_child(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """End a child process we started: SIGTERM, then SIGKILL after ``grace`` seconds; reaped."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def sigterm_unwinds() -> None:
    """From now on SIGTERM ends this process through KeyboardInterrupt, so that its ExitStacks
    undo everything (mounts, cgroups, loop devices); a forked helper (a reader) just exits."""
    main_pid = os.getpid()

    def on_term(signum, _frame):
        if os.getpid() != main_pid:
            os._exit(128 + signum)
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)


def is_mounted(mnt: str) -> bool:
    """Mounted, or a FUSE mount whose daemon died (ENOTCONN)."""
    return os.path.ismount(mnt) or is_stale(mnt)


def mount_stats(mnt: str) -> dict | None:
    """A shardfs mount's figures (its stats xattr); None for other filesystems."""
    try:
        return json.loads(os.getxattr(mnt, STATS_XATTR))
    except (OSError, ValueError):
        return None


def release(mnt: str, fuse: bool = True) -> None:
    """Unmount: normally first, lazily when that fails (busy, or its daemon is gone); fusermount3
    for FUSE, umount(8) for kernel mounts and as the last resort."""
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    for lazy in (False, True):
        for cmd in ([tool, "-u"] if fuse and tool else None, ["umount"]):
            if cmd and is_mounted(mnt):
                run([*cmd, *((["-z"] if cmd[0] == tool else ["-l"]) if lazy else []), mnt])


def wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not process_alive(pid)


@dataclasses.dataclass
class Mounted:
    """One live mount: where it is, the daemon's pid (None for a kernel mount), our child process
    when we started the daemon directly, whether FUSE serves it."""

    mnt: str
    pid: int | None = None
    proc: subprocess.Popen | None = None
    fuse: bool = True
    log: str | None = None

    def stats(self) -> dict | None:
        return mount_stats(self.mnt)

    def unmount(self, wait: float = 30.0) -> float:
        """Unmount and wait for the daemon to exit; returns the seconds that took."""
        t = time.perf_counter()
        release(self.mnt, self.fuse)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                stop_child(self.proc)
        elif self.pid and not wait_gone(self.pid, wait):
            print(f"daemon {self.pid} still alive {wait:.0f} s after unmount: SIGTERM to it", flush=True)
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        return time.perf_counter() - t


def wait_mounted(mnt: str, proc: subprocess.Popen, timeout: float, log: str | None = None) -> None:
    """Return once ``mnt`` is mounted; fail fast when the daemon died; stop it after ``timeout``."""
    deadline = time.monotonic() + timeout
    where = f" (log {log})" if log else ""
    while not os.path.ismount(mnt):
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} ... exited with {proc.returncode} before {mnt} was mounted{where}")
        if time.monotonic() > deadline:
            stop_child(proc)
            raise RuntimeError(f"{mnt} not mounted after {timeout:.0f} s{where}")
        time.sleep(0.01)


class Mounts:
    """Every mount of a run; leaving the ``with`` block unmounts what is left.

    Inside it, SIGTERM and SIGINT end the run through ``KeyboardInterrupt`` (so ``finally`` blocks
    unmount), but not while a mount is being made: then they wait until it is recorded, so that none
    is left behind. Forked helpers (reader pools, DataLoader workers) just exit on them."""

    def __init__(self):
        self.live: dict[str, Mounted] = {}
        self._critical = 0
        self._pending: int | None = None
        self._owner = os.getpid()

    def __enter__(self) -> "Mounts":
        self._saved = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc) -> None:
        try:
            for m in list(self.live.values()):
                self.unmount(m)
        finally:
            for sig, handler in self._saved.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum, _frame) -> None:
        if os.getpid() != self._owner:
            os._exit(128 + signum)
        if self._critical:
            self._pending = signum
            return
        raise KeyboardInterrupt(f"signal {signum}")

    def _mounting(self, mnt: str, start) -> Mounted:
        os.makedirs(mnt, exist_ok=True)
        if is_mounted(mnt):
            print(f"{mnt} is still mounted (an earlier run?): unmounting it first", flush=True)
            release(mnt)
        self._critical += 1
        try:
            self.live[mnt] = Mounted(mnt)  # from now on __exit__ looks at it, even if mounting fails
            self.live[mnt] = m = start()
            return m
        except BaseException:
            self.unmount(self.live[mnt])
            raise
        finally:
            self._critical -= 1
            if not self._critical and self._pending is not None:
                signum, self._pending = self._pending, None
                raise KeyboardInterrupt(f"signal {signum}")

    def shardfs(self, sources: list[str], mnt: str, *options: str, log: str, preexec_fn=None) -> Mounted:
        """``shardfs mount`` through the real CLI; the daemon's pid from the mount's stats.
        ``preexec_fn``: run in the child before it starts (e.g. joining a cgroup of its own)."""
        def start():
            shardfs("mount", *sources, mnt, "--log-file", log, *options, check=True, timeout=7200,
                    preexec_fn=preexec_fn)
            st = mount_stats(mnt)
            if not st or "pid" not in st:
                raise RuntimeError(f"{mnt}: mounted, but the stats xattr gives no pid")
            return Mounted(mnt, pid=st["pid"], log=log)
        return self._mounting(mnt, start)

    def spawn(self, cmd: list[str], mnt: str, log: str, timeout: float = 3600) -> Mounted:
        """A FUSE daemon run in the foreground as our child (ratarmount -f, squashfuse_ll -f)."""
        def start():
            with open(log, "a") as lf:
                proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
            m = Mounted(mnt, pid=proc.pid, proc=proc, log=log)
            self.live[mnt] = m
            wait_mounted(mnt, proc, timeout, log)
            return m
        return self._mounting(mnt, start)

    def kernel(self, cmd: list[str], mnt: str) -> Mounted:
        """A kernel mount (e.g. ``mount -t squashfs -o loop,ro IMAGE MNT``): no daemon."""
        def start():
            done = run(cmd)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()}")
            return Mounted(mnt, fuse=False)
        return self._mounting(mnt, start)

    def unmount(self, m: Mounted) -> float:
        self.live.pop(m.mnt, None)
        return m.unmount()
