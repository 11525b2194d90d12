"""Prometheus metrics of a mount, from the same figures `shardfs stats --json` shows.

`render(figures)` gives the text exposition format (`shardfs stats --format prometheus`).
`TextfileWriter` writes it for node_exporter's textfile collector every `period` seconds:
one `shardfs-<mount>.prom` file per mount, replaced atomically (the collector may read at any
moment), removed at unmount. prometheus_client does the format (escaping, HELP/TYPE lines)
and the temporary-name-then-rename write.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading

from prometheus_client import CollectorRegistry, generate_latest, write_to_textfile
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger("shardfs")

PERIOD_S = 15.0  # node_exporter is usually scraped every 15-60 s: fresher files gain nothing

# (name, kind, help, where in the figures): counters get "_total" from prometheus_client.
_SCALARS = [
    ("shardfs_uptime_seconds", "gauge", "Seconds since the daemon started", ("uptime_s",)),
    ("shardfs_served_bytes", "counter", "Bytes returned to readers by FUSE reads", ("bytes_served",)),
    ("shardfs_read_errors", "counter", "FUSE reads answered with an error", ("read_errors",)),
    ("shardfs_reads_in_c_from_ram", "counter", "FUSE reads answered by the compiled loop from the RAM cache",
     ("reads_in_c_from_ram",)),
    ("shardfs_reads_in_c_from_disk", "counter", "FUSE reads answered by the compiled loop from the disk tier",
     ("reads_in_c_from_disk",)),
    ("shardfs_disk_tier_page_cache_reads", "counter",
     "Disk-tier reads in C (answers and pushes) copied from the tier file's page cache, not the disk",
     ("disk_tier_page_cache_reads",)),
    ("shardfs_pushed_with_open", "counter",
     "Files looked up anew whose bytes went into the page cache with their open()'s isatty, saving a READ",
     ("pushed_with_open",)),
    ("shardfs_shards", "gauge", "Shards in the mounted dataset", ("shards",)),
    ("shardfs_shards_broken", "gauge", "Shards answering EIO (unreadable, changed on disk)", ("shards_broken",)),
    ("shardfs_shards_damaged", "gauge", "Shards served up to or around damage (truncated, a bad header)",
     ("shards_damaged",)),
    ("shardfs_files", "gauge", "Files in the mounted tree", ("files",)),
    ("shardfs_directories", "gauge", "Directories in the mounted tree", ("directories",)),
    ("shardfs_dataset_bytes", "gauge", "Total size of the files in the mounted tree", ("bytes",)),
    ("shardfs_problems", "gauge", "Problems found in the shards (left-out members, bad shards)", ("problems",)),
    ("shardfs_index_seconds", "gauge", "Seconds the last index load or build took", ("index_seconds",)),
    ("shardfs_ready_seconds", "gauge", "Seconds from the daemon's start of work until the mount answered",
     ("ready_seconds",)),
    ("shardfs_view_mapped", "gauge", "1 if the mount mapped the view an earlier mount saved, 0 if it merged the indexes",
     ("view_mapped",)),
    ("shardfs_rss_peak_bytes", "gauge", "Peak resident memory of the daemon", ("rss_peak_bytes",)),
    ("shardfs_cache_budget_bytes", "gauge", "RAM budget of the shard cache", ("cache", "budget_bytes")),
    ("shardfs_cache_budget_configured_bytes", "gauge", "RAM budget of the shard cache as configured at mount",
     ("memory", "budget_configured_bytes")),
    ("shardfs_memory_headroom_bytes", "gauge", "Memory left to the node or the daemon's cgroup (last check)",
     ("memory", "headroom_bytes")),
    ("shardfs_cache_shrinks", "counter", "Cache budget cuts under memory pressure", ("memory", "shrinks")),
    ("shardfs_cache_bytes", "gauge", "RAM the shard cache holds (or has reserved)", ("cache", "used_bytes")),
    ("shardfs_cache_evictions", "counter", "Shards evicted from the cache", ("cache", "shards_evicted")),
    ("shardfs_cache_hits", "counter", "Reads served from cached shards", ("cache", "hits")),
    ("shardfs_cache_misses", "counter", "Reads that had to go to storage", ("cache", "misses")),
    ("shardfs_cache_direct_reads", "counter", "Reads of shards that do not fit the budget (member only)",
     ("cache", "direct_reads")),
    ("shardfs_cache_admissions", "counter", "Shards admitted to the cache", ("cache", "admitted")),
    ("shardfs_cache_load_errors", "counter", "Shard loads that failed", ("cache", "load_errors")),
    ("shardfs_storage_read_bytes", "counter", "Bytes read from shared storage (shard files, objects); not from peers",
     ("cache", "storage_bytes_read")),
    ("shardfs_storage_build_read_bytes", "counter", "Bytes index builds read from shared storage (in the above)",
     ("cache", "build_bytes_read")),
    ("shardfs_cache_peer_read_bytes", "counter", "Bytes the cache got from peers instead of shared storage",
     ("cache", "peer_bytes_read")),
    ("shardfs_storage_read_seconds", "counter", "Seconds spent reading from storage",
     ("cache", "storage_read_seconds")),
    ("shardfs_disk_bound_bytes", "gauge", "Bound of the disk tier", ("disk", "bound_bytes")),
    ("shardfs_disk_bytes", "gauge", "Bytes the disk tier holds on local disk (all mounts sharing it)",
     ("disk", "held_bytes")),
    ("shardfs_disk_shards", "gauge", "Shards with a file in the disk tier", ("disk", "shards")),
    ("shardfs_disk_hits", "counter", "Chunk reads served from the disk tier", ("disk", "hits")),
    ("shardfs_disk_read_bytes", "counter", "Bytes read from the disk tier", ("disk", "bytes_read")),
    ("shardfs_disk_written_bytes", "counter", "Bytes written to the disk tier", ("disk", "bytes_written")),
    ("shardfs_disk_storage_read_bytes", "counter", "Bytes read from shared storage through the disk tier",
     ("disk", "storage_bytes_read")),
    ("shardfs_disk_peer_read_bytes", "counter", "Bytes the disk tier got from peers instead of shared storage",
     ("disk", "peer_bytes_read")),
    ("shardfs_disk_checksum_failures", "counter", "Disk tier chunks that failed their checksum (read again)",
     ("disk", "checksum_failures")),
    ("shardfs_disk_evictions", "counter", "Shards removed from the disk tier to make room",
     ("disk", "shards_evicted")),
    ("shardfs_remote_requests", "counter", "Requests to object stores and HTTP servers", ("remote", "requests")),
    ("shardfs_remote_retries", "counter", "Remote requests retried", ("remote", "retries")),
    ("shardfs_remote_failures", "counter", "Remote requests failed after all retries", ("remote", "failed")),
    ("shardfs_remote_read_bytes", "counter", "Bytes received from remote storage", ("remote", "bytes")),
    ("shardfs_peers_up", "gauge", "Peers answering, this node included", ("peers", "peers_up")),
    ("shardfs_peers_down", "gauge", "Peers marked down (refused, reset, too slow, bad replies)",
     ("peers", "peers_down")),
    ("shardfs_peer_fetched_bytes", "counter", "Shard bytes fetched from peers (checked)",
     ("peers", "bytes_from_peers")),
    ("shardfs_peer_previous_owner_bytes", "counter",
     "Shard bytes fetched from the peer that held a shard before it moved to this node (in the above)",
     ("peers", "bytes_from_previous_owners")),
    ("shardfs_peer_served_bytes", "counter", "Shard bytes served to peers", ("peers", "bytes_to_peers")),
    ("shardfs_peer_held_missed", "counter",
     "Requests for a shard this node held before it moved that it no longer had in RAM (the asker read storage)",
     ("peers", "held_missed")),
    ("shardfs_peer_served_indexes", "counter", "Shard indexes sent to peers", ("peers", "indexes_to_peers")),
    ("shardfs_indexes_from_peers", "gauge", "Shard indexes received from peers at the last index load",
     ("indexes_from_peers",)),
    ("shardfs_indexes_built", "gauge", "Shard indexes built by this node at the last index load", ("indexes_built",)),
    ("shardfs_peer_requests_refused", "counter", "Peer requests refused (no, wrong or late proof of the key)",
     ("peers", "requests_refused")),
    ("shardfs_peer_storage_read_bytes", "counter",
     "Bytes this node read from shared storage itself, with peers (the rest came from them)",
     ("peers", "storage_bytes_read")),
]
LABELS = ["mountpoint", "source"]


def _lookup(figures: dict, path: tuple[str, ...]):
    for key in path:
        if not isinstance(figures, dict) or key not in figures:
            return None
        figures = figures[key]
    return figures


class _Collector:
    def __init__(self, figures: dict):
        self.figures = figures

    def collect(self):
        f = self.figures
        labels = [f.get("mountpoint", ""), ",".join(f.get("sources", []))]
        for name, kind, text, path in _SCALARS:
            value = _lookup(f, path)
            if value is None:  # e.g. remote counters of a mount without remote shards
                continue
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, text, labels=LABELS)
            family.add_metric(labels, value)
            yield family
        cache = f.get("cache", {})
        shards = GaugeMetricFamily("shardfs_cache_shards", "Shards in the cache, by state", labels=[*LABELS, "state"])
        for state in ("cached", "loading"):
            if f"shards_{state}" in cache:
                shards.add_metric([*labels, state], cache[f"shards_{state}"])
        yield shards
        failures = CounterMetricFamily("shardfs_peer_failures", "Failed requests to a peer, by peer",
                                       labels=[*LABELS, "peer"])
        for peer, count in sorted(f.get("peers", {}).get("failures_by_peer", {}).items()):
            failures.add_metric([*labels, peer], count)
        yield failures
        ops = CounterMetricFamily("shardfs_fuse_requests", "FUSE requests answered, by operation",
                                  labels=[*LABELS, "op"])
        for op, count in sorted(f.get("fuse_ops", {}).items()):
            ops.add_metric([*labels, op], count)
        yield ops


def _registry(figures: dict) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(figures))
    return registry


def render(figures: dict) -> str:
    """The exposition text of one mount's figures (the dict `shardfs stats --json` prints)."""
    return generate_latest(_registry(figures)).decode()


def textfile_name(mountpoint: str) -> str:
    """One file per mount: readable, and unique by a hash of the full path."""
    real = os.path.abspath(mountpoint)
    tag = hashlib.sha256(real.encode()).hexdigest()[:8]
    return f"shardfs-{os.path.basename(real.rstrip('/')) or 'root'}-{tag}.prom"


class TextfileWriter:
    """Writes a mount's metrics into node_exporter's textfile directory every `period` seconds."""

    def __init__(self, directory: str, mountpoint: str, figures, period: float = PERIOD_S):
        self.path = os.path.join(directory, textfile_name(mountpoint))
        self.figures, self.period = figures, period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shardfs-metrics", daemon=True)

    def start(self) -> None:
        self.write()
        self._thread.start()

    def write(self) -> None:
        try:
            write_to_textfile(self.path, _registry(self.figures()))  # temporary name, then rename
        except OSError as exc:  # a full or missing directory must not take the mount down
            log.warning("cannot write metrics to %s: %s", self.path, exc.strerror)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.write()

    def stop(self) -> None:
        """At unmount: no file may claim a mount that is gone."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)
