"""`shardfs run` by a user without root where fusermount3 cannot mount (missing, or not setuid):
the mount and the command in a user and mount namespace of their own (shardfs/service/userns.py).
Run as `nobody` (tests/nobody.py); the command reads every file and reports what it sees while
the test looks from outside the namespace."""

import glob
import os
import shutil

import nobody
import pytest
from benchlib import sample
from benchlib.cli import REPO

pytestmark = pytest.mark.skipif(not nobody.can_run, reason=nobody.why_not)

# The command `shardfs run` runs: every file's sha256, then it waits until the test has looked from
# outside, and exits 7.
COMMAND = r'''
import errno, hashlib, json, os, sys, time
root, home = os.environ["SHARDFS_MOUNT"], sys.argv[1]
seen = {"uid": os.getuid(), "gid": os.getgid(), "home": os.environ["HOME"], "marker": os.environ.get("MARKER"),
        "cwd": os.getcwd(), "pid": json.loads(os.getxattr(root, "user.shardfs.stats"))["pid"],
        "digests": {}, "dirs": []}
for top, dirs, files in os.walk(root):
    seen["dirs"] += [os.path.relpath(os.path.join(top, name), root) for name in dirs]
    for name in files:
        with open(os.path.join(top, name), "rb") as f:
            seen["digests"][os.path.relpath(f.name, root)] = hashlib.sha256(f.read()).hexdigest()
try:
    open(os.path.join(root, "new"), "wb")
    seen["create"] = "done"
except OSError as exc:
    seen["create"] = errno.errorcode[exc.errno]
with open(os.path.join(home, "inside.json.tmp"), "w") as f:  # renamed whole: the payload reads it once it exists
    json.dump(seen, f)
os.replace(os.path.join(home, "inside.json.tmp"), os.path.join(home, "inside.json"))
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(home, "looked")) and time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(7)
'''

# As nobody: `shardfs run` with that command; what it saw, what the outside saw meanwhile, and after.
PAYLOAD = r'''
import ctypes, json, os, subprocess, sys, time
src, mnt, home, limit = sys.argv[1:5]
for name in ("inside.json", "looked"):  # an earlier test's
    if os.path.exists(os.path.join(home, name)):
        os.remove(os.path.join(home, name))
if limit == "no user namespaces":  # as an admin's sysctl would: here in a namespace of the payload's own
    libc, uid, gid = ctypes.CDLL(None, use_errno=True), os.getuid(), os.getgid()
    assert libc.unshare(0x10000000) == 0, os.strerror(ctypes.get_errno())
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    with open("/proc/sys/user/max_user_namespaces", "w") as f:
        f.write("0")
with open(os.path.join(home, "command.py"), "w") as f:
    f.write(COMMAND)
run = subprocess.Popen([sys.executable, "-m", "shardfs", "run", src, mnt, "--", sys.executable,
                        os.path.join(home, "command.py"), home], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, env={**os.environ, "MARKER": "kept"})
out = {"uid": os.getuid(), "cwd": os.getcwd()}
inside = os.path.join(home, "inside.json")
deadline = time.monotonic() + 120  # a hang fails the test, not its timeout
while not os.path.exists(inside) and run.poll() is None and time.monotonic() < deadline:
    time.sleep(0.05)
if run.poll() is None and not os.path.exists(inside):
    run.kill()
if os.path.exists(inside):
    with open(inside) as f:
        out["inside"] = json.load(f)
    with open("/proc/self/mountinfo") as f:
        out["outside_mounts"] = [line.split()[4] for line in f if line.split()[4].startswith(os.path.dirname(mnt))]
    out["outside_mnt"] = os.listdir(mnt)
    open(os.path.join(home, "looked"), "w").close()
stdout, stderr = run.communicate(timeout=120)
out["status"], out["stderr"] = run.returncode, stderr.strip().splitlines()
out["mnt_left"] = os.path.exists(mnt)
if "inside" in out:
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{out['inside']['pid']}") and time.monotonic() < deadline:
        time.sleep(0.05)
    out["daemon_left"] = os.path.exists(f"/proc/{out['inside']['pid']}")
print(json.dumps(out))
'''.replace("COMMAND", repr(COMMAND))


@pytest.fixture(scope="module")
def world():
    with nobody.world(PAYLOAD, classes=3, per_class=4) as top:
        # a fusermount3 that is not setuid root, as some containers have it
        os.mkdir(os.path.join(top, "plain"))
        os.chmod(shutil.copy(shutil.which("fusermount3"), os.path.join(top, "plain")), 0o755)
        nobody.share(top)
        yield top


def _run_as_nobody(world: str, path: str, limit: str = "none") -> dict:
    args = [f"{world}/shards", f"{world}/mnt/job", f"{world}/home", limit]
    return nobody.run(world, f"{world}/payload.py", args, env={"PYTHONPATH": REPO, "PATH": path})


@pytest.mark.parametrize("fusermount", ["missing", "not setuid"])
def test_run_mounts_in_a_user_namespace_where_fusermount3_cannot(world, fusermount):
    path = "/nonexistent" if fusermount == "missing" else f"{world}/plain"
    out = _run_as_nobody(world, path)
    assert out["stderr"] == [] and out["status"] == 7  # the command's own
    inside = out["inside"]
    assert (inside["uid"], inside["gid"]) == (nobody.NOBODY, nobody.NOBODY)
    assert (inside["home"], inside["marker"], inside["cwd"]) == (f"{world}/home", "kept", out["cwd"])
    assert inside["digests"] == sample.digests(f"{world}/src")
    assert sorted(inside["dirs"]) == sorted(os.path.relpath(os.path.join(top, name), f"{world}/src")
                                            for top, dirs, _ in os.walk(f"{world}/src") for name in dirs)
    assert inside["create"] == "EROFS"
    # the rest of the node never saw the mount
    assert out["outside_mounts"] == [] and out["outside_mnt"] == []
    # afterwards: the daemon has exited, the mountpoint it made is gone, its log is named after it
    assert out["daemon_left"] is False and out["mnt_left"] is False
    [log] = glob.glob(f"{world}/home/.cache/shardfs/logs/job-*.log")
    with open(log) as f:
        assert "mounted at /dev/fd/" in f.read()


def test_where_neither_works_one_line_says_what_an_admin_must_do(world):
    out = _run_as_nobody(world, "/nonexistent", "no user namespaces")
    assert out["uid"] == nobody.NOBODY and "inside" not in out and out["mnt_left"] is False
    assert out["status"] == 2
    assert out["stderr"] == [
        "shardfs: cannot mount: fusermount3 is missing, and a user namespace cannot be made here (the limit of "
        "user namespaces is reached: user.max_user_namespaces): ask an admin to install fuse3 (fusermount3, "
        "setuid root) or to allow unprivileged user namespaces (sysctl user.max_user_namespaces > 0; Debian 10: "
        "kernel.unprivileged_userns_clone=1; Ubuntu 24.04: kernel.apparmor_restrict_unprivileged_userns=0)"]
