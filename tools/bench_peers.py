#!/usr/bin/env python3
"""By-hand benchmark of issue 22 (NOT a test): the nodes of a job serve shards to each other, so
shared storage is read about once for the job, not once per node.

One machine plays --nodes (4) nodes: a `shardfs mount` per node, each with its own mountpoint,
RAM budget, disk tier and peer address on its own loopback address (127.0.0.2, 127.0.0.3, ...;
one port). The shards lie on tools/bench_tier.py's shared storage (benchlib.capped: an ext4 image
on a loop device whose reads a blkio cgroup caps, by default to 200 IOPS and 150 MB/s); this
process joins the cgroup once the dataset is made, so the daemons it starts are capped.

Each epoch every node reads, at the same time as the others, its part of the dataset as torch's
distributed training does: ImageFolder of its own mount, DistributedSampler(num_replicas=N,
rank=i, shuffle=True, seed=S) with set_epoch(e), every file read with the built-in
open(path, 'rb') and checked against the source's sha256. Two capacities:

  a  each node's tiers could hold the whole dataset (RAM budget a third of it, disk tier 2x it)
  b  each node's RAM budget is a third of the dataset, no disk tier (the job holds 4/3 of it)
(a third: --ram-share)

each with peers (--peers, --peer-self) and without (today's behaviour), and a run of (b) with
peers (--kill-in) in which one node's daemon is killed with SIGKILL a quarter into epoch 2 (it
reads no more; the other nodes must read every file right).

Each round begins with the index run (unless --no-index-run): the shards' indexes removed, one
node alone mounts them (it builds every index; then once more with its indexes made: what a
daemon's start and mount cost alone), then the N nodes mount them at the same moment with peers
(each shard's owner builds its index, the others receive it): the indexes built over all nodes,
and when the last node is ready, against the node alone. Here the N "nodes" share one capped
device, so their index phase cannot beat one read of the dataset through that cap; with
--cap-per-node the N nodes mount once more, each daemon in a cgroup of its own at the same
limits (each node its own link to the storage, as on a cluster). Both figures are reported.
"Ready" is the whole `shardfs mount` (its interpreter's start and imports included) and, beside it,
the time from its daemon's start of work until the mount answered (`ready_seconds` in the daemon's
figures): N interpreters starting at once on this machine's cores are a cost that nodes with CPUs
of their own do not share. Both are judged.

--shards N makes the dataset in N shards (--shard-size from --dataset-size); with few shards
per node, --ram-share 0.4 gives each node room for what it owns (its share, 1/N) and one more.

All "nodes" share one page cache of the storage's files, which would hide a node's storage reads
of bytes another node read just before: every epoch starts after drop_caches, and during epochs
the pages of the shard files are dropped (POSIX_FADV_DONTNEED) every --drop-every seconds.
Bytes from shared storage are the cgroup's blkio.throttle.io_service_bytes (the kernel's count),
next to what the daemons say (`peers.storage_bytes_read`). Figures are medians [min-max] of
--rounds; ratios are taken within a round.

Run as root (loop device, cgroup, drop_caches):

    .venv/bin/python tools/bench_peers.py --dataset-size 128M --rounds 1   # smoke, a few minutes
    .venv/bin/python tools/bench_peers.py --rounds 2                       # 256M dataset, ~40 min here
    .venv/bin/python tools/bench_peers.py --dataset-size 220M --shards 8 --ram-share 0.4 --rounds 1   # ~12 min
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import sys
import threading
import time

import bench_dataset
from benchlib import capped, sample
from benchlib.caches import drop_caches
from benchlib.capped import ReadCap, shard_files
from benchlib.machine import Others, proc_status
from benchlib.mounts import Mounts
from benchlib.rounds import until_interrupted
from benchlib.tables import cell, median

from shardfs.storage.memory import parse_size

KILL_AT = 0.25  # of epoch 2's files read by all nodes together


# ---------------------------------------------------------------------------------------------
# the dataset's digests; keeping one node's storage reads from serving another


def source_digests(shared: str) -> dict[str, str]:
    """sha256 of every source JPEG by its path under train/ (read before the cap is on)."""
    return sample.digests(os.path.join(shared, "src", "train"))


class PageDropper:
    """Drops the shard files' pages from the page cache every `every` seconds, so that one
    "node" never reads from memory what another node's storage read just brought in."""

    def __init__(self, paths: list[str], every: float):
        self.paths, self.every = paths, every
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            for path in self.paths:
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


