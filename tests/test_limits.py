"""Resource limits: thousands of shards under a low open-files limit; shards larger than the budget."""

import json
import os
import resource
import subprocess
import sys

from conftest import force_unmount, needs_fuse
from tarcraft import archive, member

pytestmark = needs_fuse


def test_thousands_of_shards_with_a_low_soft_fd_limit(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    count = 2000
    for i in range(count):
        (src / f"s{i:05d}.tar").write_bytes(archive(member(f"d{i % 10}/f{i}.txt".encode(), f"{i}\n".encode())))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(256, soft)

    def lower_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))

    done = subprocess.run([sys.executable, "-m", "shardfs", "mount", str(src), str(mnt), "--log-file",
                           str(tmp_path / "log")], preexec_fn=lower_limit, capture_output=True, text=True,
                          timeout=600)
    try:
        assert done.returncode == 0, done.stderr
        for i in range(count):  # every shard opened: far more descriptors than the soft limit we started with
            with open(os.path.join(mnt, f"d{i % 10}", f"f{i}.txt")) as f:
                assert f.read() == f"{i}\n"
        pid = json.loads(os.getxattr(mnt, "user.shardfs.stats"))["pid"]
        assert len(os.listdir(f"/proc/{pid}/fd")) >= count
    finally:
        force_unmount(str(mnt))


def test_a_shard_larger_than_the_whole_budget_is_read_member_by_member(tmp_path, mount):
    src = tmp_path / "src"
    src.mkdir()
    files = {f"big/{i}.bin": os.urandom(300_000) for i in range(8)}
    (src / "big.tar").write_bytes(archive(*(member(n.encode(), d) for n, d in files.items())))
    m = mount(src, options=("--cache-size", "1M"))
    for name, data in files.items():
        assert open(os.path.join(m.path, name), "rb").read() == data
    cache = m.stats()["cache"]
    assert cache["used_bytes"] == 0 and cache["direct_reads"] >= 8 and cache["admitted"] == 0
