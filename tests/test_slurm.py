"""shardfs under a real Slurm: the README's job script, scancel, and a job's memory limit.

One private single-node cluster (tests/slurmcluster.py) serves the module. Jobs run as `nobody`,
as users' jobs do; what they leave on the node (mounts in the jobs' mount namespace, processes,
mountpoints) is checked after each.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time

import pytest

from benchlib.cli import REPO
from conftest import needs_fuse, wait_for
from benchlib import sample
import nobody
from slurmcluster import PYTHON, SlurmCluster, missing_parts

pytestmark = [needs_fuse, pytest.mark.skipif(missing_parts() is not None, reason=f"no Slurm here: {missing_parts()}")]
NOBODY = nobody.NOBODY
README_MARK = "<!-- slurm-job-script:"
SHARDS_LINE = "SHARDS=/lustre/proj/imagenet-shards"
# The README's script asks for 2 GPU nodes of 32 cores; this node has 2 cores and no GPU.
# Command-line options override #SBATCH lines, as on any cluster.
SMALL_NODE = ["--nodes=1", "--gpus-per-node=0", "--cpus-per-task=2", "--mem=3G", "--time=10"]

TRAIN_PY = '''
import argparse, json, os
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

parser = argparse.ArgumentParser()
parser.add_argument("--data")
args = parser.parse_args()
train = datasets.ImageFolder(args.data, transform=transforms.ToTensor())
images, labels = next(iter(DataLoader(train, batch_size=8, shuffle=True, num_workers=2)))
print(json.dumps({"uid": os.getuid(), "rank": os.environ["RANK"], "data": args.data, "images": len(train),
                  "classes": train.classes, "batch": list(images.shape), "labels": len(labels)}), flush=True)
'''

HOLD_PY = '''
import argparse, os, time
parser = argparse.ArgumentParser()
parser.add_argument("--data")
args = parser.parse_args()
print("ready", len(os.listdir(args.data)), flush=True)
time.sleep(600)
'''


def readme_job_script() -> str:
    """The job script exactly as the README prints it (the fenced block after the mark)."""
    with open(os.path.join(REPO, "README.md")) as f:
        text = f.read()
    after = text[text.index(README_MARK):]
    block = re.search(r"```sh\n(.*?)```", after, re.S)
    assert block, "no ```sh block after the README's slurm-job-script mark"
    return block.group(1)


@contextlib.contextmanager
def running_cluster(nodes: int = 1, classes: int = 3, per_class: int = 8, shards: int = 3, where: str | None = None):
    """A running Slurm of `nodes` plus a world-readable area (made in `where`): JPEGs (src/train),
    their shards, indexed as a data owner would, a home for nobody, job folders. Stopped and
    removed at the end, also when starting fails."""
    top = tempfile.mkdtemp(prefix="shardfs-slurm-", dir=where)
    os.chmod(top, 0o755)
    c = SlurmCluster(top, nodes)
    try:
        started = time.monotonic()
        c.start()
        c.start_seconds = time.monotonic() - started
        c.train = sample.make_imagefolder(os.path.join(top, "src"), classes=classes, per_class=per_class, side=48)
        sample.pack_tar_round_robin(os.path.join(top, "src"), os.path.join(top, "shards"), shards=shards)
        done = subprocess.run([PYTHON, "-m", "shardfs", "index", os.path.join(top, "shards")], capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": REPO})
        assert done.returncode == 0, done.stderr
        os.mkdir(os.path.join(top, "home"))
        os.chown(os.path.join(top, "home"), NOBODY, NOBODY)
        nobody.share(top)
        yield c
    finally:
        c.stop()
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    """A running single-node Slurm with the sample's shards."""
    with running_cluster() as c:
        yield c


