"""The libfuse the clusters run: a mount on libfuse 3.3.0 (RHEL 8) and 3.9.0 (Ubuntu 20.04), built in
shared/libfuse/ beside the repository, on Debian 11's 3.10 (fetched from the bullseye suite and
unpacked into a private prefix, tools/benchlib/oldfuse.py) and on this system's, as root and as
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
from shardfs.fuse.lib import RUNTIME, TOO_OLD

pytestmark = needs_fuse

# A mount through the CLI; what it served (every file's sha256), which libfuse files the daemon
# mapped, then the unmount. Run as root, or as nobody (tests/nobody.py).
PAYLOAD = r'''
import errno, hashlib, json, os, subprocess, sys
src, mnt, log = sys.argv[1:4]
def shardfs(*args):
    return subprocess.run([sys.executable, "-m", "shardfs", *args], capture_output=True, text=True)
done = shardfs("mount", src, mnt, "--log-file", log)
out = {"uid": os.getuid(), "mount": [done.returncode, done.stderr.strip()]}
if done.returncode == 0:
    try:
        pid = json.loads(os.getxattr(mnt, "user.shardfs.stats"))["pid"]
        with open(f"/proc/{pid}/maps") as f:
            out["mapped"] = sorted({path for path in (line.split()[-1] for line in f)
                                    if os.path.basename(path).startswith("libfuse")})
        out["digests"], out["dirs"] = {}, []
        for dirpath, dirs, files in os.walk(mnt):
            out["dirs"] += [os.path.relpath(os.path.join(dirpath, name), mnt) for name in dirs]
            for name in files:
                with open(os.path.join(dirpath, name), "rb") as f:
                    out["digests"][os.path.relpath(f.name, mnt)] = hashlib.sha256(f.read()).hexdigest()
        member = os.path.join(mnt, min(out["digests"]))
        writes = {"create": lambda: open(os.path.join(mnt, "new"), "wb"), "write": lambda: open(member, "r+b"),
                  "mkdir": lambda: os.mkdir(os.path.join(mnt, "new")), "unlink": lambda: os.unlink(member),
                  "rename": lambda: os.rename(member, member + ".moved"), "chmod": lambda: os.chmod(member, 0o600),
                  "setxattr": lambda: os.setxattr(member, "user.x", b"1")}
        out["writes"] = {}
        for what, write in writes.items():
            try:
                write()
                out["writes"][what] = "done"
            except OSError as exc:
                out["writes"][what] = errno.errorcode[exc.errno]
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


def _release(world: str, release: str, request) -> tuple[str, str | None]:
    """The library file of an older ``release`` and the folder of its fusermount3 (None: the system's)."""
    if release == "3.10":
        return os.path.realpath(request.getfixturevalue("libfuse310")), None
    prefix = os.path.join(world, f"libfuse-{release}")
    try:
        library = oldfuse.shared_build(release, prefix)
    except oldfuse.Unavailable as exc:
        pytest.skip(f"libfuse {release} is not at hand: {exc}")
    nobody.share(prefix)
    return os.path.realpath(library), os.path.join(prefix, "bin")


def _mount_and_read(world: str, user: str, env: dict, name: str, fusermount_dir: str | None = None) -> dict:
    args = [f"{world}/shards", f"{world}/mnt", f"{world}/home/{name}.log"]
    env = {**env, "PYTHONPATH": REPO}  # this checkout's code, for nobody too
    if fusermount_dir:  # the release's own, first on PATH
        env["PATH"] = f"{fusermount_dir}:" + ("/usr/local/bin:/usr/bin:/bin" if user == "nobody" else os.environ["PATH"])
    if user == "nobody":
        return nobody.run(world, f"{world}/payload.py", args, env=env)
    try:
        done = subprocess.run([sys.executable, f"{world}/payload.py", *args], capture_output=True, text=True,
                              env={**os.environ, **env}, timeout=300)
    finally:
        force_unmount(f"{world}/mnt")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _source_dirs(root: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(top, name), root) for top, dirs, _ in os.walk(root) for name in dirs)


