"""The peers of a batch job: in a Slurm job with more than one node, every node of the job.

The port is derived from the job id, PORT_BASE + id % PORT_SPAN (10000 to 19999: below Linux's
range of ephemeral ports, 32768 and up, and apart from the README job script's torchrun port,
20000 + id % 20000), so every node of a job computes the same list and two jobs sharing a node
differ unless their ids differ by a multiple of 10000 (then the second one's mount fails, saying
the port is in use: give --peers, or --peers off).
"""

from __future__ import annotations

import logging
import os
import subprocess

from shardfs.errors import UsageError
from shardfs.storage.peers.addresses import pick_self

log = logging.getLogger("shardfs")

PORT_BASE, PORT_SPAN = 10000, 10000


def job_port(job_id: str) -> int:
    return PORT_BASE + int(job_id) % PORT_SPAN


def slurm_peers(env: dict | None = None) -> tuple[list[str] | None, str | None]:
    """(peers, this node's entry) of the Slurm job we run in; (None, None) outside one, or with one node."""
    env = os.environ if env is None else env
    nodelist, job = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST"), env.get("SLURM_JOB_ID")
    if not nodelist or not job or not job.isdigit():
        return None, None
    try:  # the compressed list (node[01-04,07]) is expanded by Slurm itself
        done = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                              timeout=30, check=True, env=dict(env))
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("cannot expand SLURM_JOB_NODELIST %s (%s): no peers; each node reads shared storage itself",
                    nodelist, exc)
        return None, None
    hosts = done.stdout.split()
    if len(hosts) < 2:
        return None, None
    port = job_port(job)
    me = env.get("SLURMD_NODENAME")
    peers = [f"{host}:{port}" for host in hosts]
    try:  # peers are on by default here: a node that cannot tell which one it is goes without
        return peers, pick_self(peers, f"{me}:{port}" if me in hosts else None)
    except UsageError as exc:
        log.warning("no peers for this job: %s", exc)
        return None, None
