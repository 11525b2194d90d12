"""A private Slurm (munged, slurmctld, one slurmd per node) for tests, started and stopped by us.

Everything lives in one temporary directory: the munge key and socket, slurm.conf and
cgroup.conf, state, spool, logs and pid files. `SLURM_CONF` points the commands at the
configuration. No system service is enabled or started; the daemons are stopped by the pids in
their pid files.

One node (the default) is this machine itself: its host name, free ports on its network.
With `nodes=2` (or more) each node is a machine of its own as far as Slurm and the jobs can tell
(`NodeNetwork`): slurmctld and every slurmd run in network namespaces of their own, joined by a
bridge in the controller's namespace, each with its own host name (a UTS namespace), address,
/etc/hosts naming every node (as a cluster's DNS would) and /tmp. Namespace names, node names and
the subnet carry a tag made from our pid, so parallel runs do not meet. The commands (`slurm()`)
run in the controller's namespace.

slurmd runs in a private mount namespace (as the unprivileged-user test does): there /root is a
world-readable tmpfs holding only the Python installation (the default interpreter lives under
/root, which is 0700), and /dev/fuse is a 0666 node of the same device. Jobs inherit that
namespace, so a job run as `nobody` can start Python and mount; the machine itself is unchanged.
Mounts made by jobs are visible in that namespace only: `job_mounts()` reads them there.
"""

from __future__ import annotations

import contextlib
import dataclasses
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

from benchlib.cli import REPO
from conftest import DEADLINE, wait_for
from shardfs.service.mount import process_alive

PYTHON = sys.executable  # the suite's interpreter (a venv's bin/python), as in nobody.py
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scancel", "squeue", "sinfo")
SLURMD_PORT, SLURMCTLD_PORT = 6818, 6817  # in namespaces of our own: nothing else listens there


def missing_parts(nodes: int = 1) -> str | None:
    """Why a cluster of `nodes` cannot start here, or None. For more than one node this makes
    (and removes) a namespace with a bridge and a veth pair: the kernel parts the nodes need."""
    if os.getuid() != 0:
        return "needs root (munged and slurmd run as root-started daemons)"
    for name in (*DAEMONS, "unshare", "runuser", "fusermount3", *(("ip", "nsenter") if nodes > 1 else ())):
        if not shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"):
            return f"{name} is missing (apt-get install slurmctld slurmd slurm-client munge fuse3 iproute2)"
    return cgroup_v1_missing() or (NodeNetwork.unsupported() if nodes > 1 else None)


# cgroup.conf below says CgroupPlugin=cgroup/v1: task/cgroup makes --mem a real limit in the memory
# controller, proctrack/cgroup tracks a job's processes in the freezer; Slurm looks for each under
# /sys/fs/cgroup/<controller> (CgroupMountpoint).
V1_CONTROLLERS = ("memory", "freezer")


def cgroup_v1_missing(mounts: str = "/proc/self/mounts") -> str | None:
    """Why the cgroup v1 hierarchies the cluster's cgroup.conf needs are not here, or None."""
    mounted = {}
    with open(mounts) as f:
        for line in f:
            _dev, where, kind, options = line.split()[:4]
            if kind == "cgroup":
                mounted.update({opt: where for opt in options.split(",") if opt in V1_CONTROLLERS})
    missing = [c for c in V1_CONTROLLERS if mounted.get(c) != f"/sys/fs/cgroup/{c}"]
    if not missing:
        return None
    return (f"the test cluster runs Slurm's cgroup/v1 plugin, which needs the cgroup v1 {' and '.join(missing)} "
            f"controller at /sys/fs/cgroup/<name> (v1 mounts here: {mounted or 'none'}; a cgroup v2 node "
            "needs CgroupPlugin=cgroup/v2, which this helper does not write)")


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


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


@dataclasses.dataclass
class Node:
    name: str
    addr: str | None = None  # where the controller reaches it
    netns: str | None = None


