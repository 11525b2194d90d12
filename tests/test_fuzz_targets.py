"""Every fuzz target (tests/fuzz/targets/NAME.py, driven by tools/fuzz.py) as a regression test:
its seeds and every committed input of tests/fuzz/corpus/NAME/ (the findings of earlier runs among
them) go through ``one_input`` again, which raises on a crash or a wrong answer; and each target
has the parts the convention asks for (docs/testing.md)."""

from __future__ import annotations

import importlib
import sys
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
