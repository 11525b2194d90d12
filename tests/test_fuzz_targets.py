"""Every fuzz target (tests/fuzz/targets/NAME.py, driven by tools/fuzz.py) as a regression test:
its seeds and every committed input of tests/fuzz/corpus/NAME/ (the findings of earlier runs among
them) go through ``one_input`` again, which raises on a crash or a wrong answer; and each target
has the parts the convention asks for (docs/testing.md)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

FUZZ = Path(__file__).parent / "fuzz"
TARGETS = sorted(p.stem for p in (FUZZ / "targets").glob("*.py") if not p.name.startswith("_"))
SEED_LIMIT = 64 << 10

@pytest.fixture(scope="module", autouse=True)
def importable():
    added = [str(FUZZ), str(FUZZ / "targets")]
    sys.path[:0] = added
    yield
    for path in added:
        sys.path.remove(path)


def _target(name: str):
    return importlib.import_module(name)


def test_there_are_targets():
    assert {"tar_scan", "lz4_shard", "index_file", "peer_reply", "config_file", "saved_view"} <= set(TARGETS)


@pytest.mark.parametrize("name", TARGETS)
def test_a_target_has_the_three_parts(name):
    target = _target(name)
    assert (target.__doc__ or "").strip(), f"{name}: a docstring saying what it drives and checks"
    assert callable(getattr(target, "one_input", None)), f"{name}: one_input(data)"
    assert callable(getattr(target, "seeds", None)), f"{name}: seeds()"


@pytest.mark.parametrize("name", TARGETS)
def test_seeds_and_corpus_replay(name):
    target = _target(name)
    seeds = target.seeds()
    assert seeds and all(isinstance(s, bytes) and len(s) < SEED_LIMIT for s in seeds), name
    for i, seed in enumerate(seeds):
        try:
            target.one_input(seed)
        except Exception as exc:
            raise AssertionError(f"{name}: seed {i} fails: {exc!r}") from exc
    corpus = FUZZ / "corpus" / name
    for path in sorted(corpus.iterdir()) if corpus.is_dir() else []:
        try:
            target.one_input(path.read_bytes())
        except Exception as exc:
            raise AssertionError(f"{name}: corpus file {path.name} fails: {exc!r}") from exc


@pytest.mark.parametrize("name", TARGETS)
def test_a_target_leaves_memory_tracing_on(name, monkeypatch):
    """A fuzzing process keeps tracemalloc on (fuzzlib.bounded): each stop and start again leaks
    ~5-8 KB in CPython 3.11, which ended tar_scan's campaign pieces at their 2 GB bound (its scan
    check started and stopped tracing for every input)."""
    target = _target(name)
    stops = []
    monkeypatch.setattr(tracemalloc, "stop", lambda: stops.append(1))
    was = tracemalloc.is_tracing()
    tracemalloc.start()
    try:
        target.one_input(target.seeds()[0])
    finally:
        monkeypatch.undo()
        if not was:
            tracemalloc.stop()
    assert not stops, f"{name}: one input stopped tracemalloc {len(stops)} times"


GROWTH = """
import importlib, sys
sys.path[:0] = sys.argv[2:]
target = importlib.import_module(sys.argv[1])
inputs = target.seeds()
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
def replay(n):
    for i in range(n):
        target.one_input(inputs[i % len(inputs)])
replay(300)
before = rss()
replay(3000)
print((rss() - before) / 3000)
"""


def test_tar_scan_keeps_nothing_per_input():
    """Its seeds replayed 3,000 times in one process: the process does not grow (it grew ~5 KB an
    input while the scan check started and stopped tracemalloc for each)."""
    done = subprocess.run([sys.executable, "-c", GROWTH, "tar_scan", str(FUZZ), str(FUZZ / "targets"),
                           str(FUZZ.parent)], capture_output=True, text=True, timeout=240, cwd=FUZZ.parent.parent)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) < 1024, f"{float(done.stdout):.0f} bytes kept per input"