def job_folder(cluster: SlurmCluster, name: str, files: dict[str, str]) -> str:
    folder = os.path.join(cluster.top, "jobs", name)
    os.makedirs(folder)
    os.chmod(os.path.dirname(folder), 0o755)
    for fname, text in files.items():
        with open(os.path.join(folder, fname), "w") as f:
            f.write(text)
    for path in [folder, *(os.path.join(folder, n) for n in files)]:
        os.chown(path, NOBODY, NOBODY)
    return folder


def sbatch(cluster: SlurmCluster, folder: str, *options: str, timeout: float = 600) -> tuple[str, int]:
    """Submit folder/job.sh as nobody from folder; (job id, sbatch's exit status)."""
    env = {"PATH": f"{os.path.dirname(PYTHON)}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "PYTHONPATH": REPO,
           "HOME": os.path.join(cluster.top, "home")}
    done = cluster.slurm("sbatch", f"--output={folder}/out.txt", *options, "job.sh", user="nobody", env=env,
                         cwd=folder, timeout=timeout)
    found = re.search(r"(\d+)", done.stdout)
    assert found, f"sbatch failed ({done.returncode}): {done.stdout}{done.stderr}\n{cluster.logs()}"
    return found.group(1), done.returncode


def output(folder: str) -> str:
    try:
        with open(os.path.join(folder, "out.txt")) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def leftovers(cluster: SlurmCluster, mountpoint: str | None = None) -> dict:
    """What a finished job may have left on its nodes: shardfs mounts, nobody's shardfs processes,
    the mountpoint (on any node: each node of several has its own /tmp)."""
    return {
        "mounts": cluster.job_mounts(),
        "processes": [p for p in cluster.processes_of(NOBODY) if "shardfs" in p and cluster.top in p],
        "mountpoint": bool(mountpoint) and any(os.path.lexists(cluster.node_path(n.name, mountpoint))
                                               for n in cluster.nodes),
    }


def wait_until_clean(cluster: SlurmCluster, mountpoint: str | None) -> dict:
    """Until nothing of a finished job is left (Slurm's step cleanup may finish a moment after the
    job leaves the queue); returns what is left, for the caller's assert."""
    left = {}

    def clean() -> bool:
        left.update(leftovers(cluster, mountpoint))
        return not any(left.values())

    wait_for(clean, lambda: f"left behind: {left}")
    return left


def wait_ready(cluster: SlurmCluster, folder: str, job: str, nodes: int = 1) -> None:
    """Until the job's output has a "ready" line from each of its `nodes` (failing if it ends first)."""
    def ready() -> bool:
        if output(folder).count("ready") >= nodes:
            return True
        assert cluster.job_state(job) in ("PENDING", "RUNNING", "CONFIGURING"), \
            f"job {job} ended before it got ready:\n{output(folder)}\n{cluster.logs()}"
        return False

    wait_for(ready, lambda: f"job {job} never got ready:\n{output(folder)}\n{cluster.logs()}")


def scancel_leaves_nothing(cluster: SlurmCluster, job: str, mountpoint: str) -> None:
    """scancel as the job's user; once Slurm no longer lists the job, nothing of it is left."""
    done = cluster.slurm("scancel", job, user="nobody")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: not cluster.job_state(job), lambda: f"job {job} still listed after scancel")
    assert wait_until_clean(cluster, mountpoint) == {"mounts": [], "processes": [], "mountpoint": False}


def test_readme_job_script_runs_as_printed(cluster):
    script = readme_job_script()
    assert script.count(SHARDS_LINE) == 1
    shards = os.path.join(cluster.top, "shards")
    folder = job_folder(cluster, "readme", {"job.sh": script.replace(SHARDS_LINE, f"SHARDS={shards}"),
                                            "train.py": TRAIN_PY})
    started = time.monotonic()
    job, code = sbatch(cluster, folder, "--wait", *SMALL_NODE)
    seconds = time.monotonic() - started
    out = output(folder)
    assert code == 0, f"job {job} failed:\n{out}\n{cluster.logs()}"
    [result] = json_lines(out)
    assert result["uid"] == NOBODY and result["rank"] == "0"
    assert result["data"] == f"/tmp/shardfs-{job}/train"
    assert result["images"] == 24 and result["classes"] == ["n00000000", "n00000001", "n00000002"]
    assert result["batch"] == [8, 3, 48, 48] and result["labels"] == 8
    assert wait_until_clean(cluster, f"/tmp/shardfs-{job}") == {"mounts": [], "processes": [], "mountpoint": False}
    print(f"cluster start {cluster.start_seconds:.1f} s; README job: sbatch --wait {seconds:.1f} s, "
          f"ran {cluster.job_seconds(job)} s")


