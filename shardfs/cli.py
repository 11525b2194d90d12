"""The ``shardfs`` command line."""

from __future__ import annotations

import argparse
import difflib
import glob
import json
import logging
import os
import sys

from shardfs import __version__
from shardfs.errors import ShardfsError, UsageError, one_line

log = logging.getLogger("shardfs")


def _setup_logging(level: str, log_file: str | None = None, journal: bool = False) -> None:
    """Logs go to stderr; under systemd (journal) as "<level>message" lines, which journald
    reads as priorities, without timestamps of our own."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    from shardfs.redact import RedactingFilter

    stream = logging.StreamHandler(sys.stderr)
    stream.addFilter(RedactingFilter())
    if journal:
        stream.setFormatter(_JournalFormatter())
    else:
        stream.setFormatter(logging.Formatter("shardfs %(levelname)s: %(message)s"))
    root.addHandler(stream)
    if log_file:
        os.makedirs(os.path.dirname(os.path.abspath(log_file)), exist_ok=True)
        to_file = logging.FileHandler(log_file)
        to_file.addFilter(RedactingFilter())
        to_file.setFormatter(logging.Formatter("%(asctime)s shardfs %(levelname)s: %(message)s"))
        root.addHandler(to_file)
    root.setLevel(level.upper())


class _JournalFormatter(logging.Formatter):
    PRIORITY = {"DEBUG": 7, "INFO": 6, "WARNING": 4, "ERROR": 3, "CRITICAL": 2}

    def format(self, record: logging.LogRecord) -> str:
        return f"<{self.PRIORITY.get(record.levelname, 6)}>{record.getMessage()}"


def _mount_config(args):
    """One MountConfig from --config FILE and/or the command line (the command line wins)."""
    from shardfs.service.config import MountConfig, load_config

    if args.config:
        if args.paths:
            raise UsageError("give either --config FILE or SRC... MOUNTPOINT, not both")
        cfg = load_config(args.config)
    elif len(args.paths) < 2:
        raise UsageError("name the shards and the mountpoint: shardfs mount SRC [SRC...] MOUNTPOINT")
    else:
        cfg = MountConfig(sources=args.paths[:-1], mountpoint=args.paths[-1])
    return _apply_command_line(cfg, args)


def _apply_command_line(cfg, args):
    from shardfs.service.config import apply_options, check

    for key in ("cache_size", "prefetch", "loaders", "index_dir", "workers", "log_file", "log_level", "layout",
                "class_names", "columns", "metrics_dir", "metrics_interval", "disk_cache", "disk_cache_size"):
        if getattr(args, key) is not None:
            setattr(cfg, key, getattr(args, key))
    if args.no_auto_unmount:
        cfg.auto_unmount = False
    if args.peers is not None:
        from shardfs.storage.peers.addresses import parse_list

        cfg.peers = parse_list(args.peers)
    if args.peer_self is not None:
        cfg.peer_self = args.peer_self
    from shardfs.storage.remote import configure, options_from_env, parse_option

    # From a `shardfs mount` or `shardfs run` that started us (never on our command line).
    cfg.storage_options = {**options_from_env(), **cfg.storage_options}
    cfg.storage_options.update(parse_option(text) for text in args.option or [])
    apply_options(cfg, ",".join(args.o or []))
    configure(cfg.storage_options)
    check(cfg, lambda key, why: UsageError(f"--{key.replace('_', '-')}: {why}"))
    return cfg


def _configure_remote(args) -> None:
    from shardfs.storage.remote import configure, options_from_env, parse_option

    configure({**options_from_env(), **dict(parse_option(text) for text in args.option or [])})


def cmd_mount(args) -> int:
    from shardfs.service import mount

    cfg = _mount_config(args)
    if not args.foreground:
        # The daemon forks from this process (service/forked.py), but not with storage options on our
        # command line: it would show them in its /proc/PID/cmdline for as long as it serves. A new
        # interpreter gets them through the environment (config.storage_env) instead.
        secrets_in_argv = bool(args.option) or any("storage_options." in text for text in args.o or [])
        return mount.mount_detached(cfg, args.ready_timeout, serve=None if secrets_in_argv else _serve)
    return _serve(cfg, args.ready_fd)


def _serve(cfg, ready_fd: int | None) -> int:
    """`shardfs mount --foreground`, and the daemon a detaching `shardfs mount` forks: serve until
    unmounted. ready_fd: where that `shardfs mount` waits for our progress and ready lines."""
    from shardfs.service import mount
    from shardfs.service.daemon import serve
    from shardfs.fuse.lib import check_can_mount

    _setup_logging(cfg.log_level, cfg.log_file, journal=ready_fd is None and "INVOCATION_ID" in os.environ)
    held = None if ready_fd is None else _hold_terminal_lines()
    check_can_mount(cfg.allow_other, cfg.mountpoint)
    if ready_fd is None:
        mount.prepare_mountpoint(cfg.mountpoint)

    def detach() -> None:
        # Started by `shardfs mount` without --foreground: the problems held back go to its terminal,
        # and from now on the log to the file only.
        if held is not None:
            held.flush()
            logging.getLogger().removeHandler(held)
            fd = os.open(cfg.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(fd, 2)
            os.close(fd)

    try:
        return serve(cfg, ready_fd=ready_fd, on_detach=detach)
    finally:
        if held is not None:  # not ready (refused, or failed): its one line says it; the log file has the rest
            held.setTarget(None)


def _hold_terminal_lines() -> logging.Handler:
    """A daemon started by `shardfs mount`: its terminal sees problems only (warnings and worse), and
    only those of a mount that goes ahead, held until it is ready; a refusal is the command's one
    line, alone (every line is in the log file as well)."""
    from logging.handlers import MemoryHandler

    root = logging.getLogger()
    stream = next(h for h in root.handlers if type(h) is logging.StreamHandler)
    root.removeHandler(stream)
    held = MemoryHandler(10_000, flushLevel=logging.CRITICAL + 1, target=stream, flushOnClose=False)
    held.setLevel(logging.WARNING)
    root.addHandler(held)
    return held


def _could_be_mountpoint(word: str) -> bool:
    """Nothing there yet, or an empty directory: it cannot be a source (those hold shards)."""
    from shardfs.storage.base import is_url
    from shardfs.formats import format_for

    if is_url(word) or any(c in word for c in "*?[{") or format_for(word) is not None:
        return False
    return not os.path.lexists(word) or (os.path.isdir(word) and not os.listdir(word))


def _run_sources_and_mountpoint(paths: list[str], mountpoint: str | None) -> tuple[list[str], str | None]:
    """`shardfs run SRC... [MOUNTPOINT]`: the last word is the mountpoint only if it cannot be a
    source (see _could_be_mountpoint); with -m every word is a source."""
    if mountpoint is not None or len(paths) == 1:
        return paths, mountpoint
    if _could_be_mountpoint(paths[-1]):
        return paths[:-1], paths[-1]
    raise UsageError(f"{paths[-1]} looks like a source, not a mountpoint (a mountpoint is a new path or an "
                     f"empty directory): name the mountpoint with -m MOUNTPOINT; every other word is then a source")


def cmd_run(args) -> int:
    from shardfs.service.api import MountError
    from shardfs.service.runner import run

    if not args.command:
        raise UsageError("give the command after --: shardfs run SRC [MOUNTPOINT] -- COMMAND [ARG...]")
    from shardfs.service.config import MountConfig

    sources, mountpoint = _run_sources_and_mountpoint(args.paths, args.mountpoint)
    cfg = MountConfig(sources=sources, mountpoint=mountpoint or "")
    if args.peers is None and not any(opt.startswith("peers=") for text in args.o or [] for opt in text.split(",")):
        from shardfs.service.jobpeers import slurm_peers

        cfg.peers, cfg.peer_self = slurm_peers()
    cfg = _apply_command_line(cfg, args)
    if cfg.disk_cache is None and in_batch_job():
        from shardfs.storage.placement import job_scratch_tier

        cfg.disk_cache = job_scratch_tier()
    options = {"cache_size": cfg.cache_size, "disk_cache": _absolute(cfg.disk_cache),
               "disk_cache_size": cfg.disk_cache_size, "prefetch": cfg.prefetch, "loaders": cfg.loaders,
               "index_dir": cfg.index_dir, "workers": cfg.workers, "log_file": cfg.log_file,
               "allow_other": cfg.allow_other, "auto_unmount": cfg.auto_unmount, "layout": cfg.layout,
               "class_names": cfg.class_names and os.path.abspath(cfg.class_names), "columns": cfg.columns,
               "storage_options": cfg.storage_options, "peers": cfg.peers, "peer_self": cfg.peer_self}
    try:
        return run(sources, mountpoint, args.command, options, args.argv)
    except MountError as exc:  # its message is what `shardfs mount` printed
        print(exc, file=sys.stderr)
        return exc.exit_code


def in_batch_job() -> bool:
    return any(name in os.environ for name in ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID"))


def _absolute(path: str | None) -> str | None:
    return os.path.abspath(path) if path not in (None, "off") else path


def cmd_cache(args) -> int:
    from shardfs.storage import tierfile

    if not os.path.isdir(args.dir):
        raise UsageError(f"{args.dir}: no such directory")
    if args.action == "clear":
        removed, skipped = tierfile.clear(args.dir)
        print(f"{removed} shards removed" + (f", {skipped} skipped (in use by a live mount)" if skipped else ""))
        return 0
    rows = tierfile.describe(args.dir)
    if args.json:
        print(json.dumps([row.__dict__ for row in rows], indent=2))
        return 0
    for row in rows:
        print(f"{row.filled / 2**20:10.1f} MiB of {row.size / 2**20:10.1f} MiB  {'in use' if row.in_use else 'idle  '}  "
              f"{row.source}")
    total = sum(row.disk_bytes for row in rows)
    print(f"{len(rows)} shards, {total / 2**30:.2f} GiB on disk in {args.dir}")
    return 0


def cmd_status(args) -> int:
    from shardfs.service.status import collect, render

    rows = collect(args.mountpoint)
    if args.mountpoint and not rows:
        raise UsageError(f"{args.mountpoint} is not a shardfs mount")
    print(json.dumps(rows, indent=2) if args.json else render(rows))
    return 0 if all(row["state"] == "ok" for row in rows) else 1


def cmd_umount(args) -> int:
    from shardfs.service.mount import unmount

    return unmount(args.mountpoint, lazy=args.lazy, wait=args.wait)


def cmd_index(args) -> int:
    from tqdm import tqdm

    from shardfs.formats.datafile import Columns
    from shardfs.view.dataset import index_shards
    from shardfs.view.sources import find_shards

    _configure_remote(args)
    paths = find_shards(args.sources)
    bad = members = built = 0
    with tqdm(total=len(paths), unit="shard", disable=None, file=sys.stderr) as bar:
        for path, ix, how in index_shards(paths, args.index_dir, args.workers or os.cpu_count() or 1, args.rebuild,
                                          columns=Columns.parse(args.columns)):
            bar.update(1)
            if ix is None:
                bad += 1
                tqdm.write(f"shardfs: {how}", file=sys.stderr)
                continue
            members += len(ix)
            built += how.startswith("built")
            for line in ix.warnings + ([ix.error] if ix.error else []):
                tqdm.write(f"shardfs: warning: {line}", file=sys.stderr)
            bad += ix.error is not None
    print(f"{len(paths)} shards, {members} members; {built} indexes built, {len(paths) - built - bad} current; "
          f"{bad} with errors")
    return 1 if bad else 0


def cmd_stats(args) -> int:
    from shardfs.service.watch import read_figures, watch

    if args.watch:
        return watch(args.mountpoint, args.interval, args.count)
    try:
        data = read_figures(args.mountpoint)
    except OSError as exc:
        raise UsageError(f"{args.mountpoint}: not a live shardfs mount ({exc.strerror})") from None
    if args.format == "prometheus":
        from shardfs.service.metrics import render

        sys.stdout.write(render(data))
        return 0
    if args.json or args.format == "json":
        print(json.dumps(data, indent=2))
        return 0
    width = max(len(k) for k in data)
    for key, value in data.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in sorted(value.items()))
        print(f"{key:<{width}}  {value}")
    return 0


def cmd_pack(args) -> int:
    from shardfs.storage.memory import parse_size
    from shardfs.pack.packer import PackOptions, pack_path
    from shardfs.pack.writers import PackError

    def size(opt: str, text: str) -> int:
        if text.strip().endswith("%"):
            raise UsageError(f"{opt}: give a size in bytes (1G, 512M, 100000), not a share of RAM")
        try:
            return parse_size(text)
        except ValueError as exc:
            raise UsageError(f"{opt}: {exc}") from None

    opts = PackOptions(prefix=args.prefix or "", format=args.format, shard_size=size("--shard-size", args.shard_size),
                       shard_members=args.shard_members, shuffle=args.shuffle or args.seed is not None,
                       seed=args.seed or 0, block_size=size("--block-size", args.block_size), under=args.under,
                       mtime=args.mtime, workers=args.workers or 1, overwrite=args.overwrite, layout=args.layout)
    try:
        summary = pack_path(args.source, args.out, opts, classes=args.classes, root=args.root)
    except PackError as exc:
        print(f"shardfs: pack failed: {exc}", file=sys.stderr)
        return 1
    for name in summary.oversized[:5]:
        print(f"shardfs: warning: {name} alone is larger than --shard-size: it has a shard of its own",
              file=sys.stderr)
    print(summary.line())
    print(f"manifest: {summary.manifest}")
    return 0


def cmd_verify(args) -> int:
    from shardfs.pack.verify import verify

    _configure_remote(args)
    from shardfs.formats.datafile import Columns

    result = verify(args.sources, decode=args.decode, workers=args.workers, columns=Columns.parse(args.columns))
    print(result.line())
    return 1 if result.problems else 0


def _names_something(word: str) -> bool:
    """A URL, or a path or glob that names something on disk."""
    from shardfs.storage.base import is_url

    return is_url(word) or os.path.lexists(word) or bool(glob.has_magic(word) and glob.glob(word))


def cmd_ls(args) -> int:
    from shardfs.view.dataset import open_dataset
    from shardfs.pack.listing import list_path

    from shardfs.view.layouts import from_options

    _configure_remote(args)
    sources, path = args.sources, args.path
    if path is None and len(sources) > 1 and not _names_something(sources[-1]):
        sources, path = sources[:-1], sources[-1]  # the older form `shardfs ls SRC PATH`
    layout = from_options(args.layout or "plain", args.class_names)
    from shardfs.formats.datafile import Columns
    ds = open_dataset(sources, index_dir=args.index_dir, layout=layout, columns=Columns.parse(args.columns))
    for line in ds.problems:
        print(f"shardfs: warning: {line}", file=sys.stderr)
    try:
        list_path(ds.tree, path or "", long=args.long, recursive=args.recursive)
        sys.stdout.flush()
    except BrokenPipeError:  # `shardfs ls ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def layout_options(group) -> None:
    group.add_argument("--layout", choices=["plain", "imagefolder"],
                       help="plain: members as stored (default); imagefolder: WebDataset samples "
                            "(<key>.jpg + <key>.cls) as <class>/<key>.jpg for torchvision's ImageFolder")
    group.add_argument("--class-names", metavar="FILE",
                       help="imagefolder: class folder names, one per line (label i = line i); "
                            "default: the labels, zero-padded")
    columns_option(group)


def columns_option(group) -> None:
    group.add_argument("--columns", metavar="image=COL,label=COL",
                       help="Parquet, Arrow and HDF5 files: the columns holding the image bytes and the label "
                            "(default: found by convention: image/label, image_data/label, images/targets)")


class _OneLineParser(argparse.ArgumentParser):
    """argparse's errors in one line like every other error, pointing at --help for the usage."""

    def error(self, message: str):
        command = self.prog.removeprefix("shardfs").strip()
        usage = f" (see {self.prog} --help)" if self.add_help else ""
        self.exit(2, f"shardfs: {command + ': ' if command else ''}{message}{usage}\n")


