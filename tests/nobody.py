"""Running a script as `nobody`, as a user without root on a cluster node would.

Inside a private mount namespace (unshare -m), so nothing on the machine changes: there, /root is
replaced by a world-readable tmpfs holding only the Python installation (the default interpreter
lives under /root, which is 0700), and /dev/fuse by a 0666 node of the same device.
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
PYTHON = os.path.realpath(sys.executable)
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


def namespace_setup(top: str, fuse_for_all: bool = True) -> list[str]:
    """Shell commands, run as root in a private mount namespace, that let nobody run Python there
    (and, with ``fuse_for_all``, open /dev/fuse); ``top/ns`` holds what they need."""
    pyenv = PYTHON.split("/versions/")[0] if "/.pyenv/" in PYTHON else None
    setup = [f"mkdir -p {top}/ns"]
    if pyenv and PYTHON.startswith("/root/"):
        setup += [f"mkdir -p {top}/ns/pyenv", f"mount --bind {pyenv} {top}/ns/pyenv",
                  "mount -t tmpfs -o mode=755 tmpfs /root", f"mkdir -p {pyenv}",
                  f"mount --bind {top}/ns/pyenv {pyenv}"]
    if fuse_for_all:
        setup += [f"{{ [ -e {top}/ns/fuse ] || mknod {top}/ns/fuse c 10 229; }}", f"chmod 666 {top}/ns/fuse",
                  f"mount --bind {top}/ns/fuse /dev/fuse"]
    return setup


def as_nobody(top: str, argv: list[str], env: dict | None = None) -> list[str]:
    """``argv`` run as nobody, with HOME in ``top`` and the plain system PATH (plus ``env``)."""
    variables = {"HOME": f"{top}/home", "PATH": "/usr/local/bin:/usr/bin:/bin", **(env or {})}
    return ["runuser", "-u", "nobody", "--", "env", *(f"{k}={v}" for k, v in variables.items()), *argv]


def run(top: str, script: str, args: list[str], fuse_for_all: bool = True, env: dict | None = None) -> dict:
    """``python script args`` as nobody; returns the JSON object its last output line holds."""
    command = as_nobody(top, [sys.executable, script, *args], env)  # the venv's (its packages), not the one it is made from
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-ec",
                           " && ".join(namespace_setup(top, fuse_for_all) + [shlex.join(command)])],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])

