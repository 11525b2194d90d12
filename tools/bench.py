#!/usr/bin/env python3
"""By-hand benchmark of shardfs against a plain directory, ratarmount, squashfuse_ll and the kernel's
squashfs, reading as training code reads (NOT a test).

Builds (or reuses, see --workdir and its marker.json) a synthetic ImageNet-like dataset of real
JPEGs (~110 KB each), packs it into tar shards (`shardfs pack`) and a squashfs image, then
measures every method in the same run. Round r mounts every method once (the order rotates each
round, so nobody always goes first); in each round, per method:

  sync + drop_caches, fresh mount (timed)                       -> mount time
  ImageFolder's listing (scandir of the root, sorted walk of each class), twice:
      on the fresh mount, then again on the warm mount          -> listing time fresh / warm
  random-order read of every file by --readers processes with the built-in open(path, 'rb') +
      read(), as torchvision's pil_loader reads: cold (the fresh mount), then warm
  the same warm read at the os level (os.open + os.readv): what the filesystem alone gives
  ImageFolder + DataLoader(num_workers=--readers, batch_size=64): pil_loader, RandomResizedCrop(224)
      + ToTensor                                                -> decode epoch images/s
  drop_caches on the same mount, open() read again (the kernel's caches gone, a daemon's own kept)
  peak RSS of the daemon; bytes read from storage in every pass (the daemon's /proc/PID/io; the
      readers' for plain; shardfs's own cache counter too); daemon CPU and FUSE requests

Every figure is the median of the rounds with its spread [min-max], and its ratio to `plain`; then
the targets of issue 13 with PASS/FAIL, on ratios measured in this run. The machine is used as it
comes: nothing is tuned unless asked (--free-page-reporting off), and then the output says so. On a
shared machine other jobs make figures noisy: a round waits for a quiet machine first
(--quiet-wait) and is redone (--retries) when others took more than --max-background of the CPU
or dropped the page cache during it. A chart of the read passes goes to --chart.

Run as root (drop_caches and the kernel squashfs mount need it):

    .venv/bin/python tools/bench.py --images 2000 --epochs 1        # quick look (~5 min)
    .venv/bin/python tools/bench.py --json /tmp/bench.json          # default size (~20k images, 2.2 GB; ~1 h)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import bench_dataset
from benchlib import chart, machine, tables
from benchlib.methods import Data, make_methods
from benchlib.mounts import Mounts
from benchlib.rounds import first_mounts, listing_pass, one_round, read_pass, rounds_used, run_rounds
from benchlib.tables import median

from shardfs.storage.memory import parse_size

LATER_EPOCH_ZERO = 0.02  # "~0" storage reads in later epochs: at most this fraction of the dataset
DEFAULT_METHODS = "plain,shardfs,shardfs-quarter,ratarmount,squashfuse_ll,squashfs-kernel"
READ_PASSES = [("cold", "cold open() files/s"), ("warm", "warm open() files/s"), ("warm_os", "warm os-level files/s"),
               ("dropped", "open() after drop_caches files/s")]
DECODE = "decode epoch images/s (ImageFolder + DataLoader)"
CHART_LABELS = {"cold open() files/s": "cold open()", "warm open() files/s": "warm open()",
                "warm os-level files/s": "warm os-level", "open() after drop_caches files/s": "open() after\ndrop_caches",
                DECODE: "decode epoch\n(images/s)"}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="/tmp/shardfs-bench", help="dataset, shards, mountpoints, logs")
    p.add_argument("--images", type=int, default=20_000)
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--side", default="auto", help="JPEG side in pixels (auto: tuned for ~110 KB)")
    p.add_argument("--shard-size", type=parse_size, default=parse_size("256M"))
    p.add_argument("--readers", type=int, default=2, help="reader processes and DataLoader workers")
    p.add_argument("--epochs", type=int, default=3, help="rounds per method (figures are medians)")
    p.add_argument("--methods", default=DEFAULT_METHODS)
    p.add_argument("--cache-size", default=None,
                   help="shardfs --cache-size for the `shardfs` method (default: the daemon's default)")
    p.add_argument("--prefetch", default=None, help="shardfs --prefetch (touched|all); default: daemon's")
    p.add_argument("--quiet-wait", type=float, default=60.0,
                   help="before each round wait up to this many s for other jobs' CPU use to drop below 15%% "
                        "(0: do not wait)")
    p.add_argument("--retries", type=int, default=1,
                   help="redo a method's round (up to this many times) when other processes took more than "
                        "--max-background of the CPU, or dropped the page cache, during one of its passes")
    p.add_argument("--max-background", type=float, default=0.25, help="see --retries (share, 0..1)")
    p.add_argument("--rebuild", action="store_true", help="remake the dataset even if the marker matches")
    p.add_argument("--json", help="also write everything as JSON here")
    p.add_argument("--chart", help="PNG chart of the read passes (default: beside --json, else in the workdir)")
    p.add_argument("--free-page-reporting", choices=["keep", "off"], default="keep",
                   help="keep (default): the machine as it comes; off: turn a VM's free page reporting off for "
                        "the run (root; restored at exit): figures are then labelled as not the machine as it comes")
    return p.parse_args()


def decode_pass(root: str, out: dict) -> dict:
    """One epoch as a training script runs it: ImageFolder (pil_loader) + transform + DataLoader."""
    import torch
    from torchvision import datasets, transforms

    ds = datasets.ImageFolder(root, transform=transforms.Compose([transforms.RandomResizedCrop(224),
                                                                  transforms.ToTensor()]))
    torch.manual_seed(out["round"])
    loader = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True, num_workers=out["readers"])
    t0, seen = time.perf_counter(), 0
    for images, _labels in loader:
        seen += len(images)
    secs = time.perf_counter() - t0
    return {"seconds": secs, "images": seen, "images_per_s": seen / secs}


def warm_up_decoder(root: str, workers: int) -> None:
    """One small untimed DataLoader run, so that the first timed decode epoch pays no start-up costs."""
    import torch
    from torchvision import datasets, transforms

    ds = datasets.ImageFolder(root, transform=transforms.Compose([transforms.RandomResizedCrop(224),
                                                                  transforms.ToTensor()]))
    subset = torch.utils.data.Subset(ds, list(range(0, len(ds), max(1, len(ds) // 256))))
    for _ in torch.utils.data.DataLoader(subset, batch_size=64, num_workers=workers):
        pass


PASSES = [("list_fresh", listing_pass), ("list_warm", listing_pass), ("cold", read_pass("open", 0)),
          ("warm", read_pass("open", 100)), ("warm_os", read_pass("os", 200)), ("decode", decode_pass),
          ("dropped", read_pass("open", 300, drop_first=True))]


def storage(rnd: dict, key: str, fuse: bool) -> float | None:
    """Bytes a pass read from storage: the daemon's reads for FUSE, the readers' for the rest."""
    p = rnd.get(key) or {}
    return p.get("daemon_read_bytes") if fuse else p.get("readers_read_bytes")


def per_file(rnd: dict, key: str, what: str) -> float | None:
    p = rnd[key]
    if what == "requests":
        ops = p.get("fuse_ops")
        return sum(ops.values()) / p["files"] if ops is not None else None
    return p["daemon_cpu_s"] * 1e6 / p["files"] if p.get("daemon_cpu_s") is not None else None


def figures(methods: dict, rounds: dict, first: dict, shard_bytes: int) -> list[tuple[str, str, dict, str | None]]:
    """The table's rows: (label, format, {method: [value per round]}, baseline); clean rounds only
    when a method has any."""
    used, used_row = rounds_used(rounds)

    def row(label, fmt, get, base="plain"):
        return label, fmt, {n: [get(r, methods[n]) for r in rs] for n, rs in used.items()}, base

    def x(v):
        return None if v is None else v / shard_bytes

    return [
        used_row,
        ("first mount s (builds its index)", "{:.2f}", {n: [first.get(n)] for n in used}, None),
        row("mount s (index exists, cold)", "{:.2f}", lambda r, m: r["mount_s"] if m.fuse else None, None),
        row("listing s, fresh mount", "{:.3f}", lambda r, m: r["list_fresh"]["seconds"]),
        row("listing s, warm mount", "{:.3f}", lambda r, m: r["list_warm"]["seconds"]),
        *(row(label, "{:,.0f}", lambda r, m, k=k: r[k]["files_per_s"]) for k, label in READ_PASSES),
        row(DECODE, "{:,.0f}", lambda r, m: r["decode"]["images_per_s"]),
        row("peak daemon RSS MB (VmHWM)", "{:.0f}", lambda r, m: (r.get("rss_peak") or 0) / 1e6 or None, None),
        row("FUSE requests per file (shardfs counters), warm open()", "{:.2f}",
            lambda r, m: per_file(r, "warm", "requests"), None),
        row("FUSE requests per file (shardfs counters), warm os-level", "{:.2f}",
            lambda r, m: per_file(r, "warm_os", "requests"), None),
        row("daemon CPU us per file, cold", "{:.0f}", lambda r, m: per_file(r, "cold", "cpu"), None),
        row("daemon CPU us per file, warm open()", "{:.0f}", lambda r, m: per_file(r, "warm", "cpu"), None),
        *(row(f"storage read in {k} (x shards)", "{:.3f}", lambda r, m, k=k: x(storage(r, k, m.fuse)), None)
          for k in ("cold", "warm", "decode", "dropped")),
        *(row(f"shardfs cache counter in {k} (x shards)", "{:.3f}",
              lambda r, m, k=k: x(r[k].get("cache_storage_bytes")), None) for k in ("cold", "dropped")),
        row("others' CPU share, worst pass %", "{:.0f}",
            lambda r, m: 100 * max((v.get("background_cpu") or 0) for k, v in r.items() if isinstance(v, dict)
                                   and k != "quiet_before"), None),
    ]


def evaluate_targets(summ: dict[str, dict[str, float]], storage_max: dict[str, dict]) -> list[dict]:
    """Issue 13's targets for `shardfs`, on ratios of medians measured in this run; and the storage
    targets (no more than the shards on the first epoch, ~0 after it; a quarter budget reads each byte once)."""
    s, plain, sq = summ.get("shardfs"), summ.get("plain", {}), summ.get("squashfuse_ll", {})
    if s is None:
        return []
    t = tables.target
    out = [
        t("cold 1st epoch open() files/s >= 0.9x plain", "shardfs", s["cold"], plain.get("cold"), ">= 0.9"),
        t("cold 1st epoch open() files/s >= 1.3x squashfuse_ll", "shardfs", s["cold"], sq.get("cold"), ">= 1.3"),
        t("warm open() files/s >= 0.5x plain", "shardfs", s["warm"], plain.get("warm"), ">= 0.5"),
        t("warm open() files/s >= 1.5x squashfuse_ll", "shardfs", s["warm"], sq.get("warm"), ">= 1.5"),
        t("warm os-level files/s >= 0.95x plain", "shardfs", s["warm_os"], plain.get("warm_os"), ">= 0.95"),
        t("decode epoch images/s >= 0.98x plain", "shardfs", s["decode"], plain.get("decode"), ">= 0.98"),
        t("listing, fresh mount: time <= 2x plain", "shardfs", s["list_fresh"], plain.get("list_fresh"), "<= 2"),
        t("listing, warm mount: time <= 1.2x plain", "shardfs", s["list_warm"], plain.get("list_warm"), "<= 1.2"),
    ]
    a = tables.absolute
    st = storage_max.get("shardfs", {})
    out += [a("storage 1st epoch <= 1.05x shards (worst round)", "shardfs", st.get("cold"), "<= 1.05", "x"),
            a("storage warm + decode ~0 (worst round)", "shardfs", st.get("later"), f"<= {LATER_EPOCH_ZERO}", "x"),
            a("storage after drop_caches ~0: the daemon's cache", "shardfs", st.get("dropped"),
              f"<= {LATER_EPOCH_ZERO}", "x")]
    if "shardfs-quarter" in storage_max:
        q = storage_max["shardfs-quarter"]
        out.append(a("storage per epoch <= 1.0x shards (quarter budget)", "shardfs-quarter",
                     max(v for v in q.values() if v is not None), "<= 1.0", "x"))
    return out


def storage_worst(methods: dict, rounds: dict, shard_bytes: int) -> dict:
    out = {}
    for n, rs in rounds.items():
        if rs and methods[n].fuse:
            w = {k: max(storage(r, k, True) or 0 for r in rs) / shard_bytes for k in ("cold", "warm", "decode",
                                                                                        "dropped")}
            out[n] = {"cold": w["cold"], "later": max(w["warm"], w["decode"]), "dropped": w["dropped"]}
    return out


def report(args, ctx: dict, methods: dict, res: dict, first: dict) -> dict:
    rounds = {n: rs for n, rs in res["rounds"].items() if rs}
    names = list(rounds)
    shard_bytes = ctx["marker"]["shards"]["tar_bytes"]
    rows = figures(methods, rounds, first, shard_bytes)
    summ = {n: {k: median(rows_of(rows, label, n)) for k, label in KEYS.items()} for n in names}
    targets = evaluate_targets(summ, storage_worst(methods, rounds, shard_bytes))
    cold = all(r["cold_ok"] and r.get("dropped_ok", True) for rs in rounds.values() for r in rs)
    print(f"\n## Results ({ctx['tuning']})\n\ncommand: `{ctx['command']}`  \nmachine: {machine.describe(ctx['facts'])}"
          f"  \nreaders={args.readers}; cold figures really cold: "
          + ("yes (sync + drop_caches before every fresh mount)" if cold else "NO: drop_caches failed (not root?)")
          + "; cells: median [min-max] of rounds, then the ratio to plain\n")
    tables.print_table(names, rows)
    tables.print_targets(targets, f"target (issue 13; {args.readers} readers, {ctx['facts']['nproc']} cores)")
    for n, why in {**ctx["skipped"], **res["failed"]}.items():
        print(f"note: {n}: {why}")
    passes = [(CHART_LABELS[label], values) for label, _, values, _ in rows if label in CHART_LABELS]
    print("chart: " + chart.draw(ctx["chart"], f"{ctx['command']}\n{ctx['tuning']}", passes, names), flush=True)
    return {"summary": summ, "targets": targets, "table": rows}


KEYS = {"cold": "cold open() files/s", "warm": "warm open() files/s", "warm_os": "warm os-level files/s",
        "dropped": "open() after drop_caches files/s", "decode": DECODE,
        "list_fresh": "listing s, fresh mount", "list_warm": "listing s, warm mount"}


def rows_of(rows, label: str, name: str) -> list:
    return next(values.get(name, []) for lab, _, values, _ in rows if lab == label)


def setup(args) -> dict:
    """The workdir, the machine's facts, any tuning asked for, the dataset."""
    work = os.path.abspath(args.workdir)
    os.makedirs(os.path.join(work, "logs"), exist_ok=True)
    ctx = {"work": work, "command": "python3 " + " ".join([os.path.relpath(sys.argv[0]), *sys.argv[1:]]),
           "facts": machine.facts(work), "code": machine.code_state(),
           "chart": args.chart or (os.path.splitext(args.json)[0] + ".png" if args.json
                                   else os.path.join(work, "bench.png")),
           "tuning": "machine as it comes"}
    print(f"command: {ctx['command']}\nmachine: {machine.describe(ctx['facts'])}\nshardfs code: {ctx['code']}")
    if args.free_page_reporting == "off":
        print(machine.free_page_reporting_off())
        ctx["tuning"] = "NOT the machine as it comes: free page reporting OFF for this run"
    ctx["marker"] = m = bench_dataset.build(args, work)
    print(f"dataset: {m['src']['files']} JPEGs in {args.classes} classes, mean {m['src']['mean_jpeg_bytes'] / 1e3:.1f} KB;"
          f" {len(m['shards']['paths'])} tar shards {m['shards']['tar_bytes'] / 1e9:.3f} GB ({m['shards']['packer']}); "
          + (f"squashfs {m['squashfs']['bytes'] / 1e9:.3f} GB" if m.get("squashfs") else "no squashfs image"))
    return ctx


