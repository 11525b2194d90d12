"""Memory budgets: sizes as users write them, and how much memory this process may use.

A budget is a share of what the daemon may really use: the node's available memory, or what
its cgroup (a batch job's memory limit) leaves, whichever is smaller.
"""

from __future__ import annotations

import re


def parse_size(text: str, room: int | None = None) -> int:
    """``64G``, ``512M``, ``1.5T``, ``1000000`` (bytes) or ``50%`` (of ``room``: by default
    what this process may use, see ``memory_room``)."""
    text = text.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(%|[kKmMgGtT]i?[bB]?|[bB])?", text)
    if not match:
        raise ValueError(f"cannot read size {text!r} (examples: 64G, 512M, 50%)")
    number, unit = float(match.group(1)), (match.group(2) or "").upper()
    if unit == "%":
        if not 0 < number <= 100:
            raise ValueError(f"cache share {text!r} must be between 0 and 100%")
        return int((memory_room()[0] if room is None else room) * number / 100)
    scale = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[unit[:1] if unit else ""]
    return int(number * scale)


def meminfo(field: str, proc_root: str = "/proc") -> int:
    with open(f"{proc_root}/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


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


class MemoryCgroup:
    """One memory cgroup with a limit, above or at this process (v1 or v2 file names)."""

    def __init__(self, folder: str, v2: bool, limit: int):
        self.folder, self.v2, self.limit = folder, v2, limit
        self.limit_file = f"{folder}/{'memory.max' if v2 else 'memory.limit_in_bytes'}"

    def read(self, name: str) -> str:
        with open(f"{self.folder}/{name}") as f:
            return f.read()

    def usage(self) -> int:
        return int(self.read("memory.current" if self.v2 else "memory.usage_in_bytes"))

    def stat(self, key: str) -> int:
        # v1 reports the hierarchy's totals as total_<key>
        wanted = key if self.v2 else f"total_{key}"
        for line in self.read("memory.stat").splitlines():
            name, value = line.split()
            if name == wanted:
                return int(value)
        return 0

    def left(self, reclaimable: bool = False) -> int:
        """Bytes left under the limit; with ``reclaimable``, counting the inactive file cache
        as free (the kernel drops it before it OOM-kills anything)."""
        return max(0, self.limit - self.usage() + (self.stat("inactive_file") if reclaimable else 0))


def memory_cgroups(proc_root: str = "/proc") -> list[MemoryCgroup]:
    """Every memory cgroup with a limit that binds this process, innermost first: cgroup v2
    memory.max, v1 memory.limit_in_bytes, walking up the hierarchy (a parent's limit binds too)."""
    try:
        with open(f"{proc_root}/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    v2_root, v1_root = _cgroup_mounts(proc_root)
    found = []
    for line in lines:
        _id, controllers, path = line.split(":", 2)
        if controllers == "" and v2_root:
            base, v2 = v2_root, True
        elif "memory" in controllers.split(",") and v1_root:
            base, v2 = v1_root, False
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):
            group = MemoryCgroup("/".join([base, *parts[:depth]]), v2, 0)
            try:
                text = group.read(group.limit_file.rsplit("/", 1)[1]).strip()
                group.limit = 0 if text == "max" else int(text)
                group.usage()
            except (OSError, ValueError):
                continue
            if 0 < group.limit < 1 << 60:  # v1 says "no limit" with a huge number
                found.append(group)
    return found


def cgroup_memory_limit(proc_root: str = "/proc") -> tuple[int, str] | None:
    """(bytes left under this process's tightest cgroup memory limit, which file said so), or None."""
    best = None
    for group in memory_cgroups(proc_root):
        try:
            left = group.left()
        except (OSError, ValueError):
            continue
        if best is None or left < best[0]:
            best = (left, group.limit_file)
    return best


def memory_room() -> tuple[int, str]:
    """(bytes this process may still use, why): the node's available memory, or what its
    cgroup (a batch job's memory limit) leaves, whichever is smaller."""
    available = meminfo("MemAvailable")
    room, why = available, f"the {available / 2**30:.1f} GiB available on the node"
    limit = cgroup_memory_limit()
    if limit is not None and limit[0] < room:
        room, why = limit[0], f"the {limit[0] / 2**30:.1f} GiB left under the cgroup limit ({limit[1]})"
    return room, why


def default_budget() -> tuple[int, str]:
    """Half of what this process may still use (``memory_room``). The other half stays for the
    training job, so the job is never OOM-killed because of our cache."""
    room, why = memory_room()
    return room // 2, f"half of {why}"


def share_budget(text: str) -> tuple[int, str]:
    """A ``--cache-size`` and why: ``N%`` is a share of ``memory_room``, anything else a size."""
    if not text.strip().endswith("%"):
        return parse_size(text), f"--cache-size {text}"
    room, why = memory_room()
    return parse_size(text, room), f"--cache-size {text} of {why}"