def test_scancel_leaves_no_mount_daemon_or_mountpoint(cluster):
    script = readme_job_script()
    shards = os.path.join(cluster.top, "shards")
    folder = job_folder(cluster, "scancel", {"job.sh": script.replace(SHARDS_LINE, f"SHARDS={shards}"),
                                             "train.py": HOLD_PY})
    job, code = sbatch(cluster, folder, *SMALL_NODE)
    assert code == 0
    mountpoint = f"/tmp/shardfs-{job}"
    wait_ready(cluster, folder, job)
    assert "ready 3" in output(folder)  # the three class folders, through the mount
    assert mountpoint in cluster.job_mounts()
    assert leftovers(cluster)["processes"], "the job's daemon should be running now"
    scancel_leaves_nothing(cluster, job, mountpoint)


BIG_MEMBERS, MEMBER_BYTES, BIG_SHARDS = 24, 4 << 20, 4  # 384 MiB of random bytes: more than --mem
JOB_MEM = "300M"

CHECK_PY = '''
import hashlib, json, os, subprocess, sys
mnt = os.environ["SHARDFS_MOUNT"]
digests = {}
for dirpath, _dirs, files in os.walk(mnt):
    for name in files:
        h = hashlib.sha256()
        with open(os.path.join(dirpath, name), "rb", buffering=0) as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        digests[os.path.relpath(os.path.join(dirpath, name), mnt)] = h.hexdigest()
stats = subprocess.run([sys.executable, "-m", "shardfs", "stats", "--json", mnt], capture_output=True, text=True,
                       check=True).stdout
print(json.dumps({"digests": digests, "stats": json.loads(stats)}), flush=True)
'''

# After the step: the job's memory cgroup (where --mem is the limit) says whether anything was OOM-killed.
MEM_JOB = '''#!/bin/bash
shardfs run --log-file "$PWD/daemon.log" "$SHARDS" -- python3 check.py
status=$?
cg=/sys/fs/cgroup/memory$(grep -E '^[0-9]+:memory:' /proc/self/cgroup | cut -d: -f3)
echo "{\\"limit\\": $(cat "$cg/../memory.limit_in_bytes"), \\"oom_kill\\": $(awk '/oom_kill /{print $2}' "$cg/../memory.oom_control")}"
exit $status
'''


@pytest.fixture(scope="module")
def big_shards(cluster):
    """Shards of incompressible bytes, larger in total than the job's memory limit; their digests."""
    out = os.path.join(cluster.top, "big")
    os.mkdir(out)
    digests = {}
    for s in range(BIG_SHARDS):
        with tarfile.open(os.path.join(out, f"big-{s:02d}.tar"), "w", format=tarfile.PAX_FORMAT) as tar:
            for i in range(BIG_MEMBERS):
                data = os.urandom(MEMBER_BYTES)
                name = f"data/s{s}-{i:03d}.bin"
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
                digests[name] = hashlib.sha256(data).hexdigest()
    nobody.share(out)
    return out, digests


