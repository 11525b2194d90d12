"""The libfuse the clusters run: a mount on Debian 11's libfuse 3.10 (fetched from the bullseye suite
and unpacked into a private prefix, tools/benchlib/oldfuse.py) and on this system's, as root and as
nobody; and one clear line, exit 2, nothing mounted, for each missing piece."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import nobody
from benchlib import oldfuse, sample
from benchlib.cli import REPO
from conftest import force_unmount, needs_fuse
from shardfs.fuse.lib import RUNTIME

pytestmark = needs_fuse

# A mount through the CLI; what it served (every file's sha256), which libfuse files the daemon
# mapped, then the unmount. Run as root, or as nobody (tests/nobody.py).
PAYLOAD = r'''
import hashlib, json, os, subprocess, sys
src, mnt, log = sys.argv[1:4]
def shardfs(*args):
    return subprocess.run([sys.executable, "-m", "shardfs", *args], capture_output=True, text=True)
done = shardfs("mount", src, mnt, "--log-file", log)
out = {"uid": os.getuid(), "mount": [done.returncode, done.stderr.strip()]}
if done.returncode == 0:
    try:
        pid = json.loads(os.getxattr(mnt, "user.shardfs.stats"))["pid"]
        with open(f"/proc/{pid}/maps") as f:
            out["mapped"] = sorted({line.split()[-1] for line in f if "libfuse" in line})
        out["digests"] = {}
        for dirpath, _dirs, files in os.walk(mnt):
            for name in files:
                with open(os.path.join(dirpath, name), "rb") as f:
                    out["digests"][os.path.relpath(f.name, mnt)] = hashlib.sha256(f.read()).hexdigest()
    finally:
        done = shardfs("umount", mnt)
        out["umount"] = [done.returncode, done.stderr.strip()]
        out["still_mounted"] = os.path.ismount(mnt)
with open(log) as f:
    out["libfuse_line"] = [line.rstrip().split(" INFO: ", 1)[1] for line in f if " INFO: libfuse " in line]
print(json.dumps(out))
'''


def _system_libfuse() -> str | None:
    for pattern in ("/usr/lib/*/libfuse3.so.3", "/usr/lib64/libfuse3.so.3", "/usr/lib/libfuse3.so.3"):
        for path in glob.glob(pattern):
            return os.path.realpath(path)
    return None


@pytest.fixture(scope="module")
def world():
    """Shards, their source, the payload, where nobody reaches them too."""
    with nobody.world(PAYLOAD, classes=2, per_class=4) as top:
        yield top


@pytest.fixture(scope="module")
def libfuse310(world) -> str:
    """libfuse3.so.3 of Debian 11 (3.10.3), unpacked in the world-readable area."""
    try:
        path = oldfuse.unpack(os.path.join(world, "libfuse-3.10"))
    except oldfuse.Unavailable as exc:
        pytest.skip(f"libfuse 3.10 cannot be fetched: {exc}")
    nobody.share(os.path.join(world, "libfuse-3.10"))
    return path


def _mount_and_read(world: str, user: str, env: dict, name: str) -> dict:
    args = [f"{world}/shards", f"{world}/mnt", f"{world}/home/{name}.log"]
    env = {**env, "PYTHONPATH": REPO}  # this checkout's code, for nobody too
    if user == "nobody":
        return nobody.run(world, f"{world}/payload.py", args, env=env)
    try:
        done = subprocess.run([sys.executable, f"{world}/payload.py", *args], capture_output=True, text=True,
                              env={**os.environ, **env}, timeout=300)
    finally:
        force_unmount(f"{world}/mnt")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not nobody.can_run, reason=nobody.why_not)
@pytest.mark.parametrize("user", ["root", "nobody"])
@pytest.mark.parametrize("how", ["SHARDFS_LIBFUSE", "LD_LIBRARY_PATH", "system"])
def test_mount_serves_every_file_on_libfuse_310_and_on_the_systems(world, how, user, request):
    if how == "system":
        expected, env = _system_libfuse(), {}
    else:
        expected = os.path.realpath(request.getfixturevalue("libfuse310"))
        env = {how: expected if how == "SHARDFS_LIBFUSE" else os.path.dirname(expected)}
    out = _mount_and_read(world, user, env, f"{how}-{user}")
    assert out["uid"] == (nobody.NOBODY if user == "nobody" else 0)
    assert out["mount"][0] == 0, out["mount"][1]
    # one libfuse in the daemon: the loop's and mfusepy's are the same file
    assert out["mapped"] == [expected]
    assert out["digests"] == sample.digests(f"{world}/src")
    assert out["umount"][0] == 0 and out["still_mounted"] is False
    [line] = out["libfuse_line"]
    version = re.fullmatch(r"libfuse (\d+)\.(\d+)\.\d+ \((\S+)\): .*", line)
    assert version and version[3] == expected
    if how == "system":
        assert (int(version[1]), int(version[2])) >= (3, 12) and line.endswith("up to 32 threads")
    else:
        assert line.startswith(f"libfuse {oldfuse.VERSION} ") and "without the thread cap of libfuse 3.12" in line


def _refused(cmd: list[str], env: dict, mnt: str) -> tuple[int, list[str], bool]:
    """The exit status, stderr lines, and whether anything is mounted at mnt afterwards."""
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO, **env},
                          timeout=120)
    return done.returncode, done.stderr.strip().splitlines(), os.path.ismount(mnt)


def test_a_library_older_than_310_is_one_line_and_exit_2(tar_shards, tmp_path):
    """A library that says it is libfuse 3.9, found by the loader (LD_LIBRARY_PATH)."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build the stand-in library")
    lib = tmp_path / "lib"
    lib.mkdir()
    (tmp_path / "old.c").write_text('int fuse_version(void) { return 309; }\n'
                                    'const char *fuse_pkgversion(void) { return "3.9.4"; }\n')
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libfuse3.so.3", "-o", lib / "libfuse3.so.3",
                    tmp_path / "old.c"], check=True)
    (tmp_path / "mnt").mkdir()
    rc, err, mounted = _refused([sys.executable, "-m", "shardfs", "mount", str(tar_shards), str(tmp_path / "mnt")],
                                {"LD_LIBRARY_PATH": str(lib)}, str(tmp_path / "mnt"))
    assert (rc, mounted) == (2, False)
    assert err == [f"shardfs: {lib}/libfuse3.so.3 is libfuse 3.9, shardfs needs 3.10 or newer: {RUNTIME}"]


