"""Many readers, a dataset larger than the budget, every byte checked (tools/stress.py)."""

import pytest
import stress  # tools/stress.py (tools/ is on pytest's pythonpath)

from conftest import needs_fuse

pytestmark = needs_fuse


def _check(result):
    assert result["read_errors"] == 0 and result["wrong_bytes"] == 0, result["error_lines"]
    assert result["daemon_read_errors"] == 0
    assert result["memory_ok"], result
    assert result["fds_ok"], result
    assert result["files_read"] > 0 and result["bytes_verified"] > 0


def test_short_stress(tmp_path):
    _check(stress.run(readers=4, seconds=12, files=300, shards=6, min_size=500, max_size=150_000,
                      cache_fraction=0.25, workdir=str(tmp_path), log=lambda *_: None))


@pytest.mark.slow
@pytest.mark.timeout(1200)  # 300 s of reading, plus making the dataset and checking it
def test_long_stress(tmp_path):
    result = stress.run(readers=8, seconds=300, files=4000, shards=16, min_size=1000, max_size=400_000,
                        cache_fraction=0.25, workdir=str(tmp_path), log=lambda *_: None)
    _check(result)
    # Throughput is the benchmark's question (tools/stress.py prints it); here only that no 10 s
    # window went without a file read: nothing stalled.
    windows = result["throughput_10s_windows_MBps"][: 300 // 10]  # those while the readers read
    assert len(windows) == 30 and min(windows) > 0, windows
