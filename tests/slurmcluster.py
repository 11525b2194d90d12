"""A private single-node Slurm (munged, slurmctld, slurmd) for tests, started and stopped by us.

Everything lives in one temporary directory: the munge key and socket, slurm.conf and
cgroup.conf, state, spool, logs and pid files. Ports are free ones; `SLURM_CONF` points the
commands at the configuration. No system service is enabled or started; the daemons are
stopped by the pids in their pid files.

slurmd runs in a private mount namespace (as the unprivileged-user test does): there /root is a
world-readable tmpfs holding only the Python installation (the default interpreter lives under
/root, which is 0700), and /dev/fuse is a 0666 node of the same device. Jobs inherit that
namespace, so a job run as `nobody` can start Python and mount; the machine itself is unchanged.
Mounts made by jobs are visible in that namespace only: `job_mounts()` reads them there.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

from shardfs.service.mount import process_alive

PYTHON = os.path.realpath(sys.executable)
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scancel", "squeue", "sinfo")


def missing_parts() -> str | None:
    """Why a cluster cannot start here, or None."""
    if os.getuid() != 0:
        return "needs root (munged and slurmd run as root-started daemons)"
    for name in (*DAEMONS, "unshare", "runuser", "fusermount3"):
        if not shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"):
            return f"{name} is missing (apt-get install slurmctld slurmd slurm-client munge fuse3)"
    return None


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _memory_mb() -> int:
    with open("/proc/meminfo") as f:
        total_kb = int(f.readline().split()[1])
    return total_kb // 1024 - 1024  # leave the OS some


def _read_pid(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class SlurmCluster:
    def __init__(self, top: str):
        self.top = top  # world-readable: jobs of other users read their scripts and write output here
        self.dir = os.path.join(top, "slurm")
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.host = socket.gethostname().split(".")[0]
        self.env = {**os.environ, "SLURM_CONF": self.conf}
        self.pid_files = {name: os.path.join(self.dir, f"{name}.pid") for name in ("slurmctld", "slurmd")}
        self.pid_files["munged"] = os.path.join(self.dir, "munge", "munged.pid")  # munged writes as user munge
        self.procs: list[subprocess.Popen] = []  # our children, reaped at stop

    # ---- start ------------------------------------------------------------------

    def start(self, timeout: float = 60) -> None:
        for sub in ("munge", "state", "spool", "log", "ns"):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        os.chmod(self.top, 0o755)
        os.chmod(self.dir, 0o755)
        self._start_munge()
        self._write_config()
        self._daemon(["slurmctld", "-D", "-f", self.conf], "slurmctld")
        self._start_slurmd()
        self._wait_idle(timeout)

    def _start_munge(self) -> None:
        munge = pwd.getpwnam("munge")
        mdir = os.path.join(self.dir, "munge")
        key = os.path.join(mdir, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        for path in (mdir, key):
            os.chown(path, munge.pw_uid, munge.pw_gid)
        os.chmod(mdir, 0o755)  # the socket must be reachable by every user who submits jobs
        self.munge_socket = os.path.join(mdir, "munge.socket")
        self._daemon(["munged", "--foreground", f"--socket={self.munge_socket}", f"--key-file={key}",
                      f"--pid-file={self.pid_files['munged']}", f"--log-file={mdir}/munged.log",
                      f"--seed-file={mdir}/munged.seed"], "munged", user="munge")

    def _write_config(self) -> None:
        ctld_port, slurmd_port = _free_ports(2)
        d = self.dir
        self.memory_mb = _memory_mb()
        lines = {
            "ClusterName": "shardfs-test",
            "SlurmctldHost": self.host,
            "SlurmctldPort": ctld_port,
            "SlurmdPort": slurmd_port,
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "AuthType": "auth/munge",
            "CredType": "cred/munge",
            "AuthInfo": f"socket={self.munge_socket}",
            "StateSaveLocation": f"{d}/state",
            "SlurmdSpoolDir": f"{d}/spool",
            "SlurmctldPidFile": self.pid_files["slurmctld"],
            "SlurmdPidFile": self.pid_files["slurmd"],
            "SlurmctldLogFile": f"{d}/log/slurmctld.log",
            "SlurmdLogFile": f"{d}/log/slurmd.log",
            # Jobs in a memory cgroup (cgroup v1 here): --mem is a real limit, as on a cluster.
            "ProctrackType": "proctrack/cgroup",
            "TaskPlugin": "task/cgroup",
            "JobAcctGatherType": "jobacct_gather/none",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_Core_Memory",
            "SchedulerType": "sched/backfill",
            "ReturnToService": 2,
            "KillWait": 10,
            # sbatch --wait polls every 2 s doubling up to MinJobAge/2 (default 300: up to 32 s late);
            # 6 keeps its polls 4 s apart and finished jobs listed for a few seconds.
            "MinJobAge": 6,
            "MpiDefault": "none",
            "MailProg": "/bin/true",
        }
        with open(self.conf, "w") as f:
            f.writelines(f"{key}={value}\n" for key, value in lines.items())
            f.write(f"NodeName={self.host} CPUs={os.cpu_count()} RealMemory={self.memory_mb} State=UNKNOWN\n")
            f.write(f"PartitionName=test Nodes={self.host} Default=YES MaxTime=INFINITE State=UP\n")
        with open(os.path.join(d, "cgroup.conf"), "w") as f:
            f.write("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\nConstrainCores=no\n"
                    "ConstrainRAMSpace=yes\nConstrainSwapSpace=no\nAllowedRAMSpace=100\n")

    def _start_slurmd(self) -> None:
        """slurmd (and so every job) in a private mount namespace: readable Python, usable /dev/fuse."""
        ns = os.path.join(self.dir, "ns")
        setup = []
        if "/.pyenv/" in PYTHON and PYTHON.startswith("/root/"):
            pyenv = PYTHON.split("/versions/")[0]
            setup += [f"mkdir -p {ns}/pyenv", f"mount --bind {pyenv} {ns}/pyenv",
                      "mount -t tmpfs -o mode=755 tmpfs /root", f"mkdir -p {pyenv}",
                      f"mount --bind {ns}/pyenv {pyenv}"]
        setup += [f"{{ [ -e {ns}/fuse ] || mknod {ns}/fuse c 10 229; }}", f"chmod 666 {ns}/fuse",
                  f"mount --bind {ns}/fuse /dev/fuse", f"exec slurmd -D -f {self.conf}"]
        self._daemon(["unshare", "-m", "--propagation", "private", "sh", "-ec", " && ".join(setup)], "slurmd")

    def _daemon(self, cmd: list[str], name: str, user: str | None = None, timeout: float = 30) -> None:
        """Start a daemon in the foreground (so that we reap it) and wait for its pid file."""
        log = open(os.path.join(self.dir, "log", f"{name}.out"), "wb")
        proc = subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                user=user, group=user, extra_groups=[] if user else None, start_new_session=True)
        log.close()
        self.procs.append(proc)
        deadline = time.monotonic() + timeout
        while _read_pid(self.pid_files[name]) != proc.pid:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start (exit status {proc.poll()})\n{self.logs()}")
            time.sleep(0.05)

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            done = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=self.env)
            state = done.stdout.strip()
            if state == "idle":
                return
            time.sleep(0.5)
        raise RuntimeError(f"the node did not become idle (sinfo: {state!r})\n{self.logs()}")

    # ---- use ------------------------------------------------------------------

    def slurm(self, *cmd: str, user: str | None = None, env: dict | None = None, cwd: str | None = None,
              timeout: float = 300) -> subprocess.CompletedProcess:
        """A Slurm command (sbatch, scancel, squeue, ...), as `user` if given, with `env` added to
        the environment (after runuser, which sets HOME, USER, SHELL and LOGNAME for the user)."""
        env = {"SLURM_CONF": self.conf, **(env or {})}
        full = [*(["runuser", "-u", user, "--"] if user else []), "env", *(f"{k}={v}" for k, v in env.items()), *cmd]
        return subprocess.run(full, capture_output=True, text=True, env={**self.env, **env}, cwd=cwd, timeout=timeout)

    def job_state(self, job_id: str) -> str:
        done = self.slurm("squeue", "-h", "-j", job_id, "-o", "%T")
        return done.stdout.strip()

    def job_seconds(self, job_id: str) -> int | None:
        """How long a finished job ran by Slurm's clock (whole seconds), while Slurm still lists it."""
        done = self.slurm("scontrol", "show", "job", "-o", job_id)
        times = dict(re.findall(r"(StartTime|EndTime)=(\S+)", done.stdout))
        try:
            start, end = (datetime.datetime.fromisoformat(times[k]) for k in ("StartTime", "EndTime"))
        except (KeyError, ValueError):
            return None
        return int((end - start).total_seconds())

    def job_mounts(self) -> list[str]:
        """Mountpoints of FUSE mounts of our files (source under our directory) in the jobs' mount
        namespace (slurmd's); the namespace also holds copies of the machine's mounts of its start."""
        pid = _read_pid(self.pid_files["slurmd"])
        found = []
        with open(f"/proc/{pid}/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fstype, source = right.split()[:2]
                if fstype.startswith("fuse") and source.startswith(self.top):
                    found.append(left.split()[4])
        return found

    def processes_of(self, uid: int) -> list[str]:
        """Command lines of every process of `uid` on the node."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.stat(f"/proc/{entry}").st_uid != uid:
                    continue
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    found.append(f.read().replace(b"\0", b" ").decode(errors="replace").strip())
            except OSError:
                continue
        return [c for c in found if c]

    def logs(self) -> str:
        out = []
        for name in ("log/slurmctld.log", "log/slurmd.log", "munge/munged.log", "log/munged.out", "log/slurmctld.out",
                     "log/slurmd.out"):
            with contextlib.suppress(OSError), open(os.path.join(self.dir, name)) as f:
                out.append(f"--- {name} ---\n" + "".join(f.readlines()[-30:]))
        return "\n".join(out)

    # ---- stop -------------------------------------------------------------------

    def stop(self) -> None:
        for name in ("slurmd", "slurmctld", "munged"):
            pid = _read_pid(self.pid_files[name])
            if pid is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while process_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if process_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for proc in self.procs:  # the same processes; a daemon that died before writing its pid file too
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self._remove_cgroups()

    def _remove_cgroups(self) -> None:
        """slurmd leaves its (empty) per-node cgroup folders: remove them, deepest first."""
        for hierarchy in ("memory", "freezer", "cpuset", "devices"):
            top = f"/sys/fs/cgroup/{hierarchy}/slurm_{self.host}"
            for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -w[0].count("/")):
                with contextlib.suppress(OSError):
                    os.rmdir(dirpath)
