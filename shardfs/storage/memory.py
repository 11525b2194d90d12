"""Memory budgets: sizes as users write them, and how much memory this process may use.

A budget is a share of what the daemon may really use: the node's available memory, or what
its cgroup (a batch job's memory limit) leaves, whichever is smaller.
"""

from __future__ import annotations

import re


def parse_size(text: str, total_ram: int | None = None) -> int:
    """``64G``, ``512M``, ``1.5T``, ``1000000`` (bytes) or ``50%`` (of RAM)."""
    text = text.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(%|[kKmMgGtT]i?[bB]?|[bB])?", text)
    if not match:
        raise ValueError(f"cannot read size {text!r} (examples: 64G, 512M, 50%)")
    number, unit = float(match.group(1)), (match.group(2) or "").upper()
    if unit == "%":
        if not 0 < number <= 100:
            raise ValueError(f"cache share {text!r} must be between 0 and 100%")
        return int((total_ram or memory_total()) * number / 100)
    scale = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[unit[:1] if unit else ""]
    return int(number * scale)


def _meminfo(field: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def memory_total() -> int:
    return _meminfo("MemTotal")


def _cgroup_mounts(proc_root: str) -> tuple[str | None, str | None]:
    """Where the cgroup v2 hierarchy and the v1 memory controller are mounted, if at all."""
    v2 = v1 = None
    try:
        with open(f"{proc_root}/self/mounts") as f:
            for line in f:
                _dev, where, kind, options = line.split()[:4]
                if kind == "cgroup2":
                    v2 = v2 or where
                elif kind == "cgroup" and "memory" in options.split(","):
                    v1 = v1 or where
    except OSError:
        pass
    return v2, v1


def cgroup_memory_limit(proc_root: str = "/proc") -> tuple[int, str] | None:
    """(bytes left under this process's cgroup memory limit, which file said so), or None.

    cgroup v2: memory.max minus memory.current; v1: memory.limit_in_bytes minus
    memory.usage_in_bytes. Walks up the hierarchy: a parent's limit binds too.
    """
    try:
        with open(f"{proc_root}/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    v2_root, v1_root = _cgroup_mounts(proc_root)
    best = None
    for line in lines:
        _id, controllers, path = line.split(":", 2)
        if controllers == "" and v2_root:
            base, limit_file, usage_file = v2_root, "memory.max", "memory.current"
        elif "memory" in controllers.split(",") and v1_root:
            base, limit_file, usage_file = v1_root, "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):
            folder = "/".join([base, *parts[:depth]])
            try:
                with open(f"{folder}/{limit_file}") as f:
                    text = f.read().strip()
                with open(f"{folder}/{usage_file}") as f:
                    usage = int(f.read().strip())
            except (OSError, ValueError):
                continue
            if text == "max" or int(text) >= 1 << 60:  # v1 says "no limit" with a huge number
                continue
            left = max(0, int(text) - usage)
            if best is None or left < best[0]:
                best = (left, f"{folder}/{limit_file}")
    return best


def default_budget() -> tuple[int, str]:
    """Half of what this process may still use: the node's available memory, or what its
    cgroup (a batch job's memory limit) leaves, whichever is smaller. The other half
    stays for the training job, so the job is never OOM-killed because of our cache."""
    available = _meminfo("MemAvailable")
    room, why = available, f"the {available / 2**30:.1f} GiB available on the node"
    limit = cgroup_memory_limit()
    if limit is not None and limit[0] < room:
        room, why = limit[0], f"the {limit[0] / 2**30:.1f} GiB left under the cgroup limit ({limit[1]})"
    return room // 2, f"half of {why}"