# ---------------------------------------------------------------------------------------------
# one node's reader: its DistributedSampler part of its own mount, each file checked


def _node_reader(i: int, root: str, nodes: int, seed: int, epoch: int, digests: dict, barrier, results,
                 progress) -> None:
    from torch.utils.data import DistributedSampler
    from torchvision.datasets import ImageFolder

    try:
        ds = ImageFolder(root)
        sampler = DistributedSampler(ds, num_replicas=nodes, rank=i, shuffle=True, seed=seed)
        sampler.set_epoch(epoch)
        order = [ds.samples[k][0] for k in sampler]
    except OSError as exc:  # a node whose daemon is gone cannot even list
        barrier.wait()
        results.put((i, 0, 0, 1, f"{root}: {exc}", 0.0, 0))
        return
    files = nbytes = wrong = errors = 0
    first_error = None
    barrier.wait()
    t0 = time.monotonic()
    for path in order:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            errors += 1
            first_error = first_error or f"{path}: {exc}"
            break  # this node's daemon is gone: it reads no more
        files += 1
        nbytes += len(data)
        if hashlib.sha256(data).hexdigest() != digests[os.path.relpath(path, root)]:
            wrong += 1
            first_error = first_error or f"{path}: wrong bytes"
        with progress.get_lock():
            progress.value += 1
    results.put((i, files, wrong, errors, first_error, time.monotonic() - t0, nbytes))


def read_epoch(ctx, mounts: dict, epoch: int, seed: int, kill: int | None = None) -> dict:
    """Every node of `mounts` ({index: Mounted}) reads its part at once; with `kill`, that node's
    daemon gets SIGKILL once KILL_AT of the epoch's files are read."""
    drop_caches()
    n = ctx.args.nodes
    pids = {i: m.pid for i, m in mounts.items()}
    others, cpu0 = Others(list(pids.values())), {i: proc_status(p).get("cpu_s", 0.0) for i, p in pids.items()}
    fork = mp.get_context("fork")
    barrier, results, progress = fork.Barrier(len(mounts) + 1), fork.Queue(), fork.Value("l", 0)
    procs = [fork.Process(target=_node_reader, args=(i, os.path.join(m.mnt, "train"), n, seed, epoch, ctx.digests,
                                                      barrier, results, progress))
             for i, m in mounts.items()]
    for p in procs:
        p.start()
    killed_at = None
    try:
        barrier.wait(timeout=600)
        if kill is not None:
            goal = KILL_AT * len(ctx.digests)
            while progress.value < goal and any(p.is_alive() for p in procs):
                time.sleep(0.01)
            os.kill(mounts[kill].pid, signal.SIGKILL)
            killed_at = progress.value
        got = {g[0]: g for g in (results.get() for _ in procs)}
    finally:
        for p in procs:
            if p.is_alive() and sys.exc_info()[0] is not None:
                p.terminate()
            p.join()
    nodes = {i: {"files": g[1], "wrong": g[2], "errors": g[3], "first_error": g[4], "seconds": g[5],
                 "fps": g[1] / g[5] if g[5] else 0.0} for i, g in sorted(got.items())}
    live = [v for i, v in nodes.items() if i != kill]
    cpu = sum(proc_status(p).get("cpu_s", 0.0) - cpu0[i] for i, p in pids.items() if i != kill)
    return {"nodes": nodes, "fps": sum(v["files"] for v in live) / max(v["seconds"] for v in live),
            "killed_at": killed_at, "daemon_cpu_s": cpu, "others_cpu": others.done()["background_cpu"]}


# ---------------------------------------------------------------------------------------------
# one setup: N mounts, --epochs epochs, unmounted


