"""Metrics where admins look: `shardfs stats --format prometheus`, the daemon's node_exporter
textfile, scraped by a real prometheus-node-exporter; and `shardfs stats --watch`."""

from __future__ import annotations

import os
import pty
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import DEADLINE, needs_fuse, read_within, shardfs_cmd, wait_for
from shardfs.service.config import MountConfig, apply_options, parse_config
from shardfs.errors import UsageError
from shardfs.service import watch
from shardfs.service.metrics import textfile_name

pytestmark = needs_fuse
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")


def samples(text: str, prefix: str = "shardfs_") -> dict:
    """{(name, op label or None): (value, labels)} of the shardfs samples in exposition text."""
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith(prefix):
                found[(s.name, s.labels.get("op") or s.labels.get("state"))] = (s.value, s.labels)
    return found


def read_everything(root: str) -> int:
    count = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb", buffering=0) as f:
                f.read()
            count += 1
    return count


def expected_values(figures: dict) -> dict:
    """What the exposition must say for the figures `stats --json` printed."""
    cache = figures["cache"]
    return {
        ("shardfs_cache_bytes", None): cache["used_bytes"],
        ("shardfs_cache_budget_bytes", None): cache["budget_bytes"],
        ("shardfs_storage_read_bytes_total", None): cache["storage_bytes_read"],
        ("shardfs_cache_hits_total", None): cache["hits"],
        ("shardfs_cache_misses_total", None): cache["misses"],
        ("shardfs_served_bytes_total", None): figures["bytes_served"],
        ("shardfs_files", None): figures["files"],
        ("shardfs_ready_seconds", None): figures["ready_seconds"],
        ("shardfs_view_mapped", None): figures["view_mapped"],
        ("shardfs_shards", None): figures["shards"],
        ("shardfs_cache_shards", "cached"): cache["shards_cached"],
        ("shardfs_fuse_requests_total", "read"): figures["fuse_ops"]["read"],
    }


def test_stats_prometheus_shows_the_json_figures(tar_shards, mount):
    m = mount(tar_shards)
    assert read_everything(m.path) == 72
    figures = m.stats()
    text = shardfs_cmd("stats", m.path, "--format", "prometheus", check=True).stdout
    assert "# TYPE shardfs_storage_read_bytes_total counter" in text
    assert "# HELP shardfs_cache_bytes " in text and "# TYPE shardfs_cache_bytes gauge" in text
    got = samples(text)
    for key, value in expected_values(figures).items():
        assert got[key][0] == value, key
    assert figures["fuse_ops"]["read"] >= 72 and figures["cache"]["storage_bytes_read"] > 0
    labels = got[("shardfs_fuse_requests_total", "read")][1]
    assert labels == {"mountpoint": m.path, "source": str(tar_shards), "op": "read"}
    assert "shardfs_remote_requests_total" not in text  # no remote shards: no remote counters