def _served_everything(out: dict, world: str, user: str, expected: str) -> str:
    """Every check of one mount; returns the daemon's libfuse line."""
    assert out["uid"] == (nobody.NOBODY if user == "nobody" else 0)
    assert out["mount"][0] == 0, out["mount"][1]
    # one libfuse in the daemon: the loop's and mfusepy's are the same file
    assert out["mapped"] == [expected]
    assert sorted(out["dirs"]) == _source_dirs(f"{world}/src")
    assert out["digests"] == sample.digests(f"{world}/src")
    assert out["writes"] == {what: "EROFS" for what in
                             ("create", "write", "mkdir", "unlink", "rename", "chmod", "setxattr")}
    assert out["umount"][0] == 0 and out["still_mounted"] is False
    [line] = out["libfuse_line"]
    version = re.fullmatch(r"libfuse (\d+)\.(\d+)\.\d+ \((\S+)\): .*", line)
    assert version and version[3] == expected
    return line


# What the loop does without on each older release (lib.LACKING), as the daemon logs it.
LACKS = {"3.3.0": ["max_pages", "FUSE_CAP_CACHE_SYMLINKS"], "3.9.0": ["FUSE_CAP_CACHE_SYMLINKS"], "3.10": []}


@pytest.mark.skipif(not nobody.can_run, reason=nobody.why_not)
@pytest.mark.parametrize("user", ["root", "nobody"])
@pytest.mark.parametrize("how", ["SHARDFS_LIBFUSE", "LD_LIBRARY_PATH"])
@pytest.mark.parametrize("release", ["3.3.0", "3.9.0", "3.10"])
def test_mount_serves_every_file_on_the_older_libfuse_clusters_run(world, release, how, user, request):
    expected, fusermount_dir = _release(world, release, request)
    env = {how: expected if how == "SHARDFS_LIBFUSE" else os.path.dirname(expected)}
    out = _mount_and_read(world, user, env, f"{release}-{how}-{user}", fusermount_dir)
    line = _served_everything(out, world, user, expected)
    assert line.startswith(f"libfuse {oldfuse.VERSION if release == '3.10' else release} ")
    assert "without the thread cap of libfuse 3.12" in line
    assert [lack for lack in LACKS["3.3.0"] if lack in line] == LACKS[release]


@pytest.mark.skipif(not nobody.can_run, reason=nobody.why_not)
@pytest.mark.parametrize("user", ["root", "nobody"])
def test_mount_serves_every_file_on_the_systems_libfuse(world, user):
    expected = _system_libfuse()
    out = _mount_and_read(world, user, {}, f"system-{user}")
    line = _served_everything(out, world, user, expected)
    version = re.match(r"libfuse (\d+)\.(\d+)", line)
    assert (int(version[1]), int(version[2])) >= (3, 12) and line.endswith("up to 32 threads")


def _refused(cmd: list[str], env: dict, mnt: str) -> tuple[int, list[str], bool]:
    """The exit status, stderr lines, and whether anything is mounted at mnt afterwards."""
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO, **env},
                          timeout=120)
    return done.returncode, done.stderr.strip().splitlines(), os.path.ismount(mnt)