def node_options(ctx, capacity: str, i: int, peers: bool) -> list[str]:
    a = ctx.args
    opts = ["--cache-size", f"{ctx.ram >> 20}M"]
    if capacity == "a":
        opts += ["--disk-cache", os.path.join(ctx.work, f"disk-{i}"), "--disk-cache-size",
                 f"{2 * ctx.shard_bytes >> 20}M"]
    if peers:
        addrs = [f"127.0.0.{2 + k}:{ctx.port}" for k in range(a.nodes)]
        opts += ["--peers", ",".join(addrs), "--peer-self", addrs[i]]
    return opts


def daemon_figures(mounts: dict) -> dict:
    """Per live daemon: (storage bytes as it counts them, bytes it fetched from peers, of those
    from a shard's former owner, requests to peers that failed, direct reads: members read alone)."""
    out = {}
    for i, m in mounts.items():
        st = m.stats() or {}
        peers, cache = st.get("peers") or {}, st.get("cache") or {}
        out[i] = (peers.get("storage_bytes_read", cache.get("storage_bytes_read", 0)),
                  peers.get("bytes_from_peers", 0), peers.get("bytes_from_previous_owners", 0),
                  peers.get("failures", 0), cache.get("direct_reads", 0))
    return out


def grown(before: dict, after: dict, k: int) -> int:
    """What the daemons alive at the end added to figure `k` (a killed daemon's counts are lost)."""
    return sum(after[i][k] - before[i][k] for i in after)


def one_setup(ctx, name: str, capacity: str, peers: bool, r: int, kill: int | None = None) -> dict:
    a = ctx.args
    for i in range(a.nodes):
        shutil.rmtree(os.path.join(ctx.work, f"disk-{i}"), ignore_errors=True)  # every setup starts empty
    drop_caches()
    shards = os.path.join(ctx.shared, "shards")
    mounts = {}
    for i in range(a.nodes):
        mounts[i] = ctx.mounts.shardfs([shards], os.path.join(ctx.work, "mnt", f"node{i}"),
                                       *node_options(ctx, capacity, i, peers),
                                       log=os.path.join(ctx.work, f"{name}-node{i}.log"))
    in_cgroup = all(ctx.cap.holds(m.pid) for m in mounts.values())
    out = {"epochs": [], "in_cgroup": in_cgroup}
    start = ctx.cap.read_bytes()
    with PageDropper(ctx.shards, a.drop_every):
        for e in range(a.epochs):
            before, figs = ctx.cap.read_bytes(), daemon_figures(mounts)
            ep = read_epoch(ctx, mounts, e, a.seed + r, kill if e == 1 else None)
            if kill is not None and e == 1:
                ctx.mounts.unmount(mounts.pop(kill))  # its mount is dead (ENOTCONN): gone from now on
            after = daemon_figures(mounts)
            ep["storage"] = ctx.cap.read_bytes() - before
            ep["daemon_storage"], ep["from_peers"] = grown(figs, after, 0), grown(figs, after, 1)
            ep["from_former_owners"], ep["peer_failures"], ep["direct_reads"] = (grown(figs, after, k) for k in (2, 3, 4))
            out["epochs"].append(ep)
            print(f"    epoch {e + 1}: {ep['fps']:.0f} files/s (" + " ".join(
                f"n{i} {v['fps']:.0f}" for i, v in ep["nodes"].items()) + f"), storage {ep['storage'] / 1e6:.0f} MB, "
                f"peers {ep['from_peers'] / 1e6:.0f} MB (former owners {ep['from_former_owners'] / 1e6:.0f} MB, "
                f"{ep['peer_failures']} failed requests), {ep['direct_reads']} direct reads"
                + (f"; node {kill} killed after {ep['killed_at']} files"
                                                           if ep.get("killed_at") is not None else ""), flush=True)
    out["storage"] = ctx.cap.read_bytes() - start
    out["wrong"] = sum(v["wrong"] for ep in out["epochs"] for i, v in ep["nodes"].items())
    out["errors_others"] = sum(v["errors"] for ep in out["epochs"] for i, v in ep["nodes"].items() if i != kill)
    out["first_error"] = next((v["first_error"] for ep in out["epochs"] for i, v in ep["nodes"].items()
                               if v["first_error"] and i != kill), None)
    for m in list(mounts.values()):
        ctx.mounts.unmount(m)
    return out


SETUPS = [("a-peers", "a", True), ("a-alone", "a", False), ("b-peers", "b", True), ("b-alone", "b", False)]


