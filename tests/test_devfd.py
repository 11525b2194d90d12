"""A /dev/fuse descriptor mounted by its caller, handed over as the mountpoint /dev/fd/N, as container
runtimes do (Apptainer's --fusemount, Kubernetes CSI drivers for FUSE filesystems): the test opens
/dev/fuse and mounts it with mount(2) itself, starts shardfs with the descriptor inherited, reads
every file, unmounts, and the daemon exits."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
import subprocess
import sys

import pytest
from benchlib import oldfuse, sample
from benchlib.cli import REPO
from conftest import DEADLINE, wait_for

from shardfs.service.mount import process_alive

pytestmark = pytest.mark.skipif(os.getuid() != 0 or not os.path.exists("/dev/fuse"),
                                reason="mount(2) of /dev/fuse needs root (CAP_SYS_ADMIN) and /dev/fuse")

MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
LIBC = ctypes.CDLL(None, use_errno=True)


def _runtime_mounts(mnt: str) -> int:
    """What a container runtime does before it starts the filesystem: open /dev/fuse, mount(2) it."""
    fd = os.open("/dev/fuse", os.O_RDWR)
    data = f"fd={fd},rootmode=40000,user_id={os.getuid()},group_id={os.getgid()}"
    if LIBC.mount(b"shards", mnt.encode(), b"fuse.shardfs", MS_RDONLY | MS_NOSUID | MS_NODEV, data.encode()) != 0:
        code = ctypes.get_errno()
        os.close(fd)
        pytest.fail(f"mount(2) of /dev/fuse: {os.strerror(code)}")
    return fd


def _command(form: str, src: str, fd: int, log: str) -> list[str]:
    """The ways a runtime or a mount helper names the descriptor."""
    where, log_option = f"/dev/fd/{fd}", f"log_file={log}"
    return {
        "mount": [sys.executable, "-m", "shardfs", "mount", src, where, "--foreground", "-o", log_option],
        # a runtime that lets the program detach (Apptainer waits only for the mount to answer)
        "detached": [sys.executable, "-m", "shardfs", "mount", src, where, "-o", log_option],
        "helper": [sys.executable, "-m", "shardfs", src, where, "-f", "-o", log_option],
        "mount.shardfs": [sys.executable, "-c", "import sys; from shardfs.cli import mount_helper; "
                          "sys.exit(mount_helper())", src, where, "-f", "-o", log_option],
    }[form]


def _library(release: str, prefix: str) -> tuple[dict, str | None]:
    """The environment that picks ``release`` (system: the loader's) and the library file expected."""
    if release == "system":
        return {}, None
    try:
        library = oldfuse.shared_build(release, prefix)
    except oldfuse.Unavailable as exc:
        pytest.skip(f"libfuse {release} is not at hand: {exc}")
    return {"SHARDFS_LIBFUSE": library}, os.path.realpath(library)


@pytest.mark.parametrize("form,release", [("mount", "system"), ("mount", "3.3.0"), ("helper", "system"),
                                          ("mount.shardfs", "system"), ("detached", "system")])
def test_a_descriptor_mounted_by_its_caller_is_served_until_unmounted(form, release, sample_tree, tar_shards,
                                                                      tmp_path):
    mnt = str(tmp_path / "mnt")
    os.mkdir(mnt)
    env, library = _library(release, str(tmp_path / "libfuse"))
    fd = _runtime_mounts(mnt)
    with open(tmp_path / "daemon.out", "wb") as out:
        daemon = subprocess.Popen(_command(form, str(tar_shards), fd, str(tmp_path / "daemon.log")), pass_fds=(fd,),
                                  stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": REPO, **env})
    os.close(fd)  # the daemon holds the only descriptor now: if it dies, the mount answers ENOTCONN
    pid = None
    try:
        figures = json.loads(os.getxattr(mnt, "user.shardfs.stats"))  # waits for the daemon's INIT
        pid = figures["pid"]
        if form == "detached":  # `shardfs mount` returns once the mount answers; its daemon serves on
            assert daemon.wait(timeout=DEADLINE) == 0 and pid != daemon.pid
        else:
            assert pid == daemon.pid
        assert figures["mountpoint"] == f"/dev/fd/{fd}"
        if library:
            with open(f"/proc/{pid}/maps") as f:
                mapped = {path for path in (line.split()[-1] for line in f) if "/libfuse3.so" in path}
            assert mapped == {library}
        served = sample.digests(mnt)
        assert served == sample.digests(str(sample_tree))
        assert sample.dirs_under(mnt) == sample.dirs_under(str(sample_tree))
        with pytest.raises(OSError) as refused:
            open(os.path.join(mnt, min(served)), "r+b")
        assert refused.value.errno == errno.EROFS
        assert LIBC.umount2(mnt.encode(), 0) == 0, os.strerror(ctypes.get_errno())  # the runtime unmounts
        if form == "detached":
            wait_for(lambda: not process_alive(pid), "the detached daemon to exit after the unmount")
        else:
            assert daemon.wait(timeout=DEADLINE) == 0
    finally:
        if os.path.ismount(mnt):
            LIBC.umount2(mnt.encode(), 2)  # MNT_DETACH
        if daemon.poll() is None:
            daemon.terminate()
            daemon.wait(timeout=30)
        if pid not in (None, daemon.pid) and process_alive(pid):  # a detached daemon: ours, by its pid
            os.kill(pid, signal.SIGTERM)
    with open(tmp_path / "daemon.log") as f:
        log = f.read()
    assert f"mounted at /dev/fd/{fd}" in log and f"unmounted /dev/fd/{fd}" in log


@pytest.mark.parametrize("fd,why", [(99, "descriptor 99 is not open"), (0, "descriptor 0 is not /dev/fuse")])
def test_a_descriptor_that_is_no_mounted_dev_fuse_is_one_line_and_exit_2(fd, why, tar_shards):
    done = subprocess.run([sys.executable, "-m", "shardfs", "mount", str(tar_shards), f"/dev/fd/{fd}", "-f"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": REPO})
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"shardfs: /dev/fd/{fd}: {why}")
