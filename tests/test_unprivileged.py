"""A non-root user mounts in their own job, through the setuid fusermount3.

Runs as `nobody` inside a private mount namespace (unshare -m), so nothing on the machine
changes: there, /root is replaced by a world-readable tmpfs holding only the Python
installation (the default interpreter lives under /root, which is 0700), and /dev/fuse by
a 0666 node of the same device.
"""

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest

from benchlib import sample

pytestmark = pytest.mark.skipif(
    os.getuid() != 0 or not all(shutil.which(t) for t in ("unshare", "runuser", "fusermount3")),
    reason="needs root, unshare, runuser and fusermount3",
)
PYTHON = os.path.realpath(sys.executable)
NOBODY = 65534

PAYLOAD = r'''
import json, os, subprocess, sys
src, mnt = sys.argv[1:3]
def shardfs(*args, env=None):
    return subprocess.run([sys.executable, "-m", "shardfs", *args], capture_output=True, text=True, env=env)
out = {"uid": os.getuid()}
if sys.argv[3] == "mount":
    done = shardfs("mount", src, mnt)
    out["mount"] = [done.returncode, done.stderr.strip()]
    if done.returncode == 0:
        from torchvision import datasets
        ds = datasets.ImageFolder(os.path.join(mnt, "train"))
        out["images"], out["classes"] = len(ds), len(ds.classes)
        out["decoded"] = ds[0][0].size
        out["mount_owner"] = os.stat(mnt).st_uid
        done = shardfs("umount", mnt)
        out["umount"] = [done.returncode, done.stderr.strip()]
        out["still_mounted"] = os.path.ismount(mnt)
else:
    out["no_dev_fuse"] = shardfs("mount", src, mnt).stderr.strip()
    out["allow_other"] = shardfs("mount", src, mnt, "-o", "allow_other").stderr.strip()
    out["no_fusermount"] = shardfs("mount", src, mnt, env={**os.environ, "PATH": "/nonexistent"}).stderr.strip()
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A world-readable work area (pytest's own tmp dirs are 0700): shards, mountpoint, home."""
    top = tempfile.mkdtemp(prefix="shardfs-nobody-")
    os.chmod(top, 0o755)
    try:
        src = os.path.join(top, "src")
        sample.make_imagefolder(src, classes=3, per_class=5, side=48)
        sample.pack_tar_round_robin(src, os.path.join(top, "shards"), shards=2)
        for d in ("mnt", "home"):
            os.mkdir(os.path.join(top, d))
            os.chown(os.path.join(top, d), NOBODY, NOBODY)
        with open(os.path.join(top, "payload.py"), "w") as f:
            f.write(PAYLOAD)
        for dirpath, dirs, files in os.walk(top):
            for name in dirs + files:
                path = os.path.join(dirpath, name)
                os.chmod(path, os.stat(path).st_mode | stat.S_IROTH | (stat.S_IXOTH if name in dirs else 0))
        yield top
    finally:
        subprocess.run(["fusermount3", "-u", "-z", os.path.join(top, "mnt")], capture_output=True)
        shutil.rmtree(top, ignore_errors=True)


def _as_nobody(world: str, mode: str, fuse_for_all: bool) -> dict:
    pyenv = PYTHON.split("/versions/")[0] if "/.pyenv/" in PYTHON else None
    setup = [f"mkdir -p {world}/ns"]
    if pyenv and PYTHON.startswith("/root/"):
        setup += [f"mkdir -p {world}/ns/pyenv", f"mount --bind {pyenv} {world}/ns/pyenv",
                  "mount -t tmpfs -o mode=755 tmpfs /root", f"mkdir -p {pyenv}",
                  f"mount --bind {world}/ns/pyenv {pyenv}"]
    if fuse_for_all:
        setup += [f"{{ [ -e {world}/ns/fuse ] || mknod {world}/ns/fuse c 10 229; }}", f"chmod 666 {world}/ns/fuse",
                  f"mount --bind {world}/ns/fuse /dev/fuse"]
    run = (f"runuser -u nobody -- env HOME={world}/home PATH=/usr/local/bin:/usr/bin:/bin "
           f"{PYTHON} {world}/payload.py {world}/shards {world}/mnt {mode}")
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-ec", " && ".join(setup + [run])],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_nobody_mounts_reads_with_imagefolder_and_unmounts(world):
    out = _as_nobody(world, "mount", fuse_for_all=True)
    assert out["uid"] == NOBODY
    assert out["mount"][0] == 0, out["mount"][1]
    assert out["images"] == 15 and out["classes"] == 3 and out["decoded"] == [48, 48]
    assert out["mount_owner"] == NOBODY
    assert out["umount"][0] == 0 and out["still_mounted"] is False


def test_nobody_gets_one_clear_line_for_each_missing_prerequisite(world):
    out = _as_nobody(world, "errors", fuse_for_all=False)
    assert out["no_dev_fuse"] == "shardfs: /dev/fuse is not accessible to this user: ask your admin to make it 0666"
    # with /dev/fuse usable, the other two
    out = _as_nobody(world, "errors", fuse_for_all=True)
    assert "allow_other needs 'user_allow_other' in /etc/fuse.conf" in out["allow_other"]
    assert out["no_fusermount"] == ("shardfs: fusermount3 is missing: install the fuse3 package (Debian/Ubuntu: "
                                    "apt-get install fuse3; RHEL/Rocky: dnf install fuse3)")
