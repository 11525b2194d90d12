"""The README's job script with --nodes=2 under a real two-node Slurm on this machine.

slurmctld and two slurmd, each node in its own network and UTS namespace with its own host name,
address, /etc/hosts and /tmp (tests/slurmcluster.py). Jobs run as `nobody` with a home shared by
both nodes, as users' jobs do. `shardfs run` on each node finds the job's other node in
SLURM_JOB_NODELIST and the two daemons serve each other the shards they own, so shared storage is
read about once for the job, not once per node.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import time

import pytest

from benchlib import sample
from benchlib.cli import REPO
from conftest import needs_fuse
from slurmcluster import PYTHON, SlurmCluster, missing_parts
from test_slurm import (NOBODY, SHARDS_LINE, job_folder, output, readme_job_script, running_cluster,
                        sbatch, scancel_leaves_nothing, wait_ready, wait_until_clean)

pytestmark = [needs_fuse, pytest.mark.skipif(missing_parts() is not None, reason=f"no Slurm here: {missing_parts()}")]
# The README's script asks for 2 GPU nodes of 32 cores; each node here has 2 cores and no GPU.
TWO_NODES = ["--nodes=2", "--gpus-per-node=0", "--cpus-per-task=2", "--mem=3G", "--time=10"]
CLASSES, PER_CLASS, SHARDS = 3, 16, 4

# A real (small) distributed training: torchrun's rendezvous across the two nodes, gloo, DDP, each
# node reading its DistributedSampler part of the ImageFolder for two epochs. Then each node hashes
# the bytes of its part, waits for the other (no peer fetch happens after the barrier) and prints
# its daemon's figures.
TRAIN_PY = '''
import argparse, hashlib, json, os, socket, subprocess, sys
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import datasets, transforms

parser = argparse.ArgumentParser()
parser.add_argument("--data")
args = parser.parse_args()
dist.init_process_group("gloo")
train = datasets.ImageFolder(args.data, transform=transforms.ToTensor())
sampler = DistributedSampler(train, shuffle=True, seed=0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3 * 48 * 48, len(train.classes)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
seen = 0
for epoch in range(2):
    sampler.set_epoch(epoch)
    for images, labels in DataLoader(train, batch_size=4, sampler=sampler, num_workers=2):
        loss = torch.nn.functional.cross_entropy(model(images.flatten(1)), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seen += len(labels)
digests = {}
for i in sampler:
    path = train.samples[i][0]
    with open(path, "rb") as f:
        digests[os.path.relpath(path, args.data)] = hashlib.sha256(f.read()).hexdigest()
dist.barrier()
stats = subprocess.run([sys.executable, "-m", "shardfs", "stats", "--json", os.path.dirname(args.data)],
                       capture_output=True, text=True, check=True).stdout
result = {"host": socket.gethostname(), "rank": dist.get_rank(), "world": dist.get_world_size(),
          "data": args.data, "seen": seen, "loss": loss.item(), "digests": digests, "stats": json.loads(stats)}
with open(f"result-{dist.get_rank()}.json.part", "w") as f:  # a file each: two tasks' long lines interleave in out.txt
    json.dump(result, f)
os.rename(f"result-{dist.get_rank()}.json.part", f"result-{dist.get_rank()}.json")
dist.destroy_process_group()
'''

# Cheaper than training (no torch in the job): each node reads its half of the files, picked at
# random as a DistributedSampler does (so it needs every shard), checks nothing itself, says so and
# holds its mount until scancel; the test reads each node's figures meanwhile.
READ_PY = '''
import argparse, hashlib, json, os, random, socket, time
parser = argparse.ArgumentParser()
parser.add_argument("--data")
args = parser.parse_args()
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
files = sorted(os.path.relpath(os.path.join(top, n), args.data) for top, _, names in os.walk(args.data) for n in names)
random.Random(0).shuffle(files)
digests = {}
for rel in files[rank::world]:
    with open(os.path.join(args.data, rel), "rb") as f:
        digests[rel] = hashlib.sha256(f.read()).hexdigest()
with open(f"result-{rank}.json.part", "w") as f:  # a file each: two tasks' long lines interleave in out.txt
    json.dump({"host": socket.gethostname(), "rank": rank, "world": world, "digests": digests}, f)
os.rename(f"result-{rank}.json.part", f"result-{rank}.json")
print("ready", socket.gethostname(), len(os.listdir(args.data)), flush=True)
time.sleep(600)
'''


@pytest.fixture(scope="module")
def cluster():
    """A running two-node Slurm with the sample's shards, a home for nobody shared by the nodes;
    the sha256 of every source file (`cluster.digests`)."""
    reason = missing_parts(nodes=2)
    if reason:
        pytest.skip(f"no two-node Slurm here: {reason}")
    with running_cluster(2, CLASSES, PER_CLASS, SHARDS, where="/var/tmp") as c:  # each node has its own /tmp
        c.digests = {}
        for rel in sample.files_under(c.train):
            with open(os.path.join(c.train, rel), "rb") as f:
                c.digests[rel] = hashlib.sha256(f.read()).hexdigest()
        yield c


def readme_job(cluster: SlurmCluster, name: str, train_py: str) -> str:
    """A job folder with the README's script; the nodes' disk tiers emptied first (`shardfs run`
    keeps one in the node's /tmp, which outlives a job, so that a job's figures are its own)."""
    for n in cluster.nodes:
        shutil.rmtree(cluster.node_path(n.name, f"/tmp/shardfs-cache-{NOBODY}"), ignore_errors=True)
    script = readme_job_script()
    shards = os.path.join(cluster.top, "shards")
    return job_folder(cluster, name, {"job.sh": script.replace(SHARDS_LINE, f"SHARDS={shards}"), "train.py": train_py})


def rank_results(folder: str) -> list[dict]:
    """What each task of the job wrote (result-RANK.json in the job's folder), by rank."""
    results = []
    for name in sorted(glob.glob(os.path.join(folder, "result-*.json"))):
        with open(name) as f:
            results.append(json.load(f))
    return sorted(results, key=lambda r: r["rank"])


def shard_bytes(cluster: SlurmCluster) -> int:
    shards = os.path.join(cluster.top, "shards")
    return sum(os.path.getsize(os.path.join(shards, n)) for n in os.listdir(shards) if n.endswith(".tar"))


def test_readme_job_script_trains_on_two_nodes_reading_storage_once(cluster):
    folder = readme_job(cluster, "readme2", TRAIN_PY)
    started = time.monotonic()
    job, code = sbatch(cluster, folder, "--wait", *TWO_NODES)
    seconds = time.monotonic() - started
    out = output(folder)
    assert code == 0, f"job {job} failed:\n{out}\n{cluster.logs()}"
    results = rank_results(folder)
    assert [(r["host"], r["rank"], r["world"]) for r in results] == [(n.name, i, 2) for i, n in enumerate(cluster.nodes)]
    files = CLASSES * PER_CLASS
    for r in results:
        assert r["data"] == f"/tmp/shardfs-{job}/train"
        assert r["seen"] == 2 * files // 2  # two epochs of its half
    check_halves(cluster, results)
    storage, peer_bytes = storage_once(cluster, [r["stats"] for r in results])
    assert wait_until_clean(cluster, f"/tmp/shardfs-{job}") == {"mounts": [], "processes": [], "mountpoint": False}
    print(f"two-node cluster start {cluster.start_seconds:.1f} s; README job on 2 nodes: sbatch --wait {seconds:.1f} s, "
          f"ran {cluster.job_seconds(job)} s; storage {storage} of {shard_bytes(cluster)} shard bytes, "
          f"from peers {peer_bytes}")


def check_halves(cluster: SlurmCluster, results: list[dict]) -> None:
    """Each node read its half of the files, every byte right; together they read all."""
    assert [(r["host"], r["rank"], r["world"]) for r in results] == [(n.name, i, 2) for i, n in enumerate(cluster.nodes)]
    for r in results:
        assert len(r["digests"]) == CLASSES * PER_CLASS // 2
        assert all(cluster.digests[path] == digest for path, digest in r["digests"].items())
    assert set(results[0]["digests"]) | set(results[1]["digests"]) == set(cluster.digests)


def storage_once(cluster: SlurmCluster, stats: list[dict]) -> tuple[list[int], list[int]]:
    """The two daemons found each other through Slurm and read shared storage once between them:
    each node got every shard (its random half of the files lies in all of them), from storage
    if it owns the shard, else from its peer. Alone, each would read every shard: 2x."""
    peers = [st["peers"] for st in stats]
    assert [(p["peers_up"], p["peers_down"]) for p in peers] == [(2, 0), (2, 0)]
    storage = [p["storage_bytes_read"] for p in peers]  # bytes this node read from shared storage itself
    peer_bytes = [p["bytes_from_peers"] for p in peers]
    total = shard_bytes(cluster)
    assert 0.9 * total <= sum(storage) <= 1.1 * total, (storage, total)
    assert all(0.9 * total <= s + b for s, b in zip(storage, peer_bytes)), (storage, peer_bytes, total)
    return storage, peer_bytes


def test_two_nodes_read_storage_once_and_scancel_leaves_nothing(cluster):
    folder = readme_job(cluster, "scancel2", READ_PY)
    job, code = sbatch(cluster, folder, *TWO_NODES)
    assert code == 0
    mountpoint = f"/tmp/shardfs-{job}"
    wait_ready(cluster, folder, job, nodes=2)
    ready = sorted(line for line in output(folder).splitlines() if line.startswith("ready"))
    assert ready == [f"ready {n.name} {CLASSES}" for n in cluster.nodes]  # the class folders, through each mount
    check_halves(cluster, rank_results(folder))
    stats = []
    for n in cluster.nodes:
        assert cluster.job_mounts(n.name) == [mountpoint]  # each node's own mount, on its own /tmp
        done = cluster.on_node(n.name, "runuser", "-u", "nobody", "--", "env", f"PYTHONPATH={REPO}", PYTHON, "-m",
                               "shardfs", "stats", "--json", mountpoint)
        assert done.returncode == 0, done.stderr
        stats.append(json.loads(done.stdout))
    storage_once(cluster, stats)
    scancel_leaves_nothing(cluster, job, mountpoint)
