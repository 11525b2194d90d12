"""Rounds of passes over every method: fresh mount per round, rotating order, disturbed rounds redone.

A pass is ``(name, fn)``; ``fn(root, round_out)`` does the work and returns its figures (it may
read what earlier passes of the round left in ``round_out``, e.g. the listing's paths). Around
each pass a ``Meter`` records what it cost besides time: the daemon's CPU and storage reads, FUSE
requests, shardfs's own storage counter, and what other processes did meanwhile.
"""

from __future__ import annotations

import os
import random
import sys
import time

from .caches import cached_bytes, drop_caches
from .machine import Others, proc_status, wait_quiet
from .methods import Method
from .mounts import Mounted, Mounts
from .readers import read_all, timed_listing


class Meter:
    def __init__(self, m: Mounted | None):
        self.m = m
        self.before = self._now()
        self.others = Others(m.pid if m else None)

    def _now(self) -> dict:
        if not (self.m and self.m.pid):
            return {}
        st = self.m.stats() or {}
        proc = proc_status(self.m.pid)
        return {"daemon_cpu_s": proc.get("cpu_s"), "daemon_read_bytes": proc.get("read_bytes"),
                "cache_storage_bytes": (st.get("cache") or {}).get("storage_bytes_read"),
                "fuse_ops": st.get("fuse_ops")}

    def done(self) -> dict:
        now, out = self._now(), self.others.done()
        for key, v in now.items():
            b = self.before.get(key)
            if key == "fuse_ops" and v is not None and b is not None:
                out[key] = {k: n - b.get(k, 0) for k, n in v.items() if n != b.get(k, 0)}
            elif v is not None and b is not None:
                out[key] = v - b
        return out


def listing_pass(root: str, out: dict) -> dict:
    paths, secs = timed_listing(root)
    out.setdefault("paths", paths)
    return {"seconds": secs, "files": len(paths)}


def sample_paths(paths: list[str], n: int, seed: int) -> list[str]:
    """``n`` of the listed paths chosen at random by ``seed`` (every path when ``n`` is 0 or more
    than there are). Every method lists the same tree in the same sorted order, so the same seed
    picks the same files through every method."""
    if not n or n >= len(paths):
        return list(paths)
    return [paths[i] for i in sorted(random.Random(seed).sample(range(len(paths)), n))]


def read_pass(how: str, seed: int, drop_first: bool = False, sample: int = 0, sample_seed: int = 0,
              budget_s: float | None = None):
    """A random-order read by the round's readers (``how``: open or os) of the round's read set:
    every listed file, or a fixed sample of ``sample`` of them (``sample_paths``), the same for
    every pass of the round. ``drop_first``: drop the kernel's caches before it (the daemon's own
    cache stays). ``budget_s``: the readers stop after that many seconds, and the files read until
    then become the round's read set, so that later passes read only files read before (warm stays
    warm); the pass records ``budget_hit``."""
    def run(root: str, out: dict) -> dict:
        if drop_first:
            out["dropped_ok"] = drop_caches()
        todo = out.get("read_set")
        if todo is None:
            todo = out["read_set"] = sample_paths(out["paths"], sample, sample_seed)
        res = read_all(todo, out["readers"], how, seed=seed + out["round"], budget_s=budget_s)
        if res["errors"] or (res["files"] != len(todo) and not res["budget_hit"]):
            raise RuntimeError(f"{res['errors']} read errors, {res['files']}/{len(todo)} files; "
                               f"first: {res['first_error']}")
        if res["budget_hit"]:
            out["read_set"] = res.pop("read")
        res["of"] = len(todo)
        return res
    return run


def one_round(method: Method, mounts: Mounts, passes, r: int, readers: int, quiet_wait: float,
              expect_files: int) -> dict:
    """Drop the caches, mount fresh (timed), run the passes, unmount."""
    out: dict = {"round": r, "readers": readers, "quiet_before": wait_quiet(quiet_wait)}
    out["cold_ok"] = drop_caches()
    out["cached_after_drop"] = cached_bytes()
    t0 = time.perf_counter()
    m = method.mount(mounts)
    out["mount_s"] = time.perf_counter() - t0
    try:
        root = method.root(m)
        for name, fn in passes:
            meter = Meter(m)
            res = fn(root, out)
            res.update(meter.done())
            out[name] = res
            if name.startswith("list") and res["files"] != expect_files:
                raise RuntimeError(f"the listing found {res['files']} files, expected {expect_files}")
        if m and m.pid:
            out["rss_peak"] = proc_status(m.pid).get("VmHWM")
            out["daemon_stats"] = m.stats()
    finally:
        if m:
            mounts.unmount(m)
    out.pop("paths", None)
    out.pop("read_set", None)
    return out


def disturbed(rnd: dict, max_background: float) -> bool:
    """Other jobs took much CPU, or dropped the page cache, during one of the round's passes."""
    return any(isinstance(v, dict) and ((v.get("background_cpu") or 0) > max_background or v.get("foreign_drops"))
               for k, v in rnd.items() if k != "quiet_before")


