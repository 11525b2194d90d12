"""The daemon as systemd and mount(8) run it: sd_notify, SIGTERM, fstab types, status."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest

from conftest import DEADLINE, force_unmount, needs_fuse, shardfs_cmd, wait_for, wait_mounted

pytestmark = needs_fuse


def _messages(sock, until: str) -> list[str]:
    """The notify messages that arrive until one contains ``until``."""
    got = []

    def arrived() -> bool:
        try:
            got.append(sock.recv(4096).decode())
        except TimeoutError:
            return False
        return until in got[-1]

    wait_for(arrived, lambda: f"no {until!r} in {got}")
    return got


def test_notify_protocol_as_the_unit_runs_it(tar_shards, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    config = tmp_path / "imagenet.toml"
    config.write_text(f'sources = ["{tar_shards}"]\nmountpoint = "{mnt}"\ncache_size = "64M"\n')
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.settimeout(0.5)
    env = {**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "1000000",
           "INVOCATION_ID": "test", "CACHE_DIRECTORY": str(tmp_path / "cache")}  # what CacheDirectory= sets
    daemon = subprocess.Popen([sys.executable, "-m", "shardfs", "mount", "--config", str(config), "--foreground"],
                              env=env, stderr=subprocess.PIPE, text=True)
    try:
        first = _messages(sock, "READY=1")
        assert os.path.ismount(mnt) and os.listdir(mnt) == ["train"]  # READY came once the mount answers
        assert any("STATUS=serving 4 shards" in m for m in first)
        later = _messages(sock, "WATCHDOG=1")
        later += _messages(sock, "STATUS=")
        assert any("reads" in m and "cache" in m for m in later if m.startswith("STATUS="))
        # the unit's disk tier: in its CacheDirectory by default, shown in STATUS
        assert any("disk tier" in m for m in later if m.startswith("STATUS="))
        assert (tmp_path / "cache" / "tier").is_dir()
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=DEADLINE) == 0
        assert any("STOPPING=1" in m for m in _messages(sock, "STOPPING=1"))
        assert not os.path.ismount(mnt)
        log = daemon.stderr.read()
        assert "<6>mounted at" in log and "<6>unmounted" in log  # journald priorities, no timestamps
    finally:
        if daemon.poll() is None:
            daemon.kill()
        force_unmount(str(mnt))
        sock.close()


def test_bad_config_exits_2_with_key_and_file(tmp_path):
    config = tmp_path / "x.toml"
    config.write_text('sources = ["/d"]\nmountpoint = "/m"\ncache_sise = "1G"\n')
    done = shardfs_cmd("mount", "--config", str(config), "--foreground")
    assert done.returncode == 2 and f"{config}: cache_sise: unknown key" in done.stderr


@pytest.mark.skipif(os.getuid() != 0 or not os.path.exists("/usr/local/bin/shardfs"),
                    reason="needs root and shardfs where mount(8) looks (tools/setup.sh links it)")
def test_fstab_type_fuse_shardfs_through_mount_fuse3(tar_shards, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "fuse.shardfs", str(tar_shards), str(mnt),
                               "-o", "ro,nofail,allow_other,cache_size=32M,prefetch=all"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        stats = json.loads(os.getxattr(mnt, "user.shardfs.stats"))
        assert stats["cache"]["budget_bytes"] == 32 << 20 and stats["cache"]["prefetch"] == "all"
        assert "allow_other" in open("/proc/self/mounts").read().split(f" {mnt} ")[1].split()[1]
        assert subprocess.run(["umount", str(mnt)], capture_output=True).returncode == 0
        assert not os.path.ismount(mnt)
    finally:
        force_unmount(str(mnt))


def test_mount_helper_takes_mount8_arguments(tar_shards, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    helper = shutil.which("mount.shardfs")
    assert helper, "the mount.shardfs console script is installed with the package"
    try:
        assert subprocess.run([helper, str(tar_shards), str(mnt), "-f", "-o", "ro"]).returncode == 0
        assert not os.path.ismount(mnt)  # -f: fake
        done = subprocess.run([helper, str(tar_shards), str(mnt), "-n", "-o", "ro,loaders=3"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert os.listdir(mnt) == ["train"]
    finally:
        force_unmount(str(mnt))


def test_status_lists_live_and_stale_mounts(tar_shards, tmp_path, mount):
    live = mount(tar_shards, name="live")
    stale = tmp_path / "stale"
    stale.mkdir()
    daemon = subprocess.Popen([sys.executable, "-m", "shardfs", "mount", str(tar_shards), str(stale), "-f",
                               "--no-auto-unmount"], stderr=subprocess.DEVNULL)
    try:
        wait_mounted(stale, daemon)
        os.kill(daemon.pid, signal.SIGKILL)
        daemon.wait()
        rows = {row["mountpoint"]: row for row in json.loads(shardfs_cmd("status", "--json").stdout)}
        assert rows[live.path]["state"] == "ok" and rows[live.path]["files"] == 72
        assert rows[str(stale)]["state"] == "stale"
        one = shardfs_cmd("status", live.path)
        assert one.returncode == 0 and live.path in one.stdout and "ok" in one.stdout
    finally:
        force_unmount(str(stale))