def test_no_fusermount3_is_one_line_and_exit_2(tar_shards, tmp_path):
    (tmp_path / "mnt").mkdir()
    rc, err, mounted = _refused([sys.executable, "-m", "shardfs", "mount", str(tar_shards), str(tmp_path / "mnt")],
                                {"PATH": str(tmp_path)}, str(tmp_path / "mnt"))
    assert (rc, mounted) == (2, False)
    assert err == ["shardfs: fusermount3 is missing: install the fuse3 package (Debian/Ubuntu: apt-get install "
                   "fuse3; RHEL/Rocky: dnf install fuse3)"]


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("unshare") or _system_libfuse() is None,
                    reason="needs root, unshare and the system's libfuse3 to hide")
def test_no_libfuse_at_all_is_one_line_and_exit_2(tar_shards, tmp_path):
    """The system's libfuse3 hidden in a private mount namespace: an overlay of its directory
    whose upper layer holds a whiteout for each libfuse3.so* file."""
    libdir = os.path.dirname(_system_libfuse())
    hide = [f"mknod {tmp_path}/upper/{os.path.basename(p)} c 0 0" for p in glob.glob(f"{libdir}/libfuse3.so*")]
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = " && ".join([
        f"mkdir {tmp_path}/upper {tmp_path}/work", *hide,
        f"mount -t overlay overlay -o lowerdir={libdir},upperdir={tmp_path}/upper,workdir={tmp_path}/work {libdir}",
        f"{{ {sys.executable} -m shardfs mount {tar_shards} {mnt}; echo status=$?; }}",
        f"if grep -q ' {mnt} ' /proc/self/mounts; then echo mounted; fi"])
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-ec", script], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": REPO}, timeout=120)
    assert done.stdout.split() == ["status=2"], done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        f"shardfs: libfuse3 cannot be loaded (libfuse3.so.3: cannot open shared object file: No such file or "
        f"directory): {RUNTIME}"]
