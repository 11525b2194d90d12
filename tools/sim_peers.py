#!/usr/bin/env python3
"""Simulate shard owners among many peers with shardfs's own placement (storage/peers/owner.py).

    .venv/bin/python tools/sim_peers.py --nodes 1000 --shards 12810 [--lose 0.01,0.1] [--ram 1,1.5,2] [--json]
    .venv/bin/python tools/sim_peers.py --table          # 16, 256, 1,000, 10,000 nodes x 1,281 and 12,810 shards

For N nodes (named like cluster addresses) and S shards of equal size (``--spread`` gives them
sizes varying by that fraction), it prints:

* ``max_owner_load_over_mean``: the largest owner's bytes over the mean (1.0 is perfect balance);
  ``hashing_alone_max_over_mean`` is the same for the first ring candidate without the bound;
* ``moved_over_lost``: bytes whose owner changes when a fraction F of the nodes leave, over the
  bytes those nodes owned (1.0: only theirs move), for the F given with ``--lose`` (the largest
  of them where several are given); ``moved_over_lost_by_fraction``: each F's;
* ``placement_seconds``: the longest one placement took here (every node makes one when peers
  go down or come back, on a thread of its own);
* ``storage_per_epoch`` (per RAM budget in ``--ram``, each node's, as a multiple of the mean
  share dataset/N): shared storage reads of an epoch after the first, over the dataset, when each
  owner keeps whole owned shards while they fit and reads the rest again every epoch (the first
  epoch reads the dataset once). With a bounded placement a budget of 1.25x the mean share
  keeps everything; hashing alone needs the largest owner's share.

Nothing is mounted: the placement is computed as every node computes it, for all nodes at once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shardfs.storage.peers import owner  # noqa: E402

SHARD_BYTES = 110 * 1000 * 1000  # about an ImageNet tar shard of 1,000 images


def peers_of(count: int) -> list[str]:
    """Addresses as a cluster's nodes have them (10.x.y.z:7077)."""
    return [f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}:7077" for i in range(1, count + 1)]


def shards_of(count: int, spread: float, seed: int) -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = np.full(count, SHARD_BYTES, dtype=np.int64)
    if spread:
        sizes = (sizes * rng.uniform(1 - spread, 1 + spread, count)).astype(np.int64)
    digests = [owner.digest(owner.identity(f"/datasets/imagenet/train-{i:06d}.tar", int(size), 1_700_000_000 * 10**9 + i))
               for i, size in enumerate(sizes)]
    return digests, sizes


def loads_of(owners: np.ndarray, sizes: np.ndarray, nodes: int) -> np.ndarray:
    return np.bincount(owners, weights=sizes.astype(np.float64), minlength=nodes)


def storage_per_epoch(owners: np.ndarray, sizes: np.ndarray, nodes: int, budget: float) -> float:
    """Bytes read again each epoch over the dataset: per owner, what its budget cannot keep."""
    order = np.lexsort((sizes, owners))  # per owner, the smaller shards are kept first
    by_owner, by_size = owners[order], sizes[order].astype(np.float64)
    starts = np.searchsorted(by_owner, np.arange(nodes))
    running = np.cumsum(by_size)
    before = np.where(starts > 0, running[np.maximum(starts - 1, 0)], 0.0)[by_owner]  # each owner's bytes before its own
    kept = (running - before) <= budget
    return float(by_size[~kept].sum() / by_size.sum())


def simulate(nodes: int, shards: int, lose: list[float], ram: list[float], spread: float = 0.0,
             seed: int = 1) -> dict:
    began = time.monotonic()
    peers = peers_of(nodes)
    digests, sizes = shards_of(shards, spread, seed)
    timed = time.perf_counter()
    placed = owner.Placement(digests, sizes, peers)
    placing = [time.perf_counter() - timed]
    owners = np.array(placed.owner, dtype=np.int64)
    mean = sizes.sum() / nodes
    loads = loads_of(owners, sizes, nodes)
    alone = np.array(placed.ring.who, dtype=np.int64)[np.array(placed.start, dtype=np.int64)]  # first candidate
    result = {
        "nodes": nodes, "shards": shards, "spread": spread,
        "max_owner_load_over_mean": round(float(loads.max() / mean), 3),
        "hashing_alone_max_over_mean": round(float(loads_of(alone, sizes, nodes).max() / mean), 3),
        "nodes_owning_nothing": int((loads == 0).sum()),
        "moved_over_lost_by_fraction": {},
        "storage_per_epoch": {str(r): round(storage_per_epoch(owners, sizes, nodes, r * mean), 4) for r in ram},
        "storage_per_epoch_hashing_alone": {str(r): round(storage_per_epoch(alone, sizes, nodes, r * mean), 4)
                                            for r in ram},
    }
    rng = np.random.default_rng(seed)
    for fraction in lose:
        gone = frozenset(rng.choice(placed.ring.peers, max(1, round(fraction * nodes)), replace=False).tolist())
        timed = time.perf_counter()
        after = np.array(owner.Placement(digests, sizes, peers, down=gone, ring=placed.ring).owner, dtype=np.int64)
        placing.append(time.perf_counter() - timed)
        lost = np.isin(owners, [placed.ring.peers.index(p) for p in gone])
        moved = owners != after
        result["moved_over_lost_by_fraction"][str(fraction)] = round(float(sizes[moved].sum() / sizes[lost].sum()), 3)
    result["moved_over_lost"] = max(result["moved_over_lost_by_fraction"].values(), default=None)
    # (what a node's placement builder takes when peers go down or come back: net.py)
    result["placement_seconds"] = round(max(placing), 3)
    result["seconds"] = round(time.monotonic() - began, 2)
    return result


def table(rows: list[dict], ram: list[float]) -> str:
    head = ("| nodes | shards | max owner / mean | hashing alone | owning nothing | moved / lost, 1% | 10% | "
            + " | ".join(f"storage per epoch, RAM {r}x share" for r in ram) + " |")
    lines = [head, "|" + "---|" * (7 + len(ram))]
    for r in rows:
        lines.append(f"| {r['nodes']:,} | {r['shards']:,} | {r['max_owner_load_over_mean']:.2f} | "
                     f"{r['hashing_alone_max_over_mean']:.2f} | {r['nodes_owning_nothing']:,} | "
                     f"{r['moved_over_lost_by_fraction']['0.01']:.2f} | {r['moved_over_lost_by_fraction']['0.1']:.2f} | "
                     + " | ".join(f"{r['storage_per_epoch'][str(x)]:.3f} (alone {r['storage_per_epoch_hashing_alone'][str(x)]:.3f})"
                                  for x in ram) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--shards", type=int, default=12810)
    ap.add_argument("--lose", default="0.01,0.1", help="fractions of the nodes that leave (comma-separated)")
    ap.add_argument("--ram", default="1.0,1.25,1.5", help="each node's RAM budget as multiples of dataset/nodes")
    ap.add_argument("--spread", type=float, default=0.0, help="shard sizes vary by up to this fraction")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--table", action="store_true", help="the documentation's table (16..10,000 nodes)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    lose = [float(x) for x in args.lose.split(",") if x]
    ram = [float(x) for x in args.ram.split(",") if x]
    if args.table:
        lose = sorted(set(lose) | {0.01, 0.1})
        rows = [simulate(n, s, lose, ram, args.spread, args.seed)
                for n in (16, 256, 1000, 10000) for s in (1281, 12810)]
        print(json.dumps(rows, indent=1) if args.json else table(rows, ram))
        return 0
    result = simulate(args.nodes, args.shards, lose, ram, args.spread, args.seed)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
