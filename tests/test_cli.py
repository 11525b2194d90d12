"""What a user sees when something is wrong: exit status 2 and one line saying what to do."""

import os
import shutil
import signal
import subprocess
import sys

import pytest
from conftest import DEADLINE, force_unmount, needs_fuse, shardfs_cmd, wait_for, wait_mounted
from benchlib import sample
from shardfs.service.mount import process_alive


def _one_line_error(done, *fragments):
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_a_folder_with_shards_only_in_subfolders_names_them(tmp_path, tar_shards):
    """(Every other wrong command, as root and as nobody: test_wrong_commands.py.)"""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for split in ("train", "val"):  # tar shards only in subdirectories: which, and how to name them
        (tmp_path / "splits" / split).mkdir(parents=True)
        shutil.copy(sorted(tar_shards.glob("*.tar"))[0], tmp_path / "splits" / split / "s.tar")
    _one_line_error(shardfs_cmd("mount", str(tmp_path / "splits"), str(mnt)), "no shard found",
                    "subdirectories train, val", os.path.join(str(tmp_path / "splits"), "*", "*.tar"))


@needs_fuse
def test_busy_mountpoint_and_glob_sources(tar_shards, tmp_path, mount):
    m = mount(str(tar_shards / "train-00000[01].tar"), str(tar_shards / "train-000003.tar"))
    assert m.stats()["shards"] == 3
    _one_line_error(shardfs_cmd("mount", str(tar_shards), m.path), "busy")


@needs_fuse
def test_stale_mount_after_sigkill_is_cleaned_by_next_mount(tar_shards, tmp_path, mount):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    daemon = subprocess.Popen([sys.executable, "-m", "shardfs", "mount", str(tar_shards), str(mnt), "--foreground",
                               "--no-auto-unmount"], stderr=subprocess.PIPE, text=True)
    try:
        wait_mounted(mnt, daemon)
        os.kill(daemon.pid, signal.SIGKILL)
        daemon.wait()
        try:
            os.listdir(mnt)
            raise AssertionError("expected a stale mount")
        except OSError as exc:
            assert exc.errno == 107  # ENOTCONN: Transport endpoint is not connected
        m = mount(tar_shards)
        assert "cleaned a stale mount" in m.output
        assert len(os.listdir(os.path.join(m.path, "train"))) == 6
    finally:
        if daemon.poll() is None:
            daemon.kill()
        force_unmount(str(mnt))


@needs_fuse
def test_sigkill_with_auto_unmount_leaves_no_mount(tar_shards, mount):
    m = mount(tar_shards)
    os.kill(m.pid, signal.SIGKILL)
    # fusermount3's auto_unmount watcher notices the daemon is gone (on a loaded machine once > 30 s)
    wait_for(lambda: not os.path.ismount(m.path), "mount left behind")
    assert os.listdir(m.path) == []  # the mountpoint is an ordinary empty directory again
    again = mount(tar_shards)
    assert len(os.listdir(os.path.join(again.path, "train"))) == 6


@needs_fuse
def test_foreground_daemon_exits_zero_on_sigterm_and_unmounts(tar_shards, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    daemon = subprocess.Popen([sys.executable, "-m", "shardfs", "mount", str(tar_shards), str(mnt), "-f"],
                              stderr=subprocess.PIPE, text=True)
    try:
        wait_mounted(mnt, daemon)
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=DEADLINE) == 0
        assert not os.path.ismount(mnt)
        assert "unmounted" in daemon.stderr.read()
    finally:
        if daemon.poll() is None:
            daemon.kill()
        force_unmount(str(mnt))


