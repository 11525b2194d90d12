"""Who may read a mount: allow_other, modes from the shards enforced by the kernel, no write path."""

import os
import shutil
import subprocess
import tempfile

import pytest

from conftest import force_unmount, needs_fuse, shardfs_cmd
from tarcraft import archive, member

pytestmark = [needs_fuse, pytest.mark.skipif(os.getuid() != 0 or shutil.which("runuser") is None,
                                             reason="needs root and runuser")]


def _as_nobody(*cmd):
    return subprocess.run(["runuser", "-u", "nobody", "--", *cmd], capture_output=True, text=True, timeout=60)


@pytest.fixture
def public_mountpoint():
    """A mountpoint other users can reach (pytest's own tmp dirs are 0700)."""
    top = tempfile.mkdtemp(prefix="shardfs-access-")
    os.chmod(top, 0o755)
    os.mkdir(os.path.join(top, "mnt"))
    try:
        yield os.path.join(top, "mnt")
    finally:
        force_unmount(os.path.join(top, "mnt"))
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def moded_shards(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.tar").write_bytes(archive(
        member(b"public/readme.txt", b"everyone\n", mode=0o644),
        member(b"private", typeflag=b"5", mode=0o700),
        member(b"private/secret.txt", b"owner only\n", mode=0o644),
        member(b"public/mine.txt", b"owner only too\n", mode=0o600),
    ))
    return src


def test_allow_other_lets_users_read_what_the_modes_allow(moded_shards, public_mountpoint):
    assert shardfs_cmd("mount", str(moded_shards), public_mountpoint, "-o", "allow_other").returncode == 0
    readme = _as_nobody("cat", os.path.join(public_mountpoint, "public", "readme.txt"))
    assert readme.returncode == 0 and readme.stdout == "everyone\n"
    for path in ("private/secret.txt", "public/mine.txt"):  # mode 0600 file, file in a 0700 directory
        denied = _as_nobody("cat", os.path.join(public_mountpoint, path))
        assert denied.returncode != 0 and "Permission denied" in denied.stderr
    assert open(os.path.join(public_mountpoint, "public", "mine.txt")).read() == "owner only too\n"  # root
    for cmd in (["touch", "public/new"], ["rm", "public/readme.txt"], ["mv", "public/readme.txt", "x"],
                ["chmod", "777", "public/readme.txt"], ["mkdir", "public/d"]):
        done = _as_nobody("sh", "-c", f"cd {public_mountpoint} && {' '.join(cmd)}")
        assert done.returncode != 0 and "Read-only file system" in done.stderr, (cmd, done.stderr)  # EROFS first


def test_without_allow_other_other_users_cannot_read(moded_shards, public_mountpoint):
    assert shardfs_cmd("mount", str(moded_shards), public_mountpoint).returncode == 0
    denied = _as_nobody("cat", os.path.join(public_mountpoint, "public", "readme.txt"))
    assert denied.returncode != 0 and "Permission denied" in denied.stderr
    assert sorted(os.listdir(public_mountpoint)) == ["private", "public"]  # the owner still can
