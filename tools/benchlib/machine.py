"""The machine a figure was measured on: facts, CPU meters, waiting for quiet, free page reporting."""

from __future__ import annotations

import atexit
import hashlib
import mmap
import os
import platform
import shutil
import time

from .caches import drops_by_others
from .cli import run

HZ = os.sysconf("SC_CLK_TCK")
MIN_WINDOW_S = 0.5
PAGE_REPORTING = "/sys/module/page_reporting/parameters/page_reporting_order"
NO_REPORTING_ORDER = 11  # above the buddy allocator's largest order: no free block is ever reported


def meminfo(key: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def proc_status(pid: int) -> dict:
    """VmRSS, VmHWM (bytes), CPU seconds (its own and its reaped children's) and storage read_bytes
    of a process; {} when it is gone."""
    out: dict = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(value.split()[0]) * 1024
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out["cpu_s"] = sum(int(x) for x in fields[11:15]) / HZ
        with open(f"/proc/{pid}/io") as f:
            out["read_bytes"] = next(int(ln.split()[1]) for ln in f if ln.startswith("read_bytes:"))
    except (OSError, StopIteration):
        pass
    return out


def _busy_cpu_s() -> float:
    """Busy CPU seconds of the whole machine (all cores) since boot."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)) / HZ  # no idle, iowait


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class Others:
    """What other processes did during a pass: their share of the machine's CPU (other jobs make
    figures noisy) and their page-cache drops (a warm figure is then not warm)."""

    def __init__(self, daemon_pid: int | list[int] | None = None):
        """``daemon_pid``: our daemon(s), whose CPU counts as ours (they are not our children)."""
        self.daemon_pids = daemon_pid if isinstance(daemon_pid, list) else [daemon_pid] if daemon_pid else []
        self.t0, self.busy0, self.own0 = time.perf_counter(), _busy_cpu_s(), _own_cpu_s()
        self.daemon0 = self._daemon_cpu()
        self.drops0 = drops_by_others()

    def _daemon_cpu(self) -> float:
        return sum(proc_status(pid).get("cpu_s", 0.0) for pid in self.daemon_pids)

    def done(self) -> dict:
        """``background_cpu`` is None for a window under MIN_WINDOW_S: CPU time is counted in clock
        ticks (10 ms), too coarse to judge a shorter one."""
        secs = time.perf_counter() - self.t0
        ours = _own_cpu_s() - self.own0 + self._daemon_cpu() - self.daemon0
        share = max(0.0, (_busy_cpu_s() - self.busy0 - ours) / (secs * (os.cpu_count() or 1)))
        return {"background_cpu": share if secs >= MIN_WINDOW_S else None,
                "foreign_drops": drops_by_others() - self.drops0}


def wait_quiet(limit_s: float, threshold: float = 0.15) -> dict | None:
    """Wait (up to ``limit_s``) for 2 s in which other processes used less than ``threshold`` of
    the CPU and dropped no caches; returns the last window's figures (None when not waiting)."""
    if limit_s <= 0:
        return None
    deadline = time.monotonic() + limit_s
    while True:
        others = Others()
        time.sleep(2.0)
        seen = others.done()
        if (seen["background_cpu"] < threshold and not seen["foreign_drops"]) or time.monotonic() >= deadline:
            return seen


def page_reporting_order() -> str:
    try:
        with open(PAGE_REPORTING) as f:
            return f.read().strip()
    except OSError:
        return "absent"


def free_page_reporting_off() -> str:
    """Turn a VM's free page reporting off for this run (restored at exit) and back the free memory.

    With it on, the guest hands freed memory back to the host, and the first touch of each such
    page faults on the host, charged to the guest CPU that touches it: a FUSE daemon (its cache,
    and the kernel's copy of every reply into fresh page-cache pages) pays it, a plain directory's
    page cache filled by the disk's DMA does not. Off is NOT the machine as it comes: figures
    measured so must say so. Returns what was done, for the output."""
    old = page_reporting_order()
    if old == "absent":
        return "free page reporting: not present on this machine (nothing changed)"
    with open(PAGE_REPORTING, "w") as f:
        f.write(str(NO_REPORTING_ORDER))
    owner = os.getpid()

    def restore() -> None:
        if os.getpid() == owner:  # not a forked helper exiting
            with open(PAGE_REPORTING, "w") as f:
                f.write(old)

    atexit.register(restore)
    # Memory reported before now stays unbacked until touched: touch most of it once.
    size = max(0, min(meminfo("MemAvailable") - (4 << 30), 16 << 30))
    t0 = time.perf_counter()
    if size:
        with mmap.mmap(-1, size) as buf:
            for i in range(0, size, mmap.PAGESIZE):
                buf[i] = 1
    return (f"free page reporting: OFF for this run (order {old} -> {NO_REPORTING_ORDER}, restored at exit); "
            f"{size / 2**30:.1f} GiB of free memory backed in {time.perf_counter() - t0:.1f} s")


def _tool_version(cmd: list[str], prefix: str) -> str | None:
    if not shutil.which(cmd[0]):
        return None
    d = run(cmd)
    return next((ln.strip() for ln in (d.stdout + d.stderr).splitlines() if ln.startswith(prefix)), "?")


def facts(work: str) -> dict:
    """Cores, memory, CPU model, kernel, Python, root, the workdir's filesystem, tunables, versions."""
    out = {
        "nproc": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)),
        "ram_gb": round(meminfo("MemTotal") / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "root": os.geteuid() == 0,
        "free_page_reporting_order": page_reporting_order(),
        "workdir_fs": run(["findmnt", "-n", "-o", "SOURCE,FSTYPE", "-T", work]).stdout.strip(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            out["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    except OSError:
        pass
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("shardfs", "mfusepy", "numpy", "torch", "torchvision", "pillow", "ratarmount"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    for name, cmd in (("squashfuse", ["squashfuse_ll", "--version"]), ("fusermount3", ["fusermount3", "--version"])):
        v = _tool_version(cmd, name)
        if v:
            out[name] = v
    return out


def describe(f: dict) -> str:
    """One line for the output: the facts a reader needs to compare figures."""
    return ", ".join(f"{k}={v}" for k, v in f.items())


def print_header(work: str) -> None:
    """A run's first lines: its command, the machine and the commit of the code measured."""
    import sys

    print(f"command: python3 {' '.join(sys.argv)}")
    print(f"machine: {describe(facts(work))}, load {os.getloadavg()[0]:.1f}")
    code = code_state()
    changed = f" with uncommitted changes to {', '.join(code['uncommitted'])}" if code["uncommitted"] else ""
    print(f"shardfs code: commit {code['commit']}{changed}")


def code_state() -> dict:
    """Which shardfs code the mounts run: commit, uncommitted files, a digest of shardfs/ now."""
    from .cli import REPO

    h = hashlib.sha256()
    for d, _dirs, names in sorted(os.walk(os.path.join(REPO, "shardfs"))):
        for n in sorted(names):
            if n.endswith((".py", ".c", ".h")):
                with open(os.path.join(d, n), "rb") as f:
                    h.update(n.encode() + f.read())
    dirty = run(["git", "-C", REPO, "status", "--porcelain", "--", "shardfs"]).stdout.split("\n")
    return {"commit": run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"]).stdout.strip() or "?",
            "uncommitted": [ln[3:] for ln in dirty if ln.strip()], "digest": h.hexdigest()[:12]}