def test_small_mem_job_keeps_the_cache_under_the_limit(cluster, big_shards):
    shards, expected = big_shards
    folder = job_folder(cluster, "mem", {"job.sh": MEM_JOB, "check.py": CHECK_PY})
    started = time.monotonic()
    job, code = sbatch(cluster, folder, "--wait", f"--mem={JOB_MEM}", f"--export=ALL,SHARDS={shards}")
    seconds = time.monotonic() - started
    out = output(folder)
    assert code == 0, f"job {job} failed:\n{out}\n{cluster.logs()}"
    result, memory = json_lines(out)
    limit = 300 << 20
    assert memory == {"limit": limit, "oom_kill": 0}
    assert result["digests"] == expected  # every byte right, though the data is larger than the job's memory
    cache = result["stats"]["cache"]
    assert 0 < cache["budget_bytes"] < limit // 2  # half of what the cgroup leaves
    assert cache["used_bytes"] <= cache["budget_bytes"]
    assert cache["direct_reads"] > 0  # shards that did not fit were read member by member
    assert result["stats"]["rss_peak_bytes"] < limit
    with open(os.path.join(folder, "daemon.log")) as f:
        daemon_log = f.read()
    assert "left under the cgroup limit" in daemon_log and "memory.limit_in_bytes" in daemon_log
    assert wait_until_clean(cluster, None) == {"mounts": [], "processes": [], "mountpoint": False}
    assert os.listdir(os.path.join(cluster.top, "home", ".cache", "shardfs"))  # indexes and logs in the user's home
    print(f"--mem={JOB_MEM} job: sbatch --wait {seconds:.1f} s, ran {cluster.job_seconds(job)} s: budget {cache['budget_bytes'] >> 20} MiB, used {cache['used_bytes'] >> 20} MiB, "
          f"{cache['direct_reads']} direct reads, peak RSS {result['stats']['rss_peak_bytes'] >> 20} MiB")


# Two steps of one job, each a fresh mount: the first fills the disk tier in the job's local
# scratch ($TMPDIR here), the second finds the shards there and reads nothing from shared storage.
TIER_JOB = '''#!/bin/bash
set -e
shardfs run --log-file "$PWD/daemon1.log" "$SHARDS" -- python3 check.py
shardfs run --log-file "$PWD/daemon2.log" "$SHARDS" -- python3 check.py
stat -c '{"tier_mode": "%a", "tier_uid": %u}' "$TMPDIR/shardfs-cache-$(id -u)"
'''


def test_disk_tier_in_the_jobs_local_scratch(cluster):
    shards = os.path.join(cluster.top, "shards")
    scratch = os.path.join(cluster.top, "scratch")  # the node's own disk, as a job's local scratch is
    os.mkdir(scratch)
    os.chown(scratch, NOBODY, NOBODY)
    expected = {}
    for name in sorted(os.listdir(shards)):
        if name.endswith(".tar"):
            with tarfile.open(os.path.join(shards, name)) as tar:
                for member in tar.getmembers():
                    if member.isfile():
                        expected[member.name] = hashlib.sha256(tar.extractfile(member).read()).hexdigest()
    folder = job_folder(cluster, "tier", {"job.sh": TIER_JOB, "check.py": CHECK_PY})
    job, code = sbatch(cluster, folder, "--wait", f"--export=ALL,SHARDS={shards},TMPDIR={scratch}")
    out = output(folder)
    assert code == 0, f"job {job} failed:\n{out}\n{cluster.logs()}"
    first, second, tier = json_lines(out)
    assert first["digests"] == expected and second["digests"] == expected
    shard_bytes = sum(os.path.getsize(os.path.join(shards, n)) for n in os.listdir(shards) if n.endswith(".tar"))
    assert first["stats"]["disk"]["bytes_written"] > 0
    assert first["stats"]["cache"]["storage_bytes_read"] >= shard_bytes * 0.9  # the first step fetched them
    assert second["stats"]["cache"]["storage_bytes_read"] == 0  # the second found them in the tier
    assert second["stats"]["disk"]["hits"] > 0
    assert tier == {"tier_mode": "700", "tier_uid": NOBODY}  # private to the job's user
    assert wait_until_clean(cluster, None) == {"mounts": [], "processes": [], "mountpoint": False}
