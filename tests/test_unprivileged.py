"""A non-root user mounts in their own job, through the setuid fusermount3 (run as `nobody` in a
private mount namespace: tests/nobody.py)."""

import pytest

import nobody

pytestmark = pytest.mark.skipif(not nobody.can_run, reason=nobody.why_not)
NOBODY = nobody.NOBODY

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
def world():
    """Shards, a mountpoint and the payload where nobody can reach them."""
    with nobody.world(PAYLOAD, classes=3, per_class=5) as top:
        yield top


def _as_nobody(world: str, mode: str, dev_fuse_mode: int) -> dict:
    return nobody.run(world, f"{world}/payload.py", [f"{world}/shards", f"{world}/mnt", mode], dev_fuse_mode)


def test_nobody_mounts_reads_with_imagefolder_and_unmounts(world):
    out = _as_nobody(world, "mount", dev_fuse_mode=0o666)
    assert out["uid"] == NOBODY
    assert out["mount"][0] == 0, out["mount"][1]
    assert out["images"] == 15 and out["classes"] == 3 and out["decoded"] == [48, 48]
    assert out["mount_owner"] == NOBODY
    assert out["umount"][0] == 0 and out["still_mounted"] is False


def test_nobody_gets_one_clear_line_for_each_missing_prerequisite(world):
    out = _as_nobody(world, "errors", dev_fuse_mode=0o600)  # closed by the node's admin
    assert out["no_dev_fuse"] == "shardfs: /dev/fuse is not accessible to this user: ask your admin to make it 0666"
    # with /dev/fuse usable, the other two
    out = _as_nobody(world, "errors", dev_fuse_mode=0o666)
    assert "allow_other needs 'user_allow_other' in /etc/fuse.conf" in out["allow_other"]
    assert out["no_fusermount"] == (
        "shardfs: fusermount3 is missing: a mount by a user other than root needs it: install the fuse3 package, "
        "whose fusermount3 is setuid root (Debian/Ubuntu: apt-get install fuse3; RHEL/Rocky/Alma: dnf install "
        "fuse3) (`shardfs run` mounts without it where unprivileged user namespaces are allowed)")
