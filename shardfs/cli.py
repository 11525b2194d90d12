"""The ``shardfs`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from . import __version__
from .errors import UsageError

log = logging.getLogger("shardfs")


def _setup_logging(level: str, log_file: str | None = None) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        os.makedirs(os.path.dirname(os.path.abspath(log_file)), exist_ok=True)
        handlers.append(logging.FileHandler(log_file))
    logging.basicConfig(level=level.upper(), format="shardfs %(levelname)s: %(message)s", handlers=handlers)


def _mount_options(args):
    from .daemon import MountOptions

    from .cache import parse_size

    opts = MountOptions(index_dir=args.index_dir, workers=args.workers, cache_size=args.cache_size,
                        prefetch=args.prefetch, loaders=args.loaders)
    if args.cache_size:
        try:
            parse_size(args.cache_size)
        except ValueError as exc:
            raise UsageError(f"--cache-size: {exc}") from None
    if args.loaders < 1:
        raise UsageError("--loaders must be at least 1")
    for opt in ",".join(args.o or []).split(","):
        if not opt or opt in ("ro", "default_permissions"):
            continue  # always on
        if opt == "allow_other":
            opts.allow_other = True
        else:
            raise UsageError(f"unknown mount option -o {opt} (known: allow_other, ro)")
    return opts


def cmd_mount(args) -> int:
    from . import mount

    opts = _mount_options(args)
    if not args.foreground:
        passthrough = ["--log-level", args.log_level]
        if args.o:
            passthrough += ["-o", ",".join(args.o)]
        if args.index_dir:
            passthrough += ["--index-dir", args.index_dir]
        if args.workers:
            passthrough += ["--workers", str(args.workers)]
        if args.cache_size:
            passthrough += ["--cache-size", args.cache_size]
        passthrough += ["--prefetch", args.prefetch, "--loaders", str(args.loaders)]
        return mount.mount_detached(args.sources, args.mountpoint, passthrough, args.log_file)

    from .daemon import serve
    from .fuselib import check_can_mount

    check_can_mount()
    if args.ready_fd is None:
        mount.prepare_mountpoint(args.mountpoint)

    def detach() -> None:
        # Started by `shardfs mount` without --foreground: from now on log to the file only.
        if args.ready_fd is not None and args.log_file:
            root = logging.getLogger()
            for h in [h for h in root.handlers if type(h) is logging.StreamHandler]:
                root.removeHandler(h)
            fd = os.open(args.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(fd, 2)
            os.close(fd)

    return serve(args.sources, args.mountpoint, opts, ready_fd=args.ready_fd, on_detach=detach)


def cmd_umount(args) -> int:
    from .mount import unmount

    return unmount(args.mountpoint, lazy=args.lazy)


def cmd_index(args) -> int:
    from tqdm import tqdm

    from .dataset import index_shards
    from .sources import find_shards

    paths = find_shards(args.sources)
    bad = members = built = 0
    with tqdm(total=len(paths), unit="shard", disable=None, file=sys.stderr) as bar:
        for path, ix, how in index_shards(paths, args.index_dir, args.workers or os.cpu_count() or 1, args.rebuild):
            bar.update(1)
            if ix is None:
                bad += 1
                tqdm.write(f"error: {how}", file=sys.stderr)
                continue
            members += len(ix)
            built += how.startswith("built")
            for line in ix.warnings + ([ix.error] if ix.error else []):
                tqdm.write(f"warning: {line}", file=sys.stderr)
            bad += ix.error is not None
    print(f"{len(paths)} shards, {members} members; {built} indexes built, {len(paths) - built - bad} current; "
          f"{bad} with errors")
    return 1 if bad else 0


def cmd_stats(args) -> int:
    from .stats import STATS_XATTR

    try:
        data = json.loads(os.getxattr(args.mountpoint, STATS_XATTR))
    except OSError as exc:
        raise UsageError(f"{args.mountpoint}: not a live shardfs mount ({exc.strerror})") from None
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    width = max(len(k) for k in data)
    for key, value in data.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in sorted(value.items()))
        print(f"{key:<{width}}  {value}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shardfs", description="Mount directories of dataset shards read-only.")
    parser.add_argument("--version", action="version", version=f"shardfs {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True)
    add = lambda name, **kw: sub.add_parser(name, parents=[common], **kw)  # noqa: E731

    p = add("mount", help="mount shards as one read-only tree")
    p.add_argument("sources", nargs="+", metavar="SRC", help="directory of shards, shard file, or glob")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument("-f", "--foreground", action="store_true", help="stay attached (systemd, debugging)")
    p.add_argument("-o", action="append", metavar="OPTS", help="mount options: allow_other")
    p.add_argument("--index-dir", help="where indexes go when the shard directory is read-only "
                                       "(default $XDG_CACHE_HOME/shardfs)")
    p.add_argument("--workers", type=int, help="processes that build missing indexes")
    p.add_argument("--cache-size", metavar="SIZE",
                   help="RAM budget for shard bytes: 64G, 512M, or a share of RAM like 50%% "
                        "(default: half of the memory available at mount)")
    p.add_argument("--prefetch", choices=["touched", "all"], default="touched",
                   help="load each shard when first read (default), or stream every shard in at mount")
    p.add_argument("--loaders", type=int, default=2, help="shards loaded at once in the background (default 2)")
    p.add_argument("--log-file", help="daemon log (default under $XDG_CACHE_HOME/shardfs/logs)")
    p.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_mount)

    p = add("umount", aliases=["unmount"], help="unmount and wait for the daemon to exit")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument("-z", "--lazy", action="store_true", help="detach now even if files are open")
    p.set_defaults(func=cmd_umount)

    p = add("index", help="build shard indexes ahead of time")
    p.add_argument("sources", nargs="+", metavar="SRC")
    p.add_argument("--index-dir")
    p.add_argument("--workers", type=int)
    p.add_argument("--rebuild", action="store_true", help="rebuild even if current")
    p.set_defaults(func=cmd_index)

    p = add("stats", help="figures of a live mount")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_stats)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level, args.log_file if getattr(args, "foreground", False) else None)
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"shardfs: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
