"""`shardfs stats --watch`: a live view of a mount for an admin on a node (like `top`).

Rates are differences between two readings of the figures, divided by the time between them.
"""

from __future__ import annotations

import json
import os
import sys
import time

from shardfs.errors import UsageError
from shardfs.fuse.stats import STATS_XATTR

CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen


def read_figures(mountpoint: str) -> dict:
    """The daemon's figures (what `shardfs stats --json` prints); OSError if not a live mount."""
    return json.loads(os.getxattr(mountpoint, STATS_XATTR))


def _requests(figures: dict) -> int:
    return sum(figures.get("fuse_ops", {}).values())


def _rate(now: float, before: float, seconds: float) -> float | None:
    return (now - before) / seconds if seconds > 0 else None


def _per_s(rate: float | None, scale: float = 1.0, unit: str = "/s") -> str:
    return "-" if rate is None else f"{rate / scale:.{1 if scale > 1 else 0}f}{unit}"


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def view(mountpoint: str, now: dict, before: dict | None, seconds: float) -> str:
    """The screen for one refresh; rates are over the last `seconds` ("-" at the first, seconds=0)."""
    cache, old = now.get("cache", {}), (before or now).get("cache", {})
    hits, misses = cache.get("hits", 0), cache.get("misses", 0)
    new_hits, new_misses = hits - old.get("hits", 0), misses - old.get("misses", 0)
    storage_rate = _rate(cache.get("storage_bytes_read", 0), old.get("storage_bytes_read", 0), seconds)
    peer_rate = _rate(cache.get("peer_bytes_read", 0), old.get("peer_bytes_read", 0), seconds)
    served_rate = _rate(now.get("bytes_served", 0), (before or now).get("bytes_served", 0), seconds)
    req_rate = _rate(_requests(now), _requests(before or now), seconds)
    read_rate = _rate(now.get("fuse_ops", {}).get("read", 0), (before or now).get("fuse_ops", {}).get("read", 0),
                      seconds)
    used, budget = cache.get("used_bytes", 0), cache.get("budget_bytes", 0)
    return "\n".join([
        f"shardfs {mountpoint}  pid {now.get('pid', '-')}, up {_duration(now.get('uptime_s', 0))}  "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}",
        f"cache     {used / 2**30:.2f} / {budget / 2**30:.2f} GiB ({_share(used, budget)}); shards "
        f"{cache.get('shards_cached', 0)} cached, {cache.get('shards_loading', 0)} loading, "
        f"{cache.get('shards_evicted', 0)} evicted (of {now.get('shards', 0)})",
        f"hit rate  {_share(new_hits, new_hits + new_misses)} now, {_share(hits, hits + misses)} overall "
        f"({hits} hits, {misses} misses, {cache.get('direct_reads', 0)} direct)",
        f"storage   {_per_s(storage_rate, 1e6, ' MB/s')} now, {cache.get('storage_bytes_read', 0) / 1e6:.1f} MB read"
        + (f" (shared storage only; from peers {_per_s(peer_rate, 1e6, ' MB/s')} now, "
           f"{cache.get('peer_bytes_read', 0) / 1e6:.1f} MB)" if "peers" in now else ""),
        f"requests  {_per_s(req_rate)} now ({_per_s(read_rate, unit=' reads/s')}), {_requests(now)} in total",
        f"served    {_per_s(served_rate, 1e6, ' MB/s')} now, {now.get('bytes_served', 0) / 1e6:.1f} MB in total; "
        f"{now.get('read_errors', 0)} read errors, {now.get('shards_broken', 0)} broken shards",
        *([_disk_line(now["disk"])] if "disk" in now else []),
        *([_peers_line(now["peers"], (before or now).get("peers", {}), seconds)] if "peers" in now else []),
    ])


def _peers_line(peers: dict, old: dict, seconds: float) -> str:
    rate = {key: _per_s(_rate(peers.get(key, 0), old.get(key, 0), seconds), 1e6, " MB/s")
            for key in ("bytes_from_peers", "bytes_to_peers", "storage_bytes_read")}
    failing = ", ".join(f"{peer} {n}" for peer, n in sorted(peers.get("failures_by_peer", {}).items()) if n)
    return (f"peers     {peers.get('peers_up', 0)} up, {peers.get('peers_down', 0)} down"
            f"{' (' + ', '.join(peers['down']) + ')' if peers.get('down') else ''}; from them "
            f"{rate['bytes_from_peers']}, {peers.get('bytes_from_peers', 0) / 1e6:.1f} MB; to them "
            f"{rate['bytes_to_peers']}, {peers.get('bytes_to_peers', 0) / 1e6:.1f} MB; shared storage "
            f"{rate['storage_bytes_read']}, {peers.get('storage_bytes_read', 0) / 1e6:.1f} MB"
            + (f"; failures {failing}" if failing else ""))


def _disk_line(disk: dict) -> str:
    held, bound = disk.get("held_bytes", 0), disk.get("bound_bytes", 0)
    return (f"disk tier {held / 2**30:.2f} / {bound / 2**30:.2f} GiB ({_share(held, bound)}); {disk.get('shards', 0)} "
            f"shards, {disk.get('hits', 0)} hits, {disk.get('bytes_read', 0) / 1e6:.1f} MB read, "
            f"{disk.get('bytes_written', 0) / 1e6:.1f} MB written" + (f"; off: {disk['disabled']}" if disk.get("disabled") else ""))


def watch(mountpoint: str, interval: float = 1.0, count: int | None = None) -> int:
    """Refresh every `interval` s until Ctrl-C (exit 0), `count` refreshes, or the mount goes away (1)."""
    clear = CLEAR if sys.stdout.isatty() else ""
    before, taken, shown = None, None, 0
    try:
        while count is None or shown < count:
            if shown:
                time.sleep(interval)
            try:
                now, at = read_figures(mountpoint), time.monotonic()
            except OSError as exc:
                if not shown:  # named wrong, not gone while watched
                    raise UsageError(f"{mountpoint}: not a live shardfs mount ({exc.strerror})") from None
                print(f"shardfs: {mountpoint}: not a live shardfs mount ({exc.strerror})", file=sys.stderr)
                return 1
            sys.stdout.write(clear + view(mountpoint, now, before, at - taken if taken else 0.0) + "\n" + ("" if clear else "\n"))
            sys.stdout.flush()
            before, taken, shown = now, at, shown + 1
    except KeyboardInterrupt:
        pass
    return 0
