"""`shardfs verify`: read every shard and report what is wrong, one line per problem.

Per shard:

* structure: the index builds from the file itself (never a saved index) with no error
  and no warning (a refused, skipped or duplicated member is a problem);
* lz4 shards: every block is read through the format's layout, so its CRC-32 is checked
  and it is decompressed; a bad block names the members it holds;
* against a manifest (``*.manifest.json`` in the shard's directory): size, member count and
  sha256 (tar data has no checksum of its own: without a manifest only ``--decode`` reads it);
  a shard that no manifest of its directory lists, or a listed shard missing on disk, is a
  problem too;
* with ``decode``: every member with an image extension is opened with Pillow and loaded
  (Parquet: through its page, decoded and checked).

Shards may be URLs (s3://, http(s)://): they are read through the same storage layer as a mount.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from shardfs.pack import manifest as manifests
from shardfs.index import names
from shardfs.errors import UsageError
from shardfs.formats import ShardFormatError, format_for, sparse
from shardfs.formats.base import Kind
from shardfs.formats.datafile import Columns
from shardfs.storage import open_shard
from shardfs.storage.base import ShardIOError, is_url
from shardfs.view.dataset import serving
from shardfs.view.sources import find_shards

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")
MAX_NAMED = 3  # members named per bad block
DIGEST_WINDOW = 8 << 20


@dataclass
class ShardReport:
    path: str
    size: int = 0
    members: int = 0
    problems: list[str] = field(default_factory=list)
    damaged: bool = False  # truncated or a bad header: a mount serves the members around the damage


@dataclass
class VerifyResult:
    shards: int
    members: int
    bytes: int
    problems: list[str]
    seconds: float
    bad_shards: int  # shards (or manifests) with at least one problem
    unchecked_tar: int  # tar shards with no manifest entry: their data was not checksummed
    damaged_shards: int = 0  # shards whose structure is damaged (a mount serves what lies outside the damage)

    def line(self) -> str:
        what = (f"verified {self.shards} shard{'s' if self.shards != 1 else ''}, {self.members} members "
                f"({self.bytes / 1e6:.1f} MB) in {self.seconds:.2f} s: ")
        if self.problems:
            what += f"{len(self.problems)} problem{'s' if len(self.problems) != 1 else ''}"
            what += f" in {self.bad_shards} shard{'s' if self.bad_shards != 1 else ''}" if self.bad_shards else ""
            what += f", {self.damaged_shards} damaged (a mount serves their members outside the damage)" \
                if self.damaged_shards else ""
        else:
            what += "all good"
        if self.unchecked_tar:
            what += f" ({self.unchecked_tar} tar shards have no manifest entry: their data was not checksummed)"
        return what


def _affected(ix, start: int, end: int) -> str:
    """Members whose data overlaps logical bytes [start, end)."""
    hit = np.flatnonzero((ix.kind == Kind.FILE) & (ix.size > 0) & (ix.offset < end)
                         & (ix.offset + ix.size > start)).tolist()
    shown = ", ".join(names.show(ix.name(i)) for i in hit[:MAX_NAMED])
    more = f" and {len(hit) - MAX_NAMED} more" if len(hit) > MAX_NAMED else ""
    return f" (members {shown}{more})" if hit else ""


def check_shard(path: str, decode: bool = False, expected: dict | None = None,
                columns: Columns = Columns()) -> ShardReport:
    """Every check of one shard (a file or a URL); ``expected`` is its manifest entry, if any;
    ``columns``: a dataset file's image and label columns."""
    from shardfs.index import shard_index

    shown = os.path.basename(path)
    report = ShardReport(path)
    bad = report.problems.append
    try:
        shard = open_shard(path)
        report.size = shard.size
        ix = shard_index.build(shard, columns)
    except OSError as exc:  # ShardIOError too
        bad(f"{shown}: cannot read: {exc.strerror or exc}")
        return report
    try:
        _check_members(shard, ix, report, decode, expected)
    except ShardIOError as exc:
        bad(f"{shown}: cannot read: {exc}")
    finally:
        shard.close()
    return report


def _check_members(shard, ix, report: ShardReport, decode: bool, expected: dict | None) -> None:
    shown, bad = shard.name, report.problems.append
    report.members = len(ix)
    report.problems.extend(ix.warnings)
    if ix.error:
        bad(ix.error)
        report.damaged = True

    if expected is not None:
        if report.size != expected["size"]:
            bad(f"{shown}: {report.size} bytes, the manifest says {expected['size']}")
        if not ix.error and expected.get("members") not in (None, len(ix)):
            bad(f"{shown}: {len(ix)} members, the manifest says {expected['members']}")
        digest = _sha256(shard)
        if digest != expected["sha256"]:
            bad(f"{shown}: sha256 mismatch (file {digest[:16]}..., manifest {expected['sha256'][:16]}...)")

    if ix.error and not len(ix):
        return
    try:
        layout = format_for(shard.path).open_layout(shard, report.size)
    except ShardFormatError as exc:
        bad(f"{shown}: {exc}")
        return
    fetch = serving(shard, ix.format, ix.logical_size).pread  # a compressed tar: its decompressed tar
    bad_ranges = []
    block_size = getattr(layout, "block_size", None)
    if block_size:  # lz4: read (CRC-check and decompress) every block
        for start in range(0, layout.logical_size, block_size):
            end = min(start + block_size, layout.logical_size)
            try:
                layout.read(start, end - start, fetch)
            except ShardFormatError as exc:
                bad(f"{shown}: {exc}{_affected(ix, start, end)}")
                bad_ranges.append((start, end))
    for problem in getattr(layout, "check_members", lambda _fetch: [])(fetch):  # zip: every member's CRC-32
        bad(f"{shown}: {problem}")
    if decode:
        _decode_members(ix, layout, fetch, bad_ranges, shown, bad)