def test_metrics_dir_option_in_every_front_door(tmp_path):
    cfg = MountConfig(sources=["s"], mountpoint="m")
    apply_options(cfg, f"metrics_dir={tmp_path},metrics_interval=2.5")
    assert (cfg.metrics_dir, cfg.metrics_interval) == (str(tmp_path), 2.5)
    assert parse_config({"sources": ["s"], "mountpoint": "m", "metrics_dir": str(tmp_path)}).metrics_dir == str(tmp_path)
    with pytest.raises(UsageError, match="metrics_dir: .* is not a directory"):
        parse_config({"sources": ["s"], "mountpoint": "m", "metrics_dir": str(tmp_path / "nope")})
    with pytest.raises(UsageError, match="metrics_interval"):
        parse_config({"sources": ["s"], "mountpoint": "m", "metrics_interval": 0})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def node_exporter(tmp_path):
    """A real prometheus-node-exporter on loopback, exporting a private textfile directory."""
    if NODE_EXPORTER is None:
        pytest.skip("prometheus-node-exporter is missing (apt-get install prometheus-node-exporter)")
    textdir = tmp_path / "textfile"
    textdir.mkdir()
    port = _free_port()
    proc = subprocess.Popen([NODE_EXPORTER, "--collector.disable-defaults", "--collector.textfile",
                             f"--collector.textfile.directory={textdir}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/metrics"

    def scrape() -> str:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.read().decode()

    def answers() -> bool:
        try:
            scrape()
        except OSError:
            assert proc.poll() is None, proc.stderr.read().decode()
            return False
        return True

    wait_for(answers, f"node_exporter does not answer at {url}")
    try:
        yield textdir, scrape
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_node_exporter_scrapes_the_metrics_of_a_live_mount(tar_shards, mount, node_exporter):
    textdir, scrape = node_exporter
    m = mount(tar_shards, options=("--metrics-dir", str(textdir), "--metrics-interval", "0.3"))
    prom_file = textdir / textfile_name(m.path)
    assert prom_file.exists()  # written at mount, before the first period
    assert read_everything(m.path) == 72
    figures = m.stats()  # reads are done: the counters compared below do not move any more
    got = {}

    def exported() -> bool:  # the daemon rewrites its file every 0.3 s: until one has these reads
        got.update(samples(scrape()))
        return got.get(("shardfs_fuse_requests_total", "read"), (None,))[0] == figures["fuse_ops"]["read"]

    wait_for(exported, lambda: (figures["fuse_ops"], {k: v for k, v in got.items() if "fuse" in k[0]}))
    for key, value in expected_values(figures).items():
        assert got[key][0] == value, key
    assert got[("shardfs_storage_read_bytes_total", None)][1] == {"mountpoint": m.path, "source": str(tar_shards)}
    assert [p.name for p in textdir.iterdir()] == [prom_file.name]  # no temporary files left over
    assert shardfs_cmd("umount", m.path).returncode == 0
    assert not prom_file.exists()  # removed at unmount: no file claims a mount that is gone
    assert not samples(scrape())


def test_stats_watch_for_a_bounded_count(tar_shards, mount):
    """Frames of a mount without traffic: the daemon's totals, and rates of nothing ("-" before
    there is a previous frame, then 0)."""
    m = mount(tar_shards)
    assert read_everything(m.path) == 72
    figures = m.stats()  # reads are done: hits, misses and bytes served do not move any more
    cache = figures["cache"]
    done = shardfs_cmd("stats", m.path, "--watch", "--interval", "0.3", "--count", "3", check=True)
    frames = done.stdout.strip().split("\n\n")
    assert len(frames) == 3
    for i, frame in enumerate(frames):
        lines = frame.splitlines()
        assert lines[0].startswith(f"shardfs {m.path}  pid {m.pid}")
        assert [line.split()[0] for line in lines[1:]] == ["cache", "hit", "storage", "requests", "served"]
        assert f"overall ({cache['hits']} hits, {cache['misses']} misses, {cache['direct_reads']} direct)" in lines[2]
        assert lines[2].startswith("hit rate  - now")  # no reads in the last interval
        served = f"{figures['bytes_served'] / 1e6:.1f} MB in total; 0 read errors, 0 broken shards"
        assert lines[5] == f"served    {'-' if i == 0 else '0.0 MB/s'} now, {served}"
    assert "\x1b[" not in done.stdout  # no screen control codes into a pipe


def test_watch_rates_are_over_the_last_interval():
    before = {"cache": {"hits": 10, "misses": 10, "storage_bytes_read": 1_000_000}, "bytes_served": 0,
              "fuse_ops": {"read": 100, "lookup": 50}}
    now = {"cache": {"hits": 40, "misses": 20, "storage_bytes_read": 3_000_000, "used_bytes": 1 << 29,
                     "budget_bytes": 1 << 30, "shards_cached": 2}, "bytes_served": 4_000_000,
           "fuse_ops": {"read": 500, "lookup": 70}, "shards": 4, "pid": 7, "uptime_s": 3725}
    lines = watch.view("/mnt", now, before, seconds=2.0).splitlines()
    assert lines[0].startswith("shardfs /mnt  pid 7, up 1h02m05s")
    assert lines[1] == "cache     0.50 / 1.00 GiB (50.0%); shards 2 cached, 0 loading, 0 evicted (of 4)"
    assert lines[2] == "hit rate  75.0% now, 66.7% overall (40 hits, 20 misses, 0 direct)"
    assert lines[3] == "storage   1.0 MB/s now, 3.0 MB read"
    assert lines[4] == "requests  210/s now (200 reads/s), 570 in total"
    assert lines[5] == "served    2.0 MB/s now, 4.0 MB in total; 0 read errors, 0 broken shards"


def reaped(pid: int) -> tuple[int] | None:
    """(its wait status) once the child ``pid`` has exited and is reaped here, else None."""
    done, status = os.waitpid(pid, os.WNOHANG)
    return (status,) if done else None


def test_stats_watch_on_a_terminal_until_ctrl_c(tar_shards, mount):
    m = mount(tar_shards)
    pid, fd = pty.fork()
    if pid == 0:  # the child: shardfs on the pty, as an admin runs it
        # Ctrl-C as on a login terminal, whatever this suite inherited: started with SIGINT
        # ignored (`pytest &` in a script, nohup, some batch systems), the exec would keep it so.
        try:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execv(sys.executable, [sys.executable, "-m", "shardfs", "stats", m.path, "--watch", "--interval", "0.2"])
        finally:
            os._exit(127)  # (never back into the suite's code in a forked copy of it)
    output, status, ends = b"", None, time.monotonic() + DEADLINE
    try:
        while output.count(b"requests") < 3:
            chunk = read_within(fd, ends, lambda: f"three refreshes of --watch (so far: {output[-500:]!r})")
            assert chunk, f"--watch ended before three refreshes: {output[-500:]!r}"
            output += chunk
        os.kill(pid, signal.SIGINT)
        status = wait_for(lambda: reaped(pid), "`shardfs stats --watch` to exit on Ctrl-C")[0]
    finally:
        if status is None:  # not reaped yet: the test failed before Ctrl-C, or it did not end on it
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0
    assert output.count(b"\x1b[H\x1b[2J") >= 3  # each refresh redraws the screen
    assert b"hit rate" in output and b"MB/s now" in output