def test_a_libfuse_setting_naming_nothing_is_one_clear_line(tar_shards, tmp_path):
    """SHARDFS_LIBFUSE naming no file (test_libfuse.py: no libfuse3 on the node at all)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = {**os.environ, "SHARDFS_LIBFUSE": str(tmp_path / "no-such-libfuse3.so.3")}
    _one_line_error(shardfs_cmd("mount", str(tar_shards), str(mnt), env=env),
                    f"SHARDFS_LIBFUSE={tmp_path}/no-such-libfuse3.so.3 cannot be loaded", "unset it")
    assert not os.path.ismount(mnt)


@pytest.mark.skipif(os.getuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_missing_dev_fuse_is_one_clear_line(tar_shards, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    # A private mount namespace whose /dev is an empty tmpfs: no /dev/fuse, nothing else touched.
    script = f"mount -t tmpfs none /dev && exec {sys.executable} -m shardfs mount {tar_shards} {mnt}"
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=60)
    _one_line_error(done, "/dev/fuse does not exist")


@needs_fuse
def test_mount_gives_up_on_a_daemon_that_makes_no_progress(tar_shards, sample_tree, tmp_path, mount):
    # The index directory is on a FUSE mount whose daemon is stopped: the new daemon hangs
    # on its first index lookup there, as on a hung network filesystem.
    hung = mount(tar_shards, name="hung")
    fresh = tmp_path / "fresh"  # shards without an index beside them yet
    sample.pack_tar_round_robin(str(sample_tree), str(fresh), shards=2)
    os.kill(hung.pid, signal.SIGSTOP)
    try:
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        # The clock runs from the daemon's start: a busy machine may take longer than a short
        # --ready-timeout to start Python and report its first step. Then the last step is
        # "starting", also right, and the hang is tried again with twice the time, until the
        # daemon reported where it got stuck.
        for ready_timeout in (3, 6, 12, 24, 48):
            done = shardfs_cmd("mount", str(fresh), str(mnt), "--index-dir", f"{hung.path}/indexes",
                               "--ready-timeout", str(ready_timeout), "--log-file", str(tmp_path / "log"),
                               timeout=300)
            if os.path.ismount(mnt):
                force_unmount(str(mnt))
            assert done.returncode == 1, done
            assert f"no progress for {ready_timeout} s" in done.stderr and "stopped it" in done.stderr, done.stderr
            assert not os.path.ismount(mnt)
            pid = int(done.stderr.split("stopped it (pid ")[1].split(")")[0])
            wait_for(lambda: not process_alive(pid), f"the stopped daemon (pid {pid}) still runs")
            if "(last step: starting)" not in done.stderr:
                break
        assert "finding shards" in done.stderr or "indexed" in done.stderr, done.stderr
    finally:
        os.kill(hung.pid, signal.SIGCONT)


@needs_fuse
def test_umount_exits_nonzero_when_the_daemon_outlives_its_wait(tar_shards, mount):
    m = mount(tar_shards)
    name = next(p for p in sorted(os.listdir(f"{m.path}/train/n00000000")))
    reader = open(f"{m.path}/train/n00000000/{name}", "rb")  # a lazy unmount keeps the daemon for it
    try:
        done = shardfs_cmd("umount", "--lazy", "--wait", "1", m.path)
        assert done.returncode == 1, done
        assert f"daemon (pid {m.pid}) is still running" in done.stderr and "files are still open" in done.stderr
        assert not os.path.ismount(m.path) and process_alive(m.pid)
        assert reader.read(3) == b"\xff\xd8\xff"  # the open file is still served
    finally:
        reader.close()
    wait_for(lambda: not process_alive(m.pid), "the daemon outlived its last reader")  # it ends once they let go


def test_unknown_command_is_not_taken_for_a_mount(tmp_path):
    _one_line_error(shardfs_cmd("mout", "a", "b"), "unknown command 'mout' (did you mean mount?)")
    _one_line_error(shardfs_cmd("frobnicate"), "unknown command 'frobnicate'", "commands: mount")
    # The fstab shorthand "shardfs SRC MOUNTPOINT" (mount.fuse3) still reaches mount: its errors are mount's.
    _one_line_error(shardfs_cmd(str(tmp_path / "nope"), str(tmp_path)), "no such file or directory")


def test_a_folder_without_shards_at_its_top_is_searched_only_so_far(tmp_path, monkeypatch):
    """Dataset files are looked for SEARCH_DEPTH folders down and among SEARCH_ENTRIES names at most:
    a folder of loose images named by mistake is not walked to its end."""
    from shardfs.errors import UsageError
    from shardfs.view import sources

    deep = tmp_path / "deep"
    for depth in range(1, sources.SEARCH_DEPTH + 2):
        folder = deep.joinpath(*[f"d{i}" for i in range(depth)])
        folder.mkdir(parents=True)
        (folder / f"train-{depth}.parquet").write_bytes(b"PAR1")
    found = [os.path.relpath(p, deep) for p in sources.find_shards([str(deep)])]
    assert sorted(found) == sorted(os.path.join(*[f"d{i}" for i in range(depth)], f"train-{depth}.parquet")
                                   for depth in range(1, sources.SEARCH_DEPTH + 1))

    loose = tmp_path / "loose"
    for c in range(3):
        (loose / "train" / f"class{c}").mkdir(parents=True)
        for i in range(10):
            (loose / "train" / f"class{c}" / f"{i}.jpg").write_bytes(b"x")
    monkeypatch.setattr(sources, "SEARCH_ENTRIES", 20)
    with pytest.raises(UsageError, match="more than 20 entries below it were searched in vain"):
        sources.find_shards([str(loose)])


@needs_fuse
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_a_mount_refused_for_want_of_cap_sys_admin_says_so_without_a_traceback(tar_shards, tmp_path):
    """As root in a container started without SYS_ADMIN: the kernel refuses the mount."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    from benchlib.cli import REPO

    done = subprocess.run(["setpriv", "--inh-caps=-sys_admin", "--bounding-set=-sys_admin", sys.executable, "-m",
                           "shardfs", "mount", str(tar_shards), str(mnt), "--log-file", str(tmp_path / "log")],
                          capture_output=True, text=True, timeout=DEADLINE, env={**os.environ, "PYTHONPATH": REPO})
    try:
        assert done.returncode == 2, done
        assert "Traceback" not in done.stderr, done.stderr
        assert "lacks CAP_SYS_ADMIN" in done.stderr and "--cap-add SYS_ADMIN" in done.stderr, done.stderr
        assert not os.path.ismount(mnt)
    finally:
        force_unmount(str(mnt))