def test_a_library_older_than_33_is_one_line_and_exit_2(tar_shards, tmp_path):
    """A library that says it is libfuse 3.2 (fuse_version() 302, as 3.3 to 3.9 say too, but without
    their symbols), found by the loader (LD_LIBRARY_PATH)."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build the stand-in library")
    lib = tmp_path / "lib"
    lib.mkdir()
    (tmp_path / "old.c").write_text('int fuse_version(void) { return 302; }\n'
                                    'const char *fuse_pkgversion(void) { return "3.2.1"; }\n')
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libfuse3.so.3", "-o", lib / "libfuse3.so.3",
                    tmp_path / "old.c"], check=True)
    (tmp_path / "mnt").mkdir()
    rc, err, mounted = _refused([sys.executable, "-m", "shardfs", "mount", str(tar_shards), str(tmp_path / "mnt")],
                                {"LD_LIBRARY_PATH": str(lib)}, str(tmp_path / "mnt"))
    assert (rc, mounted) == (2, False)
    assert err == [f"shardfs: {lib}/libfuse3.so.3 is libfuse 3.2, too old for shardfs: {TOO_OLD}"]
    assert "the oldest that works is 3.3.0" in TOO_OLD and "dnf install" not in TOO_OLD


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare")
def test_root_mounts_without_fusermount3(world):
    """fusermount3 hidden in a private mount namespace (/dev/null bound over it): libfuse mounts with
    mount(2) alone, and the daemon says it goes without auto_unmount. (Users other than root get one
    line: tests/test_unprivileged.py.)"""
    log = f"{world}/home/no-fusermount3.log"
    script = (f"mount --bind /dev/null {shutil.which('fusermount3')} && "
              f"{sys.executable} {world}/payload.py {world}/shards {world}/mnt {log}")
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-ec", script], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": REPO}, timeout=300)
    assert done.returncode == 0, done.stderr
    _served_everything(json.loads(done.stdout.strip().splitlines()[-1]), world, "root", _system_libfuse())
    with open(log) as f:
        assert "WARNING: fusermount3 is missing: no auto_unmount" in f.read()


def _hide_system_libfuse(tmp: str) -> list[str]:
    """Shell commands that hide the system's libfuse3 in a private mount namespace: an overlay of its
    directory whose upper layer holds a whiteout for each libfuse3.so* file."""
    libdir = os.path.dirname(_system_libfuse())
    hide = [f"mknod {tmp}/upper/{os.path.basename(p)} c 0 0" for p in glob.glob(f"{libdir}/libfuse3.so*")]
    return [f"mkdir {tmp}/upper {tmp}/work", *hide,
            f"mount -t overlay overlay -o lowerdir={libdir},upperdir={tmp}/upper,workdir={tmp}/work {libdir}"]


needs_system_libfuse_to_hide = pytest.mark.skipif(
    os.getuid() != 0 or not shutil.which("unshare") or _system_libfuse() is None,
    reason="needs root, unshare and the system's libfuse3 to hide")


@needs_system_libfuse_to_hide
def test_no_libfuse_at_all_is_one_line_and_exit_2(tar_shards, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = " && ".join([
        *_hide_system_libfuse(str(tmp_path)),
        f"{{ {sys.executable} -m shardfs mount {tar_shards} {mnt}; echo status=$?; }}",
        f"if grep -q ' {mnt} ' /proc/self/mounts; then echo mounted; fi"])
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-ec", script], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": REPO}, timeout=120)
    assert done.stdout.split() == ["status=2"], done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        f"shardfs: libfuse3 cannot be loaded (libfuse3.so.3: cannot open shared object file: No such file or "
        f"directory): {RUNTIME}"]


@needs_system_libfuse_to_hide
def test_a_libfuse_with_the_soname_of_317_is_found(world, tmp_path):
    """libfuse 3.17 and newer are libfuse3.so.4 (Debian 13, Fedora 42): the only libfuse3 here is one
    by that name (a copy of the system's, on LD_LIBRARY_PATH; the system's hidden)."""
    os.mkdir(tmp_path / "lib")
    library = shutil.copy(_system_libfuse(), tmp_path / "lib" / "libfuse3.so.4")
    script = " && ".join([*_hide_system_libfuse(str(tmp_path)),
                          f"{sys.executable} {world}/payload.py {world}/shards {world}/mnt {world}/home/so4.log"])
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-ec", script], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": REPO, "LD_LIBRARY_PATH": str(tmp_path / "lib")},
                          timeout=300)
    assert done.returncode == 0, done.stderr
    _served_everything(json.loads(done.stdout.strip().splitlines()[-1]), world, "root", str(library))
