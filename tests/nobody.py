"""Running a script as `nobody`, as a user without root on a cluster node would.

Inside a private mount namespace (unshare -m), so nothing on the machine changes: there, /root is
replaced by a world-readable tmpfs holding only the Python installation (the default interpreter
lives under /root, which is 0700), and /dev/fuse by a node of the same device with the mode the
test asks for (the host's own may be 0600 or 0666).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from typing import Iterator

from benchlib import sample

NOBODY = 65534
# The interpreter as the suite runs it (a venv's bin/python: its packages come with it); the
# installation it links to may live under /root (pyenv), which run() makes readable.
PYTHON = sys.executable
can_run = os.getuid() == 0 and all(shutil.which(t) for t in ("unshare", "runuser", "fusermount3"))
why_not = "needs root, unshare, runuser and fusermount3"


@contextlib.contextmanager
def world(payload: str, classes: int, per_class: int) -> Iterator[str]:
    """A world-readable work area (pytest's own tmp dirs are 0700): an ImageFolder sample in src/,
    its tar shards in shards/, ``payload`` as payload.py, a mountpoint mnt/ and a home/ owned by
    nobody."""
    top = tempfile.mkdtemp(prefix="shardfs-nobody-")
    os.chmod(top, 0o755)
    try:
        for d in ("mnt", "home"):
            os.mkdir(os.path.join(top, d))
            os.chown(os.path.join(top, d), NOBODY, NOBODY)
        sample.make_imagefolder(os.path.join(top, "src"), classes=classes, per_class=per_class, side=48)
        sample.pack_tar_round_robin(os.path.join(top, "src"), os.path.join(top, "shards"), shards=2)
        with open(os.path.join(top, "payload.py"), "w") as f:
            f.write(payload)
        share(top)
        yield top
    finally:
        subprocess.run(["fusermount3", "-u", "-z", os.path.join(top, "mnt")], capture_output=True)
        shutil.rmtree(top, ignore_errors=True)


def share(top: str) -> None:
    """Everything under ``top`` readable (and its directories searchable) by nobody."""
    for dirpath, dirs, files in os.walk(top):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode | stat.S_IROTH | (stat.S_IXOTH if name in dirs else 0))


def namespace_setup(top: str, dev_fuse_mode: int = 0o666) -> list[str]:
    """Shell commands, run as root in a private mount namespace, that let nobody run Python there
    and give the namespace its own /dev/fuse with ``dev_fuse_mode`` (0666 as udev makes it on most
    nodes, 0600 for a node whose admin closed it) and its own /etc/fuse.conf (without
    user_allow_other), whatever the host's are; ``top/ns`` holds what they need."""
    base = os.path.realpath(PYTHON)
    pyenv = base.split("/versions/")[0] if "/.pyenv/" in base else None
    setup = [f"mkdir -p {top}/ns"]
    if pyenv and base.startswith("/root/"):
        setup += [f"mkdir -p {top}/ns/pyenv", f"mount --bind {pyenv} {top}/ns/pyenv",
                  "mount -t tmpfs -o mode=755 tmpfs /root", f"mkdir -p {pyenv}",
                  f"mount --bind {top}/ns/pyenv {pyenv}"]
    # fusermount3's /etc/fuse.conf as fuse3 ships it (no user_allow_other), whatever the host's says
    setup += [f": > {top}/ns/fuse.conf", f"[ ! -e /etc/fuse.conf ] || mount --bind {top}/ns/fuse.conf /etc/fuse.conf"]
    return setup + [f"{{ [ -e {top}/ns/fuse ] || mknod {top}/ns/fuse c 10 229; }}",
                    f"chmod {dev_fuse_mode:o} {top}/ns/fuse", f"mount --bind {top}/ns/fuse /dev/fuse"]


def as_nobody(top: str, argv: list[str], env: dict | None = None) -> list[str]:
    """``argv`` run as nobody, with HOME in ``top`` and the plain system PATH (plus ``env``)."""
    variables = {"HOME": f"{top}/home", "PATH": "/usr/local/bin:/usr/bin:/bin", **(env or {})}
    return ["runuser", "-u", "nobody", "--", "env", *(f"{k}={v}" for k, v in variables.items()), *argv]


def run(top: str, script: str, args: list[str], dev_fuse_mode: int = 0o666, env: dict | None = None) -> dict:
    """``python script args`` as nobody (with ``dev_fuse_mode`` as in namespace_setup); returns the
    JSON object its last output line holds."""
    command = as_nobody(top, [PYTHON, script, *args], env)
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-ec",
                           " && ".join(namespace_setup(top, dev_fuse_mode) + [shlex.join(command)])],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])