def remove_indexes(ctx) -> None:
    """Every index of the shards: beside them, in the index dirs of the index run."""
    for shard in ctx.shards:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(shard + ".shardfs-idx")
    for i in range(-1, ctx.args.nodes):
        shutil.rmtree(os.path.join(ctx.work, f"idx-{i}"), ignore_errors=True)


def mount_timed(ctx, name: str, i: int, options: list[str], t0: float, out: dict, cap: ReadCap | None = None) -> None:
    """Mount node i (in the cgroup ``cap`` of its own, if given); out[i] = (seconds from t0 until
    it is ready, the mount)."""
    m = ctx.mounts.shardfs([os.path.join(ctx.shared, "shards")], os.path.join(ctx.work, "mnt", f"{name}{i}"),
                           "--index-dir", os.path.join(ctx.work, f"idx-{i}"), *options,
                           log=os.path.join(ctx.work, f"{name}-node{i}.log"), preexec_fn=cap and cap.enter)
    out[i] = (time.monotonic() - t0, m)


def together(ctx, name: str, own_caps: bool) -> dict:
    """All nodes mount the unindexed shards at once with peers: when each is ready, what it built
    and received. ``own_caps``: each node's daemon in a blkio cgroup of its own at the same limits
    (each node its own link to the storage, as on a cluster), else all in the one shared cap."""
    a = ctx.args
    remove_indexes(ctx)
    drop_caches()
    caps = {i: ReadCap(ctx.dev, a.iops, a.bps, f"bench-peers-node{i}", join=False) for i in range(a.nodes)} \
        if own_caps else {}
    got: dict = {}
    try:
        t0 = time.monotonic()
        threads = [threading.Thread(target=mount_timed, args=(ctx, name, i, node_options(ctx, "b", i, True), t0, got,
                                                               caps.get(i))) for i in range(a.nodes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if len(got) < a.nodes:
            raise RuntimeError(f"a node of the index run did not mount (see its {name}-node*.log)")
        stats = {i: m.stats() or {} for i, (_s, m) in got.items()}
        out = {"ready_s": {i: s for i, (s, _m) in got.items()},
               "built": {i: st.get("indexes_built", 0) for i, st in stats.items()},
               "from_peers": {i: st.get("indexes_from_peers", 0) for i, st in stats.items()},
               "index_s": {i: st.get("index_seconds", 0.0) for i, st in stats.items()},
               "work_s": {i: st.get("ready_seconds") for i, st in stats.items()},
               "storage": sum(cap.read_bytes() for cap in caps.values()) if caps else None}
    finally:
        for _s, m in got.values():
            ctx.mounts.unmount(m)
        for cap in caps.values():
            cap.close()
    out["last_ready_s"] = max(out["ready_s"].values())
    out["last_index_s"] = max(out["index_s"].values())
    out["last_work_s"] = None if None in out["work_s"].values() else max(out["work_s"].values())
    print(f"  index run, {'each node its own cap' if own_caps else 'one cap shared by all nodes'}: {a.nodes} nodes "
          f"at once: last ready {out['last_ready_s']:.1f} s (from its daemon's start {_seconds(out['last_work_s'])}; "
          f"indexes {out['last_index_s']:.1f} s), built "
          + "+".join(str(v) for v in out["built"].values())
          + ", from peers " + "+".join(str(v) for v in out["from_peers"].values()), flush=True)
    return out


def _seconds(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f} s"


def index_run(ctx) -> dict:
    """One node alone on unindexed shards (and again with its indexes: what starting a daemon and
    mounting cost without any index work), then all nodes at once with peers: (seconds until
    ready, indexes built) of each. The owners write their indexes beside the shards, as before the run."""
    a = ctx.args
    remove_indexes(ctx)
    drop_caches()
    alone: dict = {}
    mount_timed(ctx, "index-alone", -1, ["--cache-size", "64M"], time.monotonic(), alone)
    seconds, m = alone[-1]
    st = m.stats() or {}
    out = {"alone_s": seconds, "alone_built": st.get("indexes_built", 0), "alone_index_s": st.get("index_seconds", 0.0),
           "alone_work_s": st.get("ready_seconds")}
    ctx.mounts.unmount(m)
    drop_caches()
    mount_timed(ctx, "index-alone", -1, ["--cache-size", "64M"], time.monotonic(), alone)
    out["alone_indexed_s"], m = alone[-1]
    ctx.mounts.unmount(m)
    print(f"  index run: alone ready {out['alone_s']:.1f} s (from its daemon's start {_seconds(out['alone_work_s'])}; "
          f"indexes {out['alone_index_s']:.1f} s, {out['alone_built']} "
          f"built); with its indexes made: ready {out['alone_indexed_s']:.1f} s", flush=True)
    out.update(together(ctx, "index-peers", False))
    if a.cap_per_node:
        out["own_caps"] = together(ctx, "index-own-caps", True)
    for i in range(-1, a.nodes):
        shutil.rmtree(os.path.join(ctx.work, f"idx-{i}"), ignore_errors=True)
    return out


def one_round(ctx, r: int) -> dict:
    out = {}
    if ctx.args.index_run:
        out["index"] = index_run(ctx)
    for name, capacity, peers in SETUPS:
        if name not in ctx.args.setups:
            continue
        print(f"  {name}: capacity ({capacity}), {'with' if peers else 'without'} peers", flush=True)
        out[name] = one_setup(ctx, name, capacity, peers, r)
    for capacity in ctx.args.kill_in:
        print(f"  kill-{capacity}: capacity ({capacity}) with peers, node {ctx.args.nodes - 1} SIGKILLed in epoch 2",
              flush=True)
        out[f"kill-{capacity}"] = one_setup(ctx, f"kill-{capacity}", capacity, True, r, kill=ctx.args.nodes - 1)
    return out


# ---------------------------------------------------------------------------------------------
# report


def report(ctx, rounds: list[dict]) -> None:
    """The figures of every round (medians and spreads), then each target and its verdict."""
    names = [name for name in [name for name, _cap, _peers in SETUPS] + [f"kill-{c}" for c in ctx.args.kill_in]
             if all(name in r for r in rounds)]  # (--setups: some left out)
    _report_rates(ctx, rounds, names)
    _report_setups(ctx, rounds, names)
    print(f"daemons in the capped cgroup: {all(r[k]['in_cgroup'] for r in rounds for k in r if k != 'index')}")
    if ctx.args.index_run:
        _report_index_run(ctx, rounds)
    _report_targets(ctx, rounds, names)


def _fps(rounds: list[dict], names: list[str], name: str, e: int) -> list[float]:
    """Epoch ``e``'s files/s of setup ``name`` in each round (none if it was left out)."""
    return [r[name]["epochs"][e]["fps"] for r in rounds] if name in names else []


def _ratios(rounds: list[dict], names: list[str], e: int, capacity: str) -> list[float]:
    """With peers over without, round by round."""
    return [p / q for p, q in zip(_fps(rounds, names, f"{capacity}-peers", e),
                                  _fps(rounds, names, f"{capacity}-alone", e))]


def _report_rates(ctx, rounds: list[dict], names: list[str]) -> None:
    a = ctx.args
    print()
    print(f"files/s per epoch, all {a.nodes} nodes together (median [min-max] of {len(rounds)} rounds); "
          f"ratio = with peers / without, same round")
    print(f"{'epoch':<8}" + "".join(f"{h:>20}" for h in ("(a) peers", "(a) alone", "(a) ratio", "(b) peers", "(b) alone",
                                                           "(b) ratio", *(f"kill in ({c})" for c in a.kill_in))))
    for e in range(a.epochs):
        cells = []
        for capacity in ("a", "b"):
            cells += [cell(_fps(rounds, names, f"{capacity}-{k}", e), "{:.0f}") for k in ("peers", "alone")]
            cells.append(cell(_ratios(rounds, names, e, capacity), "{:.2f}"))
        cells += [cell(_fps(rounds, names, f"kill-{c}", e), "{:.0f}") for c in a.kill_in]
        print(f"{e + 1:<8}" + "".join(f"{c:>20}" for c in cells))


def _report_setups(ctx, rounds: list[dict], names: list[str]) -> None:
    a, n, total = ctx.args, ctx.args.nodes, ctx.shard_bytes
    x = lambda b: b / total  # noqa: E731

    def per_epoch(name: str, fn, fmt: str) -> str:
        return " / ".join(cell([fn(r[name]["epochs"][e]) for r in rounds], fmt) for e in range(a.epochs))

    print()
    print("per setup, epoch 1 / 2 / 3 (medians [min-max])")
    for name in names:
        print(f"  {name}")
        for i in range(n):
            vals = [median([r[name]["epochs"][e]["nodes"][i]["fps"] for r in rounds if i in r[name]["epochs"][e]["nodes"]])
                    for e in range(a.epochs)]
            print(f"    node {i} files/s            " + " / ".join("-" if v is None else f"{v:.0f}" for v in vals))
        print(f"    shared storage, x shards  total {cell([x(r[name]['storage']) for r in rounds], '{:.2f}')}: "
              + per_epoch(name, lambda ep: x(ep["storage"]), "{:.2f}") + " (blkio); daemons' own count "
              + per_epoch(name, lambda ep: x(ep["daemon_storage"]), "{:.2f}"))
        print("    between peers, GB         " + per_epoch(name, lambda ep: ep["from_peers"] / 1e9, "{:.3f}"))
        print("    daemons' CPU s            " + per_epoch(name, lambda ep: ep["daemon_cpu_s"], "{:.1f}")
              + "; others' share of the CPU % " + per_epoch(name, lambda ep: 100 * (ep["others_cpu"] or 0), "{:.0f}"))


def _report_index_run(ctx, rounds: list[dict]) -> None:
    a = ctx.args
    print()
    print(f"index run ({len(ctx.shards)} unindexed shards): one node alone ready in "
          f"{cell([r['index']['alone_s'] for r in rounds], '{:.1f}')} s (from its daemon's start "
          f"{cell([r['index']['alone_work_s'] for r in rounds], '{:.2f}')} s; its index phase "
          f"{cell([r['index']['alone_index_s'] for r in rounds], '{:.2f}')} s), {a.nodes} nodes at once with peers: "
          f"last ready {cell([r['index']['last_ready_s'] for r in rounds], '{:.1f}')} s (from its daemon's start "
          f"{cell([r['index']['last_work_s'] for r in rounds], '{:.2f}')} s; longest index phase "
          f"{cell([r['index']['last_index_s'] for r in rounds], '{:.2f}')} s); indexes built "
          f"{cell([sum(r['index']['built'].values()) for r in rounds], '{:.0f}')}, received from peers "
          f"{cell([sum(r['index']['from_peers'].values()) for r in rounds], '{:.0f}')}; one node alone with "
          f"its indexes made (daemon start and mount, no index work) ready in "
          f"{cell([r['index']['alone_indexed_s'] for r in rounds], '{:.1f}')} s")
    if a.cap_per_node:
        print(f"  the same with each node's daemon in a cap of its own (its own link to the storage, as on a "
              f"cluster): last ready {cell([r['index']['own_caps']['last_ready_s'] for r in rounds], '{:.1f}')} s "
              f"(from its daemon's start {cell([r['index']['own_caps']['last_work_s'] for r in rounds], '{:.2f}')} s; "
              f"longest index phase {cell([r['index']['own_caps']['last_index_s'] for r in rounds], '{:.2f}')} s), "
              f"indexes built {cell([sum(r['index']['own_caps']['built'].values()) for r in rounds], '{:.0f}')}")


def _judge(label: str, values: list[float], rule: str, limit: float, fmt: str = "{:.2f}") -> None:
    """One target's line: the measured median [min-max], the rule, PASS or FAIL."""
    med = median(values)
    ok = med is not None and (med <= limit if rule == "<=" else med >= limit)
    verdict = "no figure (setup not run)" if med is None else "PASS" if ok else "FAIL"
    print(f"{label:<66}{cell(values, fmt):>22} {rule} {limit:<6}  {verdict}")


def _report_targets(ctx, rounds: list[dict], names: list[str]) -> None:
    a, n, total = ctx.args, ctx.args.nodes, ctx.shard_bytes
    x = lambda b: b / total  # noqa: E731
    print()
    print(f"{'target':<66}{'measured':>22}")
    print("-" * 104)
    for capacity in ("a", "b"):
        _judge(f"({capacity}) storage over {a.epochs} epochs, x dataset, with peers",
               [x(r[f"{capacity}-peers"]["storage"]) for r in rounds if f"{capacity}-peers" in r], "<=", 1.1)
    for e in range(1, a.epochs):
        _judge(f"(b) epoch {e + 1} files/s, with peers / without", _ratios(rounds, names, e, "b"), ">=", 3.0)
    if a.index_run:
        _judge_index_run(ctx, rounds)
    for c in a.kill_in:
        name = f"kill-{c}"
        if name not in names:
            continue
        _judge(f"kill in ({c}): wrong bytes or errors read by the other nodes",
               [r[name]["wrong"] + r[name]["errors_others"] for r in rounds], "<=", 0, "{:.0f}")
        _judge(f"kill in ({c}): storage over {a.epochs} epochs, x dataset", [x(r[name]["storage"]) for r in rounds],
               "<=", round(1 + 1 / n + 0.1, 3))
        first = next((r[name]["first_error"] for r in rounds if r[name]["first_error"]), None)
        if first:
            print(f"kill in ({c}), first problem: {first}")
    print(f"(without peers, for scale: storage (a) {cell([x(r['a-alone']['storage']) for r in rounds if 'a-alone' in r], '{:.2f}')}x, "
          f"(b) {cell([x(r['b-alone']['storage']) for r in rounds if 'b-alone' in r], '{:.2f}')}x the dataset)")


def _judge_index_run(ctx, rounds: list[dict]) -> None:
    n = ctx.args.nodes
    _judge(f"index run: indexes built over all {n} nodes, x shards",
           [sum(r["index"]["built"].values()) / len(ctx.shards) for r in rounds], "<=", 1.25)
    variants = [("one cap shared", lambda r: r["index"])]
    if ctx.args.cap_per_node:
        variants.append(("a cap per node", lambda r: r["index"]["own_caps"]))
    for label, of in variants:
        _judge(f"index run ({label}): last of {n} nodes ready, x one node alone",
               [of(r)["last_ready_s"] / r["index"]["alone_s"] for r in rounds], "<=", 0.5)
        # The same from each daemon's start of work (its interpreter started, its modules imported:
        # `ready_seconds` in its figures): N interpreters starting at once on this machine's cores are
        # a cost that nodes with CPUs of their own do not share.
        _judge(f"index run ({label}): the same, from each daemon's start",
               [of(r)["last_work_s"] / r["index"]["alone_work_s"] for r in rounds
                if of(r)["last_work_s"] is not None and r["index"]["alone_work_s"]], "<=", 0.5)
        _judge(f"index run ({label}): longest index phase of {n} nodes, x alone",
               [of(r)["last_index_s"] / r["index"]["alone_index_s"] for r in rounds], "<=", 0.5)


# ---------------------------------------------------------------------------------------------


class Ctx:
    pass


def free_port(hosts: list[str]) -> int:
    """A port free on every one of `hosts` (loopback addresses)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = s.getsockname()[1]
        with contextlib.ExitStack() as stack:
            try:
                for h in hosts:
                    s = stack.enter_context(socket.socket())
                    s.bind((h, port))
                return port
            except OSError:
                continue
    raise RuntimeError(f"no port free on all of {hosts}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="/var/tmp/shardfs-bench-peers",
                        help="on the local disk: the image, disk tiers, mountpoints, logs")
    parser.add_argument("--dataset-size", type=parse_size, default=parse_size("256M"), help="JPEG bytes to make")
    parser.add_argument("--shard-size", type=parse_size, default=parse_size("8M"),
                        help="shards of about this size (or --shards)")
    parser.add_argument("--shards", type=int, help="make the dataset in this many shards (sets --shard-size)")
    parser.add_argument("--ram-share", type=float, default=1 / 3, help="each node's RAM budget, x the dataset")
    parser.add_argument("--no-index-run", dest="index_run", action="store_false",
                        help="leave out the run of nodes mounting unindexed shards at once")
    parser.add_argument("--classes", type=int, default=50)
    parser.add_argument("--jpegs-from", help="copy the JPEGs of another run's dataset instead of making them")
    parser.add_argument("--side", default="auto", help="JPEG side in pixels (auto: ~110 KB per JPEG)")
    parser.add_argument("--nodes", type=int, default=4, help="daemons on 127.0.0.2, 127.0.0.3, ...")
    parser.add_argument("--iops", type=int, default=200, help="read IOPS cap of the shared storage")
    parser.add_argument("--bps", type=parse_size, default=150_000_000, help="read bytes/s cap")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0, help="DistributedSampler's seed (round r uses seed + r)")
    parser.add_argument("--kill-in", type=lambda v: [c for c in v.split(",") if c], default=["b"],
                        help="capacities of the runs with a peer killed, e.g. a,b (default b: in (a) every node "
                        "holds the whole dataset after epoch 1, so a lost peer costs nothing; empty: none)")
    parser.add_argument("--cap-per-node", action="store_true",
                        help="the index run once more with each node's daemon in a blkio cgroup of its own at the "
                        "same limits (each node its own link to the storage, as on a cluster; the shared-cap "
                        "figure stays)")
    parser.add_argument("--setups", type=lambda v: [c for c in v.split(",") if c],
                        default=[name for name, _cap, _peers in SETUPS],
                        help="which of " + ",".join(name for name, _cap, _peers in SETUPS) + " to run (default all; "
                        "the targets need their pairs)")
    parser.add_argument("--drop-every", type=float, default=0.2,
                        help="seconds between FADV_DONTNEED of the shard files during epochs")
    parser.add_argument("--rebuild", action="store_true", help="remake the dataset even if marker.json matches")
    parser.add_argument("--json", help="also write every round's figures here")
    args = parser.parse_args()
    if args.shards:  # midway between N and N - 1 shards' sizes, in whole MiB (what pack takes)
        middle = args.dataset_size * (1 / args.shards + 1 / max(1, args.shards - 1)) / 2
        args.shard_size = max(1, round(middle / 2**20)) << 20
    ctx = Ctx()
    ctx.args, ctx.work = args, capped.begin(parser, args)
    with contextlib.ExitStack() as stack:
        ctx.shared, ctx.dev, ctx.marker = bench_dataset.on_capped_storage(args, ctx.work, stack)
        ctx.shards = shard_files(ctx.shared)
        ctx.shard_bytes = sum(os.path.getsize(s) for s in ctx.shards)
        ctx.ram = int(ctx.shard_bytes * args.ram_share)
        for i in range(args.nodes):
            stack.callback(shutil.rmtree, os.path.join(ctx.work, f"disk-{i}"), True)
        ctx.digests = source_digests(ctx.shared)
        ctx.port = free_port([f"127.0.0.{2 + i}" for i in range(args.nodes)])
        print(f"dataset: {len(ctx.digests)} JPEGs, {ctx.marker['image_bytes'] / 1e9:.3f} GB; {len(ctx.shards)} tar "
              f"shards {ctx.shard_bytes / 1e9:.3f} GB; shared storage {ctx.dev} capped at {args.iops} IOPS, "
              f"{args.bps / 1e6:.0f} MB/s; {args.nodes} nodes on 127.0.0.2-{1 + args.nodes}:{ctx.port}; RAM budget "
              f"{ctx.ram >> 20} MiB per node, disk tier (a) {2 * ctx.shard_bytes >> 20} MiB", flush=True)
        ctx.cap = None
        stack.callback(lambda: ctx.cap and ctx.cap.close())
        ctx.mounts = stack.enter_context(Mounts())  # FUSE mounts undone first, then the cgroup, then the image
        ctx.mounts.unmount(ctx.mounts.shardfs([os.path.join(ctx.shared, "shards")], os.path.join(ctx.work, "mnt", "index"),
                                              log=os.path.join(ctx.work, "index.log")))  # indexes, uncapped
        ctx.cap = ReadCap(ctx.dev, args.iops, args.bps, "bench-peers")
        rounds = until_interrupted(args.rounds, lambda r: one_round(ctx, r))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "marker": ctx.marker, "rounds": rounds}, f, indent=1, default=str)
        if rounds:
            report(ctx, rounds)
    return 0 if rounds else 1


if __name__ == "__main__":
    sys.exit(main())