class NodeNetwork:
    """Network namespaces for a controller and `n` nodes: a bridge with the subnet's first address
    in the controller's namespace, each node joined to it by a veth pair (its end `eth0`, address
    .11, .12, ...). The namespaces (and with them the bridge and veths) are ours: deleted at
    `remove()`, with any process still in them."""

    def __init__(self, n: int, tag: int):
        subnet = f"10.77.{tag % 250 + 1}"  # exists only inside these namespaces
        self.ctl = Node("ctl", f"{subnet}.1", f"shardfs-{tag}-ctl")
        self.nodes = [Node(f"n{tag}{chr(ord('a') + i)}", f"{subnet}.{11 + i}", f"shardfs-{tag}-{i}")
                      for i in range(n)]
        self.bridge, self.tag = f"sfbr{tag}"[:15], tag

    @staticmethod
    def unsupported() -> str | None:
        """Why namespaces joined by a bridge and veth pairs cannot be made here, or None."""
        net = NodeNetwork(1, os.getpid() % 100_000 + 100_000)
        try:
            net.create()
        except (RuntimeError, OSError) as exc:
            return f"no network namespaces with a bridge and veth pairs here: {exc}"
        finally:
            net.remove()
        return None

    def create(self) -> None:
        ctl = self.ctl.netns
        for node in (self.ctl, *self.nodes):
            _ip("netns", "add", node.netns)
            _ip("-n", node.netns, "link", "set", "lo", "up")
        _ip("-n", ctl, "link", "add", self.bridge, "type", "bridge")
        _ip("-n", ctl, "addr", "add", f"{self.ctl.addr}/24", "dev", self.bridge)
        _ip("-n", ctl, "link", "set", self.bridge, "up")
        for i, node in enumerate(self.nodes):
            veth = f"v{self.tag}{i}"[:15]
            _ip("-n", ctl, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", node.netns)
            _ip("-n", ctl, "link", "set", veth, "master", self.bridge)
            _ip("-n", ctl, "link", "set", veth, "up")
            _ip("-n", node.netns, "addr", "add", f"{node.addr}/24", "dev", "eth0")
            _ip("-n", node.netns, "link", "set", "eth0", "up")

    def hosts(self) -> str:
        """An /etc/hosts for every node: the names resolve as a cluster's DNS makes them."""
        return "127.0.0.1 localhost\n" + "".join(f"{n.addr} {n.name}\n" for n in (self.ctl, *self.nodes))

    def remove(self) -> None:
        """Delete our namespaces; processes still in them (a job's stragglers) are killed first."""
        for node in (self.ctl, *self.nodes):
            if not os.path.exists(f"/run/netns/{node.netns}"):
                continue
            for pid in _ip("netns", "pids", node.netns, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            done = _ip("netns", "del", node.netns, check=False)
            if done.returncode != 0:
                print(f"WARNING: ip netns del {node.netns}: {done.stderr.strip()}", file=sys.stderr)


class SlurmCluster:
    def __init__(self, top: str, nodes: int = 1):
        self.top = top  # world-readable: jobs of other users read their scripts and write output here
        self.dir = os.path.join(top, "slurm")
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.env = {**os.environ, "SLURM_CONF": self.conf}
        self.net = None
        if nodes == 1:  # (addresses given: the machine's name need not resolve, as in many containers)
            self.nodes = [Node(socket.gethostname().split(".")[0], addr="127.0.0.1")]
            self.ctl_host = f"{self.nodes[0].name}(127.0.0.1)"
        else:
            if os.path.realpath(top).startswith("/tmp/"):
                raise ValueError(f"{top}: each node has a /tmp of its own, which would hide this folder; "
                                 "make it elsewhere (e.g. /var/tmp)")
            self.net = NodeNetwork(nodes, os.getpid() % 100_000)
            self.nodes = self.net.nodes
            self.ctl_host = f"ctl({self.net.ctl.addr})"
        self.host = self.nodes[0].name
        self.pid_files = {"slurmctld": os.path.join(self.dir, "slurmctld.pid")}
        self.pid_files.update({n.name: os.path.join(self.dir, f"slurmd-{n.name}.pid") for n in self.nodes})
        self.pid_files["munged"] = os.path.join(self.dir, "munge", "munged.pid")  # munged writes as user munge
        self.procs: list[subprocess.Popen] = []  # our children, reaped at stop

    def _in_ctl(self) -> list[str]:
        """The prefix that runs a command in the controller's network namespace (none for one node)."""
        return ["nsenter", f"--net=/run/netns/{self.net.ctl.netns}"] if self.net else []

    def node_path(self, node: str, path: str) -> str:
        """Where the machine sees a node's `path` under /tmp (each node of several has its own /tmp)."""
        if self.net and (path == "/tmp" or path.startswith("/tmp/")):
            return os.path.join(self.dir, "nodes", node, "tmp", path[len("/tmp/"):])
        return path

    # ---- start ------------------------------------------------------------------

    def start(self) -> None:
        """Start everything; on failure stop what started (and remove the namespaces) and raise."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        for sub in ("munge", "state", "spool", "log", "ns"):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        os.chmod(self.top, 0o755)
        os.chmod(self.dir, 0o755)
        if self.net:
            self.net.create()
            with open(os.path.join(self.dir, "hosts"), "w") as f:
                f.write(self.net.hosts())
            os.chmod(os.path.join(self.dir, "hosts"), 0o644)
            for node in self.nodes:
                tmp = self.node_path(node.name, "/tmp")
                os.makedirs(tmp)
                os.chmod(tmp, 0o1777)
        self._start_munge()
        self._write_config()
        ctld = ["slurmctld", "-D", "-f", self.conf]
        if self.net:  # its own network and host name, the one SlurmctldHost gives
            ctld = [*self._in_ctl(), "unshare", "--uts", "sh", "-ec", f"hostname ctl && exec {' '.join(ctld)}"]
        self._daemon(ctld, "slurmctld")
        for node in self.nodes:
            self._start_slurmd(node)
        self._wait_idle()

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
        ctld_port, slurmd_port = _free_ports(2) if not self.net else (SLURMCTLD_PORT, SLURMD_PORT)
        d = self.dir
        self.memory_mb = _memory_mb() // len(self.nodes)
        lines = {
            "ClusterName": "shardfs-test",
            "SlurmctldHost": self.ctl_host,
            "SlurmctldPort": ctld_port,
            "SlurmdPort": slurmd_port,
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "AuthType": "auth/munge",
            "CredType": "cred/munge",
            "AuthInfo": f"socket={self.munge_socket}",
            "StateSaveLocation": f"{d}/state",
            "SlurmdSpoolDir": f"{d}/spool/%n",
            "SlurmctldPidFile": self.pid_files["slurmctld"],
            "SlurmdPidFile": f"{d}/slurmd-%n.pid",
            "SlurmctldLogFile": f"{d}/log/slurmctld.log",
            "SlurmdLogFile": f"{d}/log/slurmd-%n.log",
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
        names = ",".join(n.name for n in self.nodes)
        with open(self.conf, "w") as f:
            f.writelines(f"{key}={value}\n" for key, value in lines.items())
            for n in self.nodes:
                addr = f" NodeAddr={n.addr}" if n.addr else ""
                f.write(f"NodeName={n.name}{addr} CPUs={os.cpu_count()} RealMemory={self.memory_mb} State=UNKNOWN\n")
            f.write(f"PartitionName=test Nodes={names} Default=YES MaxTime=INFINITE State=UP\n")
        with open(os.path.join(d, "cgroup.conf"), "w") as f:
            f.write("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\nConstrainCores=no\n"
                    "ConstrainRAMSpace=yes\nConstrainSwapSpace=no\nAllowedRAMSpace=100\n")

    def _start_slurmd(self, node: Node) -> None:
        """slurmd (and so every job) in a private mount namespace: readable Python, usable /dev/fuse;
        on a node of several also its own host name, /etc/hosts and /tmp, in its network namespace."""
        ns = os.path.join(self.dir, "ns")
        os.makedirs(os.path.join(self.dir, "spool", node.name), exist_ok=True)
        setup = [f"hostname {node.name}"] if self.net else []
        base = os.path.realpath(PYTHON)
        if "/.pyenv/" in base and base.startswith("/root/"):
            pyenv = base.split("/versions/")[0]
            setup += [f"mkdir -p {ns}/pyenv", f"mount --bind {pyenv} {ns}/pyenv",
                      "mount -t tmpfs -o mode=755 tmpfs /root", f"mkdir -p {pyenv}",
                      f"mount --bind {ns}/pyenv {pyenv}"]
        setup += [f"{{ [ -e {ns}/fuse ] || mknod {ns}/fuse c 10 229; }}", f"chmod 666 {ns}/fuse",
                  f"mount --bind {ns}/fuse /dev/fuse"]
        if self.net:
            tmp = self.node_path(node.name, "/tmp")
            setup.append(f"mount --bind {self.dir}/hosts /etc/hosts")
            # The code under test stays where it is when it lives under /tmp (a checkout there):
            # bound at the same path inside the node's /tmp, which is bound with its submounts.
            repo = os.path.realpath(REPO)
            if repo.startswith("/tmp/"):
                inside = os.path.join(tmp, repo[len("/tmp/"):])
                setup += [f"mkdir -p {inside}", f"mount --bind {repo} {inside}"]
            setup.append(f"mount --rbind {tmp} /tmp")
        setup.append(f"exec slurmd -D -f {self.conf}")
        cmd = ["unshare", "-m", "--propagation", "private", *(["--uts"] if self.net else []),
               "sh", "-ec", " && ".join(setup)]
        if self.net:
            cmd = ["nsenter", f"--net=/run/netns/{node.netns}", *cmd]
        self._daemon(cmd, node.name, log_name=f"slurmd-{node.name}")

    def _daemon(self, cmd: list[str], name: str, user: str | None = None, log_name: str | None = None) -> None:
        """Start a daemon in the foreground (so that we reap it) and wait for its pid file."""
        log = open(os.path.join(self.dir, "log", f"{log_name or name}.out"), "wb")
        proc = subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                user=user, group=user, extra_groups=[] if user else None, start_new_session=True)
        log.close()
        self.procs.append(proc)

        def started() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with status {proc.returncode}\n{self.logs()}")
            return _read_pid(self.pid_files[name]) == proc.pid

        wait_for(started, lambda: f"{name} wrote no pid file\n{self.logs()}")

    def _wait_idle(self) -> None:
        states = []

        def idle() -> bool:
            listed = self.slurm("sinfo", "-h", "-N", "-o", "%N %T", timeout=30).stdout
            states[:] = sorted(line for line in listed.split("\n") if line)
            return sorted(f"{n.name} idle" for n in self.nodes) == states

        wait_for(idle, lambda: f"the nodes did not become idle (sinfo: {states!r})\n{self.logs()}")

    # ---- use ------------------------------------------------------------------

    def slurm(self, *cmd: str, user: str | None = None, env: dict | None = None, cwd: str | None = None,
              timeout: float = 300) -> subprocess.CompletedProcess:
        """A Slurm command (sbatch, scancel, squeue, ...), as `user` if given, with `env` added to
        the environment (after runuser, which sets HOME, USER, SHELL and LOGNAME for the user); in
        the controller's network namespace when the nodes have their own."""
        env = {"SLURM_CONF": self.conf, **(env or {})}
        full = [*self._in_ctl(), *(["runuser", "-u", user, "--"] if user else []), "env",
                *(f"{k}={v}" for k, v in env.items()), *cmd]
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

    def job_mounts(self, node: str | None = None) -> list[str]:
        """Mountpoints of FUSE mounts of our files (source under our directory) in the jobs' mount
        namespace (slurmd's) of `node`, or of every node; the namespace also holds copies of the
        machine's mounts of its start. Paths as the node sees them."""
        found = []
        for n in self.nodes:
            pid = _read_pid(self.pid_files[n.name])
            if node not in (None, n.name) or pid is None:
                continue
            with open(f"/proc/{pid}/mountinfo") as f:
                for line in f:
                    left, _, right = line.partition(" - ")
                    fstype, source = right.split()[:2]
                    if fstype.startswith("fuse") and source.startswith(self.top):
                        found.append(left.split()[4])
        return found

    def on_node(self, node: str, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """A command run on `node` as its jobs run: in its slurmd's mount, network and UTS namespaces."""
        pid = _read_pid(self.pid_files[node])
        return subprocess.run(["nsenter", f"--target={pid}", "--mount", "--uts", *(["--net"] if self.net else []),
                               *cmd], capture_output=True, text=True, timeout=timeout)

    def processes_of(self, uid: int) -> list[str]:
        """Command lines of every process of `uid` on the machine (so on every node)."""
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
        slurmd = [f"log/slurmd-{n.name}.{ext}" for n in self.nodes for ext in ("log", "out")]
        for name in ("log/slurmctld.log", *slurmd, "munge/munged.log", "log/munged.out", "log/slurmctld.out"):
            with contextlib.suppress(OSError), open(os.path.join(self.dir, name)) as f:
                out.append(f"--- {name} ---\n" + "".join(f.readlines()[-30:]))
        return "\n".join(out)

    # ---- stop -------------------------------------------------------------------

    def stop(self) -> None:
        """Cancel what still runs, stop the daemons by their pids, remove cgroups and namespaces.
        Safe after a start that failed half way."""
        self._cancel_jobs()
        for name in (*(n.name for n in self.nodes), "slurmctld", "munged"):
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
            try:
                proc.wait(timeout=DEADLINE)
            except subprocess.TimeoutExpired:  # (stuck in the kernel: the rest is still stopped)
                print(f"WARNING: {proc.args[0]} (pid {proc.pid}) not gone {DEADLINE:.0f} s after SIGKILL",
                      file=sys.stderr)
        self._remove_cgroups()
        if self.net:
            self.net.remove()

    def _cancel_jobs(self, timeout: float = DEADLINE) -> None:
        """A test that failed may leave a job running: cancel every job, wait until none is listed."""
        pid = _read_pid(self.pid_files["slurmctld"])
        if pid is None or not process_alive(pid):
            return
        deadline = time.monotonic() + timeout
        with contextlib.suppress(subprocess.TimeoutExpired):
            while jobs := self.slurm("squeue", "-h", "-o", "%A", timeout=30).stdout.split():
                if time.monotonic() > deadline:
                    print(f"WARNING: jobs {jobs} still listed {timeout:.0f} s after scancel", file=sys.stderr)
                    return
                self.slurm("scancel", *jobs, timeout=30)
                time.sleep(0.5)

    def _remove_cgroups(self) -> None:
        """slurmd leaves its (empty) per-node cgroup folders: remove them, deepest first."""
        for hierarchy in ("memory", "freezer", "cpuset", "devices"):
            for node in self.nodes:
                top = f"/sys/fs/cgroup/{hierarchy}/slurm_{node.name}"
                for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -w[0].count("/")):
                    with contextlib.suppress(OSError):
                        os.rmdir(dirpath)