def first_mounts(methods: dict[str, Method], mounts: Mounts, skipped: dict) -> dict[str, float]:
    """Each FUSE method mounted once with its indexes removed: what a first mount costs. A method
    that cannot mount leaves the run (noted in ``skipped``)."""
    first = {}
    for name, meth in list(methods.items()):
        if not meth.fuse:
            continue
        meth.forget_indexes()
        drop_caches()
        t0 = time.perf_counter()
        try:
            m = meth.mount(mounts)
        except Exception as exc:  # noqa: BLE001  reported, and the others still run
            skipped[name] = f"first mount failed: {str(exc).strip()[-300:]}"
            del methods[name]
            continue
        first[name] = time.perf_counter() - t0
        mounts.unmount(m)
        print(f"{name}: first mount (builds its index) {first[name]:.2f} s", flush=True)
    return first


def run_rounds(methods: dict[str, Method], rounds: int, round_fn, retries: int, max_background: float) -> dict:
    """``rounds`` rounds of every method (order rotated each round, so nobody always goes first);
    a round that others disturbed is redone up to ``retries`` times. Ctrl-C ends early with what
    was measured. Returns {"rounds": {method: [round, ...]}, "discarded": ..., "failed": ...}."""
    res: dict = {"rounds": {n: [] for n in methods}, "discarded": {}, "failed": {}}
    live = dict(methods)
    try:
        for r in range(rounds):
            order = list(live)
            for name in order[r % len(order):] + order[:r % len(order)]:
                t0, errors, got = time.perf_counter(), [], None
                for attempt in range(retries + 1):
                    try:
                        got = round_fn(live[name], r)
                    except Exception as exc:  # noqa: BLE001  e.g. another job unmounted ours: try again
                        errors.append(f"{type(exc).__name__}: {str(exc).strip()[-300:]}")
                        print(f"round {r + 1}/{rounds} {name}: attempt {attempt + 1} failed: {errors[-1]}", flush=True)
                        got = None
                        continue
                    got["attempt"], got["disturbed"] = attempt, disturbed(got, max_background)
                    if not got["disturbed"] or attempt == retries:
                        break
                    res["discarded"].setdefault(name, []).append(got)
                    print(f"round {r + 1}/{rounds} {name}: other processes disturbed it; redoing it", flush=True)
                if got is None:
                    res["failed"][name] = f"round {r + 1} failed {len(errors)} times: {'; '.join(errors)}"
                    print(f"{name}: {res['failed'][name]}; dropping it from the run", flush=True)
                    live.pop(name)
                    continue
                res["rounds"][name].append(got)
                print(f"round {r + 1}/{rounds} {name:<16} " + brief(got) + f" ({time.perf_counter() - t0:.0f} s)",
                      flush=True)
    except KeyboardInterrupt:
        print("interrupted: reporting what was measured", flush=True)
    return res


def until_interrupted(count: int, round_fn) -> list:
    """``round_fn(r)`` for each of ``count`` rounds, a line before each; a Ctrl-C or SIGTERM, or a
    round that fails, ends them early and the rounds measured so far are returned (for a report of
    what there is)."""
    rounds = []
    try:
        for r in range(count):
            print(f"round {r + 1}/{count} (load {os.getloadavg()[0]:.1f})", flush=True)
            rounds.append(round_fn(r))
    except KeyboardInterrupt:
        print("interrupted: reporting the rounds measured", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - a failed round must not take the finished ones with it
        print(f"round {len(rounds) + 1} failed: {exc!r}; reporting the rounds measured", file=sys.stderr)
    return rounds


def rounds_used(rounds: dict[str, list[dict]]) -> tuple[dict, tuple]:
    """The rounds figures are made of: each method's undisturbed ones, all of them when none is;
    and a table row saying which (see tables.print_table)."""
    clean = {n: [r for r in rs if not r["disturbed"]] for n, rs in rounds.items() if rs}
    used = {n: clean[n] or rounds[n] for n in clean}
    row = ("rounds the medians use", "{}", {n: [f"{len(clean[n])} clean of {len(rounds[n])}" if clean[n]
                                                else f"all {len(rounds[n])}, NOISY"] for n in clean}, None)
    return used, row


def brief(rnd: dict) -> str:
    """One line per round: seconds of timed passes and files/s of read passes."""
    parts = [f"mount {rnd['mount_s']:.2f} s"]
    for k, v in rnd.items():
        if isinstance(v, dict) and "seconds" in v:
            parts.append(f"{k} {v['files_per_s']:,.0f} f/s" if "files_per_s" in v
                         else f"{k} {v.get('images_per_s', 0):,.0f} img/s" if "images_per_s" in v
                         else f"{k} {v['seconds']:.2f} s")
    return ", ".join(parts)