def _sha256(shard) -> str:
    digest = hashlib.sha256()
    for offset in range(0, shard.size, DIGEST_WINDOW):
        digest.update(shard.pread(offset, DIGEST_WINDOW))
    return digest.hexdigest()


def _decode_members(ix, layout, fetch, bad_ranges, shown, bad) -> None:
    from PIL import Image

    for i in range(len(ix)):
        name = ix.name(i)
        if ix.kind[i] != Kind.FILE or not names.show(name).lower().endswith(IMAGE_EXTENSIONS):
            continue
        off, size = int(ix.offset[i]), int(ix.size[i])
        if any(off < end and off + size > start for start, end in bad_ranges):
            continue  # already reported with its block
        try:
            runs = ix.sparse.get(i)
            data = (sparse.read(runs, 0, size, lambda o, n: layout.read(off + o, n, fetch)) if runs is not None
                    else layout.read(off, size, fetch))
            if len(data) != size:
                raise ShardFormatError(f"short read ({len(data)} of {size} bytes)")
            with Image.open(io.BytesIO(data)) as image:
                image.load()
        except Exception as exc:  # noqa: BLE001 - any failure to decode is the finding
            bad(f"{shown}: member {names.show(name)}: cannot decode: {exc}")


def _check_job(job) -> ShardReport:
    return check_shard(*job)


def _manifest_expectations(dirs: list[str], problem) -> tuple[dict[str, dict], dict[str, list[str]]]:
    """{shard path: manifest entry}, {directory: its manifest names}; reports missing shards."""
    expected: dict[str, dict] = {}
    by_dir: dict[str, list[str]] = {}
    for d in dirs:
        for path in manifests.find(d):
            name = os.path.basename(path)
            try:
                data = manifests.load(path)
            except (OSError, ValueError) as exc:
                problem(f"{name}: unreadable manifest: {exc}", path)
                continue
            by_dir.setdefault(d, []).append(name)
            for entry in data["shards"]:
                shard = os.path.join(d, entry["name"])
                if not os.path.isfile(shard):
                    problem(f"{entry['name']}: listed in {name} but missing", shard)
                expected[shard] = entry
    return expected, by_dir


def verify(sources: list[str], decode: bool = False, workers: int | None = None, report=print,
           progress: bool | None = None, columns: Columns = Columns()) -> VerifyResult:
    """Check every shard named by sources; each problem goes to ``report`` as one line."""
    from tqdm import tqdm

    started = time.monotonic()
    problems: list[str] = []
    bad_shards: set[str] = set()

    def problem(line: str, shard: str) -> None:
        problems.append(line)
        bad_shards.add(shard)
        report(line)

    dirs = sorted({os.path.abspath(s) for s in sources if not is_url(s) and os.path.isdir(s)})
    try:
        paths = find_shards(sources)
    except UsageError:
        if not any(manifests.find(d) for d in dirs):
            raise
        paths = []  # a directory whose manifest lists shards that are all gone: report them
    dirs = sorted(set(dirs) | {os.path.dirname(p) for p in paths if not is_url(p)})  # manifests: local only
    expected, by_dir = _manifest_expectations(dirs, problem)
    for p in paths:
        if p not in expected and by_dir.get(os.path.dirname(p)):
            problem(f"{os.path.basename(p)}: not listed in {', '.join(by_dir[os.path.dirname(p)])}", p)

    jobs = [(p, decode, expected.get(p), columns) for p in paths]
    workers = min(workers or min(8, os.cpu_count() or 1), max(len(jobs), 1))
    total = sum(os.path.getsize(p) for p in paths if not is_url(p))
    shards = members = nbytes = damaged = 0
    emit = tqdm.write if report is print else report  # tqdm.write keeps the bar intact
    with tqdm(total=total, unit="B", unit_scale=True, desc="verify", file=sys.stderr,
              disable=None if progress is None else not progress) as bar:
        pool = ProcessPoolExecutor(workers) if workers > 1 else None
        try:
            results = pool.map(_check_job, jobs) if pool else map(_check_job, jobs)
            for r in results:
                shards, members, nbytes = shards + 1, members + r.members, nbytes + r.size
                damaged += r.damaged
                if r.problems:
                    bad_shards.add(r.path)
                for line in r.problems:
                    problems.append(line)
                    emit(line)
                bar.update(r.size)
        finally:
            if pool:
                pool.shutdown(cancel_futures=True)
    unchecked = sum(1 for p in paths if p not in expected and p.endswith(".tar"))
    return VerifyResult(shards, members, nbytes, problems, time.monotonic() - started, len(bad_shards), unchecked,
                        damaged)
