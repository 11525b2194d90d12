"""`shardfs status`: every shardfs mount on this node, and whether its daemon answers."""

from __future__ import annotations

import json
import os
import threading

from shardfs.fuse.stats import STATS_XATTR

FSTYPE = "fuse.shardfs"


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \\ooo
    return field.encode().decode("unicode_escape").encode("latin-1").decode("utf-8", "surrogateescape")


def shardfs_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[tuple[str, str]]:
    """(mountpoint, source) of every shardfs mount."""
    found = []
    with open(mountinfo) as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype, source = right.split()[:2]
            if fstype == FSTYPE:
                found.append((_unescape(left.split()[4]), _unescape(source)))
    return found


def probe(mountpoint: str, timeout: float = 3.0) -> tuple[str, dict]:
    """(state, figures): "ok" with the daemon's figures, "stale" (daemon gone) or "not answering"."""
    result: dict = {}

    def ask() -> None:
        try:
            result["figures"] = json.loads(os.getxattr(mountpoint, STATS_XATTR))
        except OSError as exc:
            result["error"] = exc

    worker = threading.Thread(target=ask, daemon=True)  # a hung daemon must not hang `status`
    worker.start()
    worker.join(timeout)
    if "figures" in result:
        return "ok", result["figures"]
    error = result.get("error")
    if error is None:
        return "not answering", {}
    return ("stale" if error.errno == 107 else f"error: {error.strerror}"), {}


def collect(only: str | None = None) -> list[dict]:
    rows = []
    for mountpoint, source in shardfs_mounts():
        if only and os.path.realpath(only) != os.path.realpath(mountpoint):
            continue
        state, figures = probe(mountpoint)
        rows.append({"mountpoint": mountpoint, "source": source, "state": state, **figures})
    return rows


def render(rows: list[dict]) -> str:
    if not rows:
        return "no shardfs mounts"
    lines = [f"{'MOUNTPOINT':<28} {'STATE':<13} {'PID':>7} {'FILES':>10} {'CACHE GiB':>13} {'READS':>10}  SOURCE"]
    for row in rows:
        cache = row.get("cache", {})
        used = f"{cache['used_bytes'] / 2**30:.1f}/{cache['budget_bytes'] / 2**30:.1f}" if cache else "-"
        reads = row.get("fuse_ops", {}).get("read", "-")
        lines.append(f"{row['mountpoint']:<28} {row['state']:<13} {row.get('pid', '-'):>7} "
                     f"{row.get('files', '-'):>10} {used:>13} {reads:>10}  {row['source']}")
    return "\n".join(lines)
