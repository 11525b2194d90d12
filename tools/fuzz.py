"""Coverage-guided fuzzing of shardfs's parsers of outside bytes (atheris: libFuzzer for Python).

    python tools/fuzz.py tar_scan --seconds 60        # one target for a minute
    python tools/fuzz.py --all --seconds 15           # every target in turn (CI)
    python tools/fuzz.py --all --seconds 3600         # a campaign: one CPU-hour per target
    python tools/fuzz.py tar_scan --reproduce FILE    # one input again (a finding)
    python tools/fuzz.py --list

A target is ``tests/fuzz/targets/NAME.py`` (docstring, ``one_input(data)``, ``seeds()``; see
docs/testing.md). Each runs in a process of its own, with the shardfs modules it imports
instrumented for coverage (atheris.instrument_imports: Python code only; the compiled tar scanner
is reached by differential targets, which compare it with the Python path and tarfile). Its
corpus starts from ``seeds()`` and ``tests/fuzz/corpus/NAME/``; what it adds goes to a working
directory (``--corpus-dir``, else a temporary one). Bounds: ``--rss-mb`` (libFuzzer's
-rss_limit_mb; -malloc_limit_mb too, which only acts under a sanitizer's allocator, so targets
also check their own allocations with tracemalloc), ``--timeout`` per input (a hang is a finding).
A finding (an exception other than a clean refusal, a wrong answer, a hang, an out-of-memory) is
saved in ``--findings DIR/NAME/`` and the exit status is non-zero. For each target it prints
executions, coverage (libFuzzer's "cov", edges reached, and "ft", features) and the outcome.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ROOT / "tests" / "fuzz" / "targets"
CORPUS = ROOT / "tests" / "fuzz" / "corpus"
# Where targets find their helpers: the tests' own modules (tarcraft, ...) and tests/fuzz/fuzzlib.py.
IMPORT_PATHS = [ROOT, ROOT / "tests", ROOT / "tests" / "fuzz", TARGETS]
MAX_LEN = 64 << 10  # seeds are well under this; mutations may grow up to it


def target_names() -> list[str]:
    return sorted(p.stem for p in TARGETS.glob("*.py") if not p.name.startswith("_"))


@dataclass
class Outcome:
    name: str
    status: int
    seconds: float
    executions: int | None = None
    per_second: int | None = None
    coverage: int | None = None
    features: int | None = None
    corpus: int | None = None
    peak_rss_mb: int | None = None
    finding: str | None = None

    @property
    def interrupted(self) -> bool:
        """Stopped from outside (a campaign paused for a benchmark): its corpus kept, nothing found."""
        return self.status in INTERRUPTED and self.finding is None

    def line(self) -> str:
        figure = lambda v: "-" if v is None else f"{v:,}"  # noqa: E731
        if self.interrupted:
            what = "stopped (SIGINT): no finding"
        else:
            what = "ok" if self.status == 0 else f"FINDING (exit {self.status}) {self.finding or ''}".rstrip()
        return (f"{self.name:<16} {figure(self.executions):>12} {figure(self.per_second):>8} "
                f"{figure(self.coverage):>6} {figure(self.features):>7} {figure(self.corpus):>6} "
                f"{figure(self.peak_rss_mb):>6} {self.seconds:7.0f}  {what}")


# Exit statuses after SIGINT: libFuzzer's (-interrupted_exitcode, set below), or atheris's when the
# signal lands in Python code ("KeyboardInterrupt: stopping.", 128 + SIGINT).
INTERRUPTED = (72, 130)

HEADER = (f"{'target':<16} {'executions':>12} {'exec/s':>8} {'cov':>6} {'ft':>7} {'corpus':>6} "
          f"{'rss MB':>6} {'seconds':>7}  outcome")


def parse_stats(name: str, status: int, seconds: float, log: str) -> Outcome:
    """The figures libFuzzer printed (-print_final_stats=1 and its last status line)."""
    out = Outcome(name, status, seconds)
    stat = dict(re.findall(r"^stat::(\w+):\s+(\d+)", log, re.M))
    out.executions = int(stat["number_of_executed_units"]) if "number_of_executed_units" in stat else None
    out.per_second = int(stat["average_exec_per_sec"]) if "average_exec_per_sec" in stat else None
    out.peak_rss_mb = int(stat["peak_rss_mb"]) if "peak_rss_mb" in stat else None
    status_lines = re.findall(r"cov: (\d+) ft: (\d+) corp: (\d+)/", log)
    if status_lines:
        out.coverage, out.features, out.corpus = (int(v) for v in status_lines[-1])
    saved = re.findall(r"Test unit written to (\S+)", log)
    if saved:
        out.finding = saved[-1]
    return out


def run_target(name: str, args) -> Outcome:
    """One target in a child process (libFuzzer ends the process it runs in)."""
    findings = Path(args.findings).resolve() / name
    findings.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{name}-") as scratch:
        work = Path(args.corpus_dir).resolve() / name if args.corpus_dir else Path(scratch) / "corpus"
        work.mkdir(parents=True, exist_ok=True)
        dirs = [str(work)] + ([str(CORPUS / name)] if (CORPUS / name).is_dir() else [])
        flags = [f"-seed={args.seed}", f"-max_total_time={args.seconds}", f"-rss_limit_mb={args.rss_mb}", f"-malloc_limit_mb={args.rss_mb}",
                 f"-timeout={args.timeout}", f"-max_len={MAX_LEN}", "-print_final_stats=1",
                 f"-interrupted_exitcode={INTERRUPTED[0]}",
                 f"-artifact_prefix={findings}/"]
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--", *flags,
               *([args.reproduce] if args.reproduce else dirs)]
        started = time.monotonic()
        # libFuzzer ends the child with exit(), past Python's cleanup: its temporaries go in ours
        log_path = Path(scratch) / "log"
        with open(log_path, "w") as log:
            done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": "0", "TMPDIR": scratch})
        text = log_path.read_text(errors="replace")
        outcome = parse_stats(name, done.returncode, time.monotonic() - started, text)
        if done.returncode or args.verbose:
            sys.stdout.write(text[-6000:] if not args.verbose else text)
        (findings / "last.log").write_text(text)
    return outcome


def child(name: str, libfuzzer_args: list[str]) -> None:
    """In the target's own process: import it instrumented, seed the corpus, fuzz."""
    import atheris

    sys.path[:0] = [str(p) for p in IMPORT_PATHS]
    # Every shardfs module the target reaches is instrumented: those it imports, and those imported
    # lazily on the way (the formats' libraries are imported at a file's first scan), which its
    # seeds, run once here, import.
    with atheris.instrument_imports(include=["shardfs"]):
        import importlib

        target = importlib.import_module(name)
        seeds = target.seeds()
        for seed in seeds:
            target.one_input(seed)
    corpus_dirs = [a for a in libfuzzer_args if not a.startswith("-")]
    if corpus_dirs and os.path.isdir(corpus_dirs[0]):
        for seed in seeds:
            path = Path(corpus_dirs[0]) / f"seed-{hashlib.sha1(seed).hexdigest()}"
            if not path.exists():
                path.write_bytes(seed)
    atheris.Setup([sys.argv[0], *libfuzzer_args], target.one_input)
    atheris.Fuzz()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child(argv[1], argv[3:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="targets (tests/fuzz/targets/NAME.py)")
    parser.add_argument("--all", action="store_true", help="every target in turn")
    parser.add_argument("--list", action="store_true", help="name the targets and stop")
    parser.add_argument("--seconds", type=int, default=60, help="time for each target (default 60)")
    parser.add_argument("--rss-mb", type=int, default=2048, help="memory bound of a target's process (MB)")
    parser.add_argument("--timeout", type=int, default=10, help="seconds one input may take: longer is a hang")
    parser.add_argument("--findings", default="fuzz-findings", help="where findings are saved (DIR/NAME/)")
    parser.add_argument("--corpus-dir", help="keep the grown corpus in DIR/NAME/ (default: a temporary one)")
    parser.add_argument("--reproduce", metavar="FILE", help="run one input through the target, once")
    parser.add_argument("--seed", type=int, default=0,
                        help="libFuzzer's random seed: 0 (default) a new one each run, to find things; a fixed one "
                             "gives the same inputs each run (CI's smoke run: what fails there is a change's doing)")
    parser.add_argument("--verbose", action="store_true", help="print libFuzzer's whole output")
    args = parser.parse_args(argv)
    known = target_names()
    if args.list:
        print("\n".join(known))
        return 0
    names = known if args.all else args.names
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        parser.error(f"unknown targets {unknown}" if unknown else "name a target, or --all")
    outcomes = []
    print(HEADER, flush=True)
    for name in names:
        outcomes.append(run_target(name, args))
        print(outcomes[-1].line(), flush=True)
    failed = [o.name for o in outcomes if o.status and not o.interrupted]
    if failed:
        print(f"findings in {', '.join(failed)}: inputs in {args.findings}/NAME/, libFuzzer's output in last.log there")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