def main() -> int:
    args = parse_args()
    ctx = setup(args)
    m = ctx["marker"]
    data = Data(plain=os.path.join(ctx["work"], "src"), shard_dir=os.path.join(ctx["work"], "shards"),
                work=ctx["work"], squashfs=(m.get("squashfs") or {}).get("path"))
    shardfs_opts = [*(["--cache-size", args.cache_size] if args.cache_size else []),
                    *(["--prefetch", args.prefetch] if args.prefetch else [])]
    quarter = f"{max(1, m['shards']['tar_bytes'] // 4 >> 20)}M"
    methods, ctx["skipped"] = make_methods(
        [n.strip() for n in args.methods.split(",") if n.strip()], data,
        {"shardfs": shardfs_opts, "shardfs-quarter": [*shardfs_opts, "--cache-size", quarter]})
    for name, why in ctx["skipped"].items():
        print(f"{name}: skipped: {why}")
    with Mounts() as mounts:
        first = first_mounts(methods, mounts, ctx["skipped"])
        warm_up_decoder(os.path.join(data.plain, "train"), args.readers)
        started = time.perf_counter()
        res = run_rounds(methods, args.epochs,
                         lambda meth, r: one_round(meth, mounts, PASSES, r, args.readers, args.quiet_wait,
                                                   m["src"]["files"]),
                         args.retries, args.max_background)
    print(f"\nrounds done in {(time.perf_counter() - started) / 60:.1f} min")
    if machine.code_state()["digest"] != ctx["code"]["digest"]:
        print("WARNING: shardfs/ changed during the run: later mounts ran newer code than earlier ones")
    out = report(args, ctx, methods, res, first)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**ctx, **out, "params": vars(args), **res}, f, indent=1, default=str)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