def _at_least(low: int | float, kind=int):
    """An argparse type: a number of ``kind`` no smaller than ``low``."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {'whole ' if kind is int else ''}number, got {text!r}")
        if not value >= low:  # also refuses nan
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {text}")
        return value
    return parse


def _folder(read_only_ok: bool = False):
    """An argparse type: a folder files can be made in (created as needed); see unusable_folder."""
    def check(path: str) -> str:
        from shardfs.storage.placement import unusable_folder

        why = unusable_folder(path, read_only_ok)
        if why:
            raise argparse.ArgumentTypeError(why)
        return path
    return check


def _positive_seconds(text: str) -> float:
    value = _at_least(0.0, float)(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be more than 0 seconds")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="shardfs", description="Mount directories of dataset shards read-only.")
    parser.add_argument("--version", action="version", version=f"shardfs {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                        help="default: info (or the configuration file's)")
    sub = parser.add_subparsers(dest="subcommand", required=True)

    def add(name, parents=(), **kw):
        return sub.add_parser(name, parents=[common, *parents], **kw)

    for add_command in (_add_mount, _add_run, _add_status, _add_umount, _add_index, _add_stats, _add_cache,
                        _add_pack, _add_verify, _add_ls):
        add_command(add)
    return parser


def _mount_options() -> argparse.ArgumentParser:
    """The options of `mount` and `run`."""
    mount_options = argparse.ArgumentParser(add_help=False)
    m = mount_options.add_argument_group("mount options")
    m.add_argument("-o", action="append", metavar="OPTS",
                   help="mount options, as in fstab: allow_other, cache_size=64G, prefetch=all, ...")
    m.add_argument("--cache-size", metavar="SIZE",
                   help="RAM budget for shard bytes: 64G, 512M, or a share like 50%% of the memory this process "
                        "may use (the node's available memory or its cgroup's room; default: 50%%)")
    m.add_argument("--prefetch", choices=["touched", "all"],
                   help="load each shard when first read (default), or stream every shard in at mount")
    m.add_argument("--loaders", type=int,
                   help="shards loaded at once in the background (default 2; 8 when shards are remote)")
    m.add_argument("--option", action="append", metavar="KEY=VALUE",
                   help="storage option for s3:// and http(s):// sources, passed to fsspec (s3fs, "
                        "HTTPFileSystem): endpoint_url=http://host:9000, anon=true, key=..., secret=...; repeat it")
    m.add_argument("--index-dir", help="where indexes go when the shard directory is read-only "
                                       "(default $XDG_CACHE_HOME/shardfs)")
    m.add_argument("--workers", type=int, help="indexes built at once (tar, zip and SquashFS: three threads each, "
                                               "some parse while others read; processes for Parquet, Arrow, HDF5 "
                                               "and lz4 shards; default: the cores, up to 8)")
    m.add_argument("--no-auto-unmount", action="store_true",
                   help="leave a stale mount if the daemon is killed (default: fusermount3 unmounts it)")
    m.add_argument("--log-file", help="daemon log (default under $XDG_CACHE_HOME/shardfs/logs)")
    m.add_argument("--disk-cache", metavar="DIR",
                   help="keep shards on node-local disk in DIR (shared by your mounts on the node; "
                        "'off' for none). Default: none; `shardfs run` in a batch job uses the job's "
                        "local scratch, the systemd unit its CacheDirectory")
    m.add_argument("--disk-cache-size", metavar="SIZE",
                   help="bound of the disk tier: 800G, or a share of the free space in DIR like 80%% (default 80%%)")
    m.add_argument("--peers", metavar="HOST:PORT,...",
                   help="the nodes that serve shards to each other (one owner per shard reads shared storage), "
                        "or @FILE (one per line), or 'off'. Default: none; `shardfs run` in a Slurm job with "
                        "more than one node uses the job's nodes, port 10000 + job id %% 10000")
    m.add_argument("--peer-self", metavar="HOST:PORT",
                   help="this node's entry in --peers (default: the one whose host is this machine's name "
                        "or one of its addresses); the peer server listens there only")
    m.add_argument("--metrics-dir", metavar="DIR",
                   help="write Prometheus metrics to DIR (node_exporter's --collector.textfile.directory)")
    m.add_argument("--metrics-interval", type=float, metavar="S", help="seconds between metrics writes (default 15)")
    layout_options(m)
    return mount_options


def _remote_options() -> argparse.ArgumentParser:
    """The storage option of the commands that read shards without mounting."""
    remote_options = argparse.ArgumentParser(add_help=False)
    remote_options.add_argument("--option", action="append", metavar="KEY=VALUE",
                                help="storage option for s3:// and http(s):// sources (see mount --option)")
    return remote_options


def _add_mount(add) -> None:
    p = add("mount", parents=[_mount_options()], help="mount shards as one read-only tree")
    p.add_argument("paths", nargs="*", metavar="SRC... MOUNTPOINT",
                   help="directories of shards, shard files or globs, then the mountpoint")
    p.add_argument("--config", metavar="FILE", help="read everything from a TOML file (see systemd/example.toml)")
    p.add_argument("-f", "--foreground", action="store_true", help="stay attached (systemd, debugging)")
    p.add_argument("--ready-timeout", type=_positive_seconds, default=300.0, metavar="S",
                   help="give up when the starting daemon reports no progress (a shard indexed) for S "
                        "seconds, e.g. on a hung filesystem (default 300)")
    p.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_mount)


def _add_run(add) -> None:
    p = add("run", parents=[_mount_options()], help="mount, run a command, unmount; exit with its status",
            usage="shardfs run [options] SRC [SRC...] [MOUNTPOINT | -m MOUNTPOINT] -- COMMAND [ARG...]",
            description="Mount SRC, run COMMAND with the mount live (its path in $SHARDFS_MOUNT), unmount, "
                        "and exit with COMMAND's status. Without MOUNTPOINT (a single SRC) a private "
                        "temporary directory is used. COMMAND gets each signal once (see the README).")
    p.add_argument("paths", nargs="+", metavar="SRC [SRC...] [MOUNTPOINT]",
                   help="the last word is the mountpoint if it does not exist (created, removed "
                        "afterwards) or is an empty directory, else an error: use -m")
    p.add_argument("-m", "--mountpoint", help="the mountpoint; every positional word is then a source")
    p.set_defaults(func=cmd_run)


def _add_status(add) -> None:
    p = add("status", help="every shardfs mount on this node: source, state, figures")
    p.add_argument("mountpoint", nargs="?", metavar="MOUNTPOINT")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)


def _add_umount(add) -> None:
    p = add("umount", aliases=["unmount"], help="unmount and wait for the daemon to exit")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument("-z", "--lazy", action="store_true", help="detach now even if files are open")
    p.add_argument("--wait", type=_at_least(0.0, float), default=30.0, metavar="S",
                   help="seconds to wait for the daemon to exit; exit status 1 if it is still running (default 30)")
    p.set_defaults(func=cmd_umount)


def _add_index(add) -> None:
    p = add("index", parents=[_remote_options()], help="build shard indexes ahead of time")
    p.add_argument("sources", nargs="+", metavar="SRC")
    p.add_argument("--index-dir", type=_folder())
    p.add_argument("--workers", type=_at_least(1),
                   help="indexes built at once (tar, zip and SquashFS: three threads each; default: the cores)")
    p.add_argument("--rebuild", action="store_true", help="rebuild even if current")
    columns_option(p)
    p.set_defaults(func=cmd_index)


def _add_stats(add) -> None:
    p = add("stats", help="figures of a live mount")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument("--json", action="store_true", help="same as --format json")
    p.add_argument("--format", choices=["text", "json", "prometheus"], default="text",
                   help="prometheus: the exposition format (metrics shardfs_*)")
    p.add_argument("--watch", action="store_true", help="a live view, refreshed every --interval seconds")
    p.add_argument("--interval", type=_positive_seconds, default=1.0, metavar="S", help="--watch: seconds between refreshes")
    p.add_argument("--count", type=_at_least(1), metavar="N", help="--watch: stop after N refreshes (default: until Ctrl-C)")
    p.set_defaults(func=cmd_stats)


def _add_cache(add) -> None:
    p = add("cache", help="list or empty a disk-tier directory (--disk-cache DIR)")
    p.add_argument("action", choices=["ls", "clear"], help="clear skips shards a live mount has open")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--json", action="store_true", help="ls: one record per cached shard")
    p.set_defaults(func=cmd_cache)


def _add_pack(add) -> None:
    p = add("pack", help="pack a folder or a path-to-label list into shards",
            description="Pack an ImageFolder-style directory (members keep their path relative to SRC) or a "
                        "mapping file (JSON {path: label} or 'path label' lines; members become "
                        "<class>/<basename>) into tar or lz4 shards, with a manifest beside them.")
    p.add_argument("source", metavar="SRC", help="directory, or mapping file (.json or text)")
    p.add_argument("out", metavar="OUT", help="output directory (created)")
    p.add_argument("--prefix", help="shard names <prefix>-000000.tar, ... (default: SRC's name)")
    p.add_argument("--format", choices=["tar", "lz4"], default="tar")
    p.add_argument("--shard-size", default="1G", metavar="SIZE", help="largest shard file (default 1G)")
    p.add_argument("--shard-members", type=int, metavar="N", help="most members per shard")
    p.add_argument("--block-size", default="1M", metavar="SIZE", help="lz4 block size (default 1M)")
    p.add_argument("--shuffle", action="store_true", help="shuffle members across shards (default: sorted)")
    p.add_argument("--seed", type=int, help="shuffle seed (implies --shuffle; default 0)")
    p.add_argument("--classes", metavar="FILE", help="mapping: class names, one per line (label i = line i)")
    p.add_argument("--root", metavar="DIR", help="mapping: paths are relative to DIR (default: the file's directory)")
    p.add_argument("--under", default="", metavar="DIR", help="put every member below DIR (e.g. train)")
    p.add_argument("--mtime", type=int, metavar="SECONDS", help="every member's mtime (default: the source file's)")
    p.add_argument("--workers", type=_at_least(1), help="processes writing shards (output does not depend on it; default 1)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier pack of the same prefix in OUT")
    p.add_argument("--layout", choices=["plain", "webdataset"], default="plain",
                   help="webdataset: each image as <key>.<ext> + <key>.cls (its label), class list in "
                        "OUT/classes.txt (mount with --layout imagefolder --class-names OUT/classes.txt)")
    p.set_defaults(func=cmd_pack)


def _add_verify(add) -> None:
    p = add("verify", parents=[_remote_options()],
            help="check shards: structure, manifest sha256, optionally decode images")
    p.add_argument("sources", nargs="+", metavar="SRC", help="directory of shards, shard file, glob or URL")
    p.add_argument("--decode", action="store_true", help="also open every image member with Pillow")
    p.add_argument("--workers", type=_at_least(1), help="processes checking shards (default: up to 8)")
    columns_option(p)
    p.set_defaults(func=cmd_verify)


def _add_ls(add) -> None:
    p = add("ls", parents=[_remote_options()], help="list the merged tree without mounting")
    p.add_argument("sources", nargs="+", metavar="SRC",
                   help="directories of shards, shard files, globs or URLs: merged as `mount` merges them")
    p.add_argument("--path", metavar="PATH", help="directory or file in the tree (default: the root); "
                                                  "`shardfs ls SRC PATH` also works when PATH is no file on disk")
    p.add_argument("-l", dest="long", action="store_true", help="long format: mode, size, mtime, shard")
    p.add_argument("-R", dest="recursive", action="store_true", help="list subdirectories recursively")
    p.add_argument("--index-dir", type=_folder(read_only_ok=True))
    layout_options(p)
    p.set_defaults(func=cmd_ls)


COMMANDS = ("mount", "run", "status", "umount", "unmount", "index", "stats", "cache", "pack", "verify", "ls")


def _looks_like_source(word: str) -> bool:
    """A path, URL or glob (the fstab shorthand "shardfs SRC MOUNTPOINT"), not a mistyped command."""
    return "/" in word or any(c in word for c in "*?[{") or os.path.exists(word)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    given = list(argv)
    from shardfs.service.userns import enter_if_asked

    try:
        enter_if_asked()  # `shardfs run` started again to mount in a user namespace (userns.py)
    except (ShardfsError, OSError) as exc:
        return _report(exc)
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        if not _looks_like_source(argv[0]):
            close = difflib.get_close_matches(argv[0], COMMANDS, n=1)
            hint = f" (did you mean {close[0]}?)" if close else f" (commands: {', '.join(COMMANDS)})"
            print(f"shardfs: unknown command {argv[0]!r}{hint}", file=sys.stderr)
            return 2
        # mount.fuse3 (fstab type fuse.shardfs) runs "shardfs SRC MOUNTPOINT -o OPTIONS"
        argv.insert(0, "mount")
    command: list[str] = []
    if argv and argv[0] == "run" and "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    args = build_parser().parse_args(argv)
    args.command, args.argv = command, given
    _setup_logging(args.log_level or "info")
    try:
        return args.func(args)
    except (ShardfsError, OSError) as exc:
        return _report(exc)
    except KeyboardInterrupt:
        return 130


def _report(exc: ShardfsError | OSError) -> int:
    """An error that ends the command: one line (the traceback only at --log-level debug), its status."""
    log.debug("the error's traceback:", exc_info=exc)
    error = one_line(exc)
    print(f"shardfs: {error}", file=sys.stderr)
    return error.exit_code


def mount_helper(argv: list[str] | None = None) -> int:
    """``mount.shardfs SPEC DIR [-sfnv] [-N NS] [-o OPTIONS]``: what mount(8) runs for fstab type "shardfs"
    (link it as /sbin/mount.shardfs). fstab type "fuse.shardfs" works without it, through mount.fuse3."""
    parser = _OneLineParser(prog="mount.shardfs", add_help=False)
    parser.add_argument("spec")
    parser.add_argument("dir")
    parser.add_argument("-o", dest="options", default="")
    parser.add_argument("-t", dest="type")
    parser.add_argument("-N", dest="namespace")
    for flag in "sfnvr":
        parser.add_argument(f"-{flag}", action="store_true")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    from shardfs.fuse.devfd import descriptor

    served = descriptor(args.dir) is not None  # a /dev/fd/N its caller mounted: -f is --foreground
    if args.f and not served:  # "fake": mount(8) asks us to do everything but the mount
        return 0
    return main(["mount", args.spec, args.dir, *(["-o", args.options] if args.options else []),
                 *(["--foreground"] if args.f else [])])
