"""`shardfs pack`: cut a member list into shards and write them, in parallel, reproducibly.

The plan depends only on the members and the options, never on ``workers``:

1. sort members by path (bytes); with ``shuffle``, permute them with ``seed``
   (numpy's legacy RandomState, whose stream is frozen across numpy versions);
2. walk them in that order, starting a new shard whenever the next member would take
   the shard file over ``shard_size`` bytes or the shard holds ``shard_members``
   members (a member larger than the limit gets a shard of its own);
3. write shard ``i`` as ``<prefix>-<i:06d>.tar`` (or ``.lz4shard``), each by one
   worker process, then ``<prefix>.manifest.json``.

The same input, options and seed give byte-identical shards and manifest.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field

import numpy as np

from shardfs.pack import manifest
from shardfs.pack import inputs as packinput
from shardfs.pack import samples as packwds
from shardfs.errors import UsageError
from shardfs.index.shard_index import INDEX_SUFFIX
from shardfs.pack.inputs import Member
from shardfs.pack.samples import sample_key
from shardfs.pack.writers import SUFFIXES, PackError, ShardInfo, SizeBound, write_shard
from shardfs.view.layouts import read_classes

__all__ = ["PackOptions", "PackSummary", "PackError", "pack_members", "pack_path", "pack_dataset", "plan"]

DEFAULT_SHARD_SIZE = 1 << 30


@dataclass
class PackOptions:
    prefix: str = ""  # shard names: <prefix>-000000.tar, ...; pack_path defaults it to the source's name
    format: str = "tar"  # "tar" or "lz4"
    shard_size: int = DEFAULT_SHARD_SIZE  # bytes of shard file
    shard_members: int | None = None
    shuffle: bool = False
    seed: int = 0
    block_size: int = 1 << 20  # lz4 only
    under: str = ""  # put every member below this directory
    mtime: int | None = None  # every member's mtime; None: the source file's
    workers: int = 1
    overwrite: bool = False
    layout: str = "plain"  # or "webdataset": <key>.<ext> + <key>.cls samples (packwds.py)
    progress: bool | None = None  # tqdm's disable=None rule: only on a terminal

    def check(self) -> None:
        if self.format not in SUFFIXES:
            raise UsageError(f"unknown format {self.format!r} (tar or lz4)")
        if not self.prefix or "/" in self.prefix or self.prefix.startswith("."):
            raise UsageError(f"bad shard name prefix {self.prefix!r}")
        if self.shard_size < 1:
            raise UsageError("the shard size limit must be positive")
        if self.shard_members is not None and self.shard_members < 1:
            raise UsageError("--shard-members must be at least 1")
        if self.layout not in ("plain", "webdataset"):
            raise UsageError(f"unknown layout {self.layout!r} (plain or webdataset)")
        if self.workers < 1:
            raise UsageError("--workers must be at least 1")
        from shardfs.formats.lz4shard import MAX_BLOCK_SIZE, MIN_BLOCK_SIZE

        if self.format == "lz4" and not MIN_BLOCK_SIZE <= self.block_size <= MAX_BLOCK_SIZE:
            raise UsageError(f"--block-size must be between {MIN_BLOCK_SIZE} and {MAX_BLOCK_SIZE} bytes")

    def recorded(self) -> dict:
        """The options that shape the output (the manifest records these; workers do not matter)."""
        recorded = {"format": self.format, "shard_size": self.shard_size, "shard_members": self.shard_members,
                    "shuffle": self.shuffle, "seed": self.seed if self.shuffle else None,
                    "block_size": self.block_size if self.format == "lz4" else None,
                    "under": self.under, "mtime": self.mtime}
        if self.layout != "plain":  # plain packs keep the manifest they always had
            recorded["layout"] = self.layout
        return recorded


@dataclass
class PackSummary:
    shards: list[ShardInfo]
    members: int
    bytes_in: int
    bytes_out: int
    seconds: float
    manifest: str
    oversized: list[str] = field(default_factory=list)  # members alone over the size limit

    def line(self) -> str:
        mb = lambda n: f"{n / 1e6:.1f} MB"  # noqa: E731
        fmt = self.shards[0].format if self.shards else "-"
        s = max(self.seconds, 1e-9)
        return (f"packed {self.members} files ({mb(self.bytes_in)}) into {len(self.shards)} {fmt} shard"
                f"{'s' if len(self.shards) != 1 else ''} ({mb(self.bytes_out)}) in {self.seconds:.2f} s: "
                f"{self.bytes_out / s / 1e6:.1f} MB/s written, {self.members / s:.0f} files/s")


# ---- planning -----------------------------------------------------------------


def order(members: list[Member], shuffle: bool, seed: int, grouped: bool = False) -> list[list[Member]]:
    """Members in sorted path order (then shuffled), in groups that stay together: one member
    each, or with ``grouped`` the members of one WebDataset sample (adjacent once sorted, as their
    keys hold no dot)."""
    members = sorted(members, key=lambda m: m.key)
    for a, b in zip(members, members[1:]):
        if a.key == b.key:
            raise UsageError(f"two sources give the member path {a.name} ({a.source}, {b.source})")
    groups: list[list[Member]] = []
    for m in members:
        if grouped and groups and sample_key(groups[-1][0].key) == sample_key(m.key):
            groups[-1].append(m)
        else:
            groups.append([m])
    if shuffle:
        perm = np.random.RandomState(seed % 2**32).permutation(len(groups))
        groups = [groups[i] for i in perm]
    return groups


def plan(members: list[Member], opts: PackOptions) -> tuple[list[list[Member]], list[str]]:
    """Shards (lists of members, in order) and the members that alone exceed the size limit.
    A WebDataset sample is never split between shards."""
    shards: list[list[Member]] = []
    oversized: list[str] = []
    current: list[Member] = []
    bound = SizeBound(opts.format, opts.block_size)
    for group in order(members, opts.shuffle, opts.seed, grouped=opts.layout == "webdataset"):
        full = opts.shard_members is not None and len(current) + len(group) > opts.shard_members
        if current and (full or bound.with_members(group) > opts.shard_size):
            shards.append(current)
            current, bound = [], SizeBound(opts.format, opts.block_size)
        if bound.with_members(group) > opts.shard_size:
            oversized.append(group[0].name)
        current.extend(group)
        for m in group:
            bound.add(m)
    if current:
        shards.append(current)
    return shards, oversized


# ---- the output directory -----------------------------------------------------


def _existing(out_dir: str, prefix: str) -> list[str]:
    pattern = re.compile(re.escape(prefix) + r"-\d{6,}(\.tar|\.lz4shard)")
    return sorted(n for n in os.listdir(out_dir)
                  if pattern.fullmatch(n) or n == os.path.basename(manifest.path_for(out_dir, prefix)))


def _remove_stale(out_dir: str, old: list[str], kept: set[str]) -> None:
    for name in old:
        if name in kept:
            continue
        for path in (os.path.join(out_dir, name), os.path.join(out_dir, name) + INDEX_SUFFIX):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def _remove_unfinished(out_dir: str, prefix: str, created: bool) -> None:
    """A pack that failed (a full disk, a source gone) leaves no half of itself: no shard of the
    prefix, no index or temp file of one, and not the folder it made."""
    pattern = re.compile(re.escape(prefix) + r"-\d{6,}(\.tar|\.lz4shard)(\.tmp|" + re.escape(INDEX_SUFFIX) + ")?")
    for name in os.listdir(out_dir):
        if pattern.fullmatch(name):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(out_dir, name))
    if created:
        with contextlib.suppress(OSError):
            os.rmdir(out_dir)


def prepare_out_dir(out_dir: str, opts: PackOptions) -> list[str]:
    """Create out_dir; the names of an earlier pack with this prefix (refused unless overwrite)."""
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{out_dir}: cannot create the output directory: {exc.strerror}") from None
    old = _existing(out_dir, opts.prefix)
    if old and not opts.overwrite:
        raise UsageError(f"{out_dir} already holds a pack named {opts.prefix!r} ({old[0]}, ...): "
                         "use --overwrite to replace it, or another --prefix")
    return old


# ---- writing ------------------------------------------------------------------

_COUNTERS = None  # (files, bytes) shared with the parent, set in each worker


def _init_worker(files, nbytes) -> None:
    global _COUNTERS
    _COUNTERS = (files, nbytes)


def _count(files: int, nbytes: int) -> None:
    f, b = _COUNTERS
    with f.get_lock():
        f.value += files
    with b.get_lock():
        b.value += nbytes


def _write_job(job) -> ShardInfo:
    path, fmt, members, block_size = job
    return write_shard(path, fmt, members, block_size, progress=_count)


def _bar(total_files: int, opts: PackOptions):
    from tqdm import tqdm

    return tqdm(total=total_files, unit="file", disable=None if opts.progress is None else not opts.progress,
                file=sys.stderr, desc="pack", dynamic_ncols=True)


def _write_all(out_dir: str, shards: list[list[Member]], opts: PackOptions) -> list[ShardInfo]:
    suffix = SUFFIXES[opts.format]
    jobs = [(os.path.join(out_dir, f"{opts.prefix}-{i:06d}{suffix}"), opts.format, members, opts.block_size)
            for i, members in enumerate(shards)]
    total_files = sum(len(s) for s in shards)
    started = time.monotonic()
    results: list[ShardInfo | None] = [None] * len(jobs)
    workers = min(opts.workers, len(jobs))

    if workers <= 1:
        with _bar(total_files, opts) as bar:
            done_bytes = 0

            def progress(files: int, nbytes: int) -> None:
                nonlocal done_bytes
                done_bytes += nbytes
                bar.update(files)
                if bar.n % 64 == 0:
                    bar.set_postfix_str(_rate(done_bytes, started), refresh=False)

            for i, (path, fmt, members, block_size) in enumerate(jobs):
                results[i] = write_shard(path, fmt, members, block_size, progress)
        return results  # type: ignore[return-value]

    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    files, nbytes = ctx.Value("q", 0), ctx.Value("q", 0)
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(files, nbytes)) as pool:
        pending = {pool.submit(_write_job, job): i for i, job in enumerate(jobs)}
        try:
            with _bar(total_files, opts) as bar:
                while pending:
                    done, _ = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                    for fut in done:
                        results[pending.pop(fut)] = fut.result()
                    bar.update(files.value - bar.n)
                    bar.set_postfix_str(_rate(nbytes.value, started))
        except BaseException:
            for fut in pending:
                fut.cancel()
            raise
    return results  # type: ignore[return-value]


def _rate(nbytes: int, started: float) -> str:
    return f"{nbytes / max(time.monotonic() - started, 1e-9) / 1e6:.1f} MB/s"


def pack_members(members: list[Member], out_dir: str, opts: PackOptions, source: dict,
                 started: float | None = None, classes: list[str] | None = None) -> PackSummary:
    """Plan, write every shard and the manifest; remove shards of an earlier pack of the same prefix.

    With ``opts.layout == "webdataset"`` the members (named ``<class>/...``, without ``opts.under``)
    become samples, and the class list is written as ``classes.txt`` (see packwds.py)."""
    started = time.monotonic() if started is None else started
    opts.check()
    if not members:
        raise UsageError("nothing to pack: the source has no files")
    created = not os.path.lexists(out_dir)
    if opts.layout != "webdataset":
        return _pack_members(members, out_dir, opts, source, started, created)
    prepare_out_dir(out_dir, opts)
    spool = tempfile.mkdtemp(dir=out_dir, prefix=".pack-spool-")
    try:
        members, classes = packwds.to_samples(members, classes, os.path.join(spool, "labels"), opts.under)
        summary = _pack_members(members, out_dir, opts, source, started, created)
    finally:
        shutil.rmtree(spool, ignore_errors=True)
    packwds.write_classes(out_dir, classes)
    return summary


def _pack_members(members: list[Member], out_dir: str, opts: PackOptions, source: dict,
                  started: float, created: bool) -> PackSummary:
    """created: out_dir did not exist before this pack (removed again if the pack fails)."""
    shards, oversized = plan(members, opts)
    old = prepare_out_dir(out_dir, opts)
    try:  # from now on, until the new one is written, no manifest vouches for a half-replaced pack
        os.unlink(manifest.path_for(out_dir, opts.prefix))
    except FileNotFoundError:
        pass
    try:
        infos = _write_all(out_dir, shards, opts)
        extra = {}
        if opts.format == "lz4":
            import lz4

            extra = {"lz4": lz4.library_version_string()}  # another lz4 may compress differently
        path = manifest.path_for(out_dir, opts.prefix)
        manifest.write(path, manifest.build(opts.prefix, infos, source, opts.recorded(), extra))
    except BaseException:
        _remove_unfinished(out_dir, opts.prefix, created)
        raise
    _remove_stale(out_dir, old, {i.name for i in infos} | {os.path.basename(path)})
    return PackSummary(infos, sum(i.members for i in infos), sum(i.data_bytes for i in infos),
                       sum(i.size for i in infos), time.monotonic() - started, path, oversized)


def _default_prefix(src: str) -> str:
    name = os.path.basename(os.path.normpath(os.path.abspath(src)))
    return os.path.splitext(name)[0] if os.path.isfile(src) else name


def pack_path(src: str, out_dir: str, opts: PackOptions, classes: str | None = None,
              root: str | None = None) -> PackSummary:
    """Pack a directory (ImageFolder-style) or a mapping file (JSON or ``path label`` lines)."""
    started = time.monotonic()
    if not opts.prefix:
        opts.prefix = _default_prefix(src)
    under = "" if opts.layout == "webdataset" else opts.under  # webdataset: class = first component
    class_list = None
    if os.path.isdir(src):
        if classes or root:
            raise UsageError("--classes and --root apply to a mapping file, not to a directory")
        if os.path.realpath(out_dir) == os.path.realpath(src):
            raise UsageError(f"{out_dir}: the output directory cannot be the source directory")
        inside = os.path.realpath(out_dir).startswith(os.path.realpath(src) + os.sep)
        members = packinput.from_directory(src, under, opts.mtime, exclude=out_dir if inside else None)
        source = {"kind": "directory", "name": os.path.basename(os.path.normpath(os.path.abspath(src))),
                  "classes": None}
    elif os.path.isfile(src):
        class_list = read_classes(classes) if classes else None
        members = packinput.from_mapping(src, root, class_list, under, opts.mtime)
        source = {"kind": "mapping", "name": os.path.basename(src),
                  "classes": os.path.basename(classes) if classes else None}
    else:
        raise UsageError(f"{src}: no such file or directory")
    return pack_members(members, out_dir, opts, source, started, class_list)


def pack_dataset(dataset, out_dir: str, prefix: str = "data", *, image_format: str = "PNG", quality: int = 90,
                 **options) -> PackSummary:
    """Pack a map-style dataset: sample i becomes ``<class>/<i>.<ext>`` (see shardfs.pack.packer.torchdata).

    ``options`` are :class:`PackOptions` fields (format, shard_size, shard_members, shuffle,
    seed, block_size, under, mtime, workers, overwrite, progress).
    """
    from shardfs.pack.torchdata import members_from_dataset

    started = time.monotonic()
    opts = PackOptions(prefix=prefix, **options)
    opts.check()
    prepare_out_dir(out_dir, opts)  # refuse before encoding anything
    spool = tempfile.mkdtemp(dir=out_dir, prefix=".pack-spool-")
    try:
        under = "" if opts.layout == "webdataset" else opts.under
        members = members_from_dataset(dataset, spool, under, image_format, quality, opts.workers, opts.mtime)
        source = {"kind": "dataset", "name": type(dataset).__name__, "classes": None,
                  "image_format": image_format.upper(),
                  "quality": quality if image_format.upper() in ("JPEG", "JPG") else None}
        return pack_members(members, out_dir, opts, source, started, _dataset_classes(dataset, members))
    finally:
        shutil.rmtree(spool, ignore_errors=True)


def _dataset_classes(dataset, members: list[Member]) -> list[str] | None:
    """The dataset's class list when the folders are its names: webdataset labels are then its targets."""
    names = [str(c) for c in getattr(dataset, "classes", None) or []]
    return names if names and {m.name.split("/", 1)[0] for m in members} <= set(names) else None
