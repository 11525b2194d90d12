"""What a mount is told, from any of its three front doors, as one ``MountConfig``.

* the configuration file (TOML, for services; example: ``systemd/example.toml``):
  unknown keys and wrong types are errors naming the key and the file, so a typo never
  silently falls back to a default;
* the command line (``shardfs mount SRC MNT --cache-size 64G -o allow_other``);
* fstab / mount(8) options (``ro,allow_other,cache_size=64G``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from shardfs.storage.memory import parse_size
from shardfs.storage.placement import unusable_folder
from shardfs.storage.peers.addresses import check as check_peers
from shardfs.storage.peers.addresses import parse_list as parse_peers
from shardfs.storage.peers.addresses import pick_self
from shardfs.storage.ram import PREFETCH_POLICIES
from shardfs.errors import UsageError

LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass
class MountConfig:
    sources: list[str]
    mountpoint: str
    cache_size: str | None = None
    prefetch: str = "touched"
    loaders: int | None = None  # None: 2 for local shards, REMOTE_LOADERS when any is remote
    allow_other: bool = False
    index_dir: str | None = None
    workers: int | None = None
    log_level: str = "info"
    # fusermount3 unmounts when the daemon dies (a batch system's SIGKILL), so no stale
    # mount is left behind; off, a stale mount is cleaned by the next `shardfs mount`.
    auto_unmount: bool = True
    log_file: str | None = None
    layout: str = "plain"  # or "imagefolder": WebDataset samples as <class>/<key>.<ext> (layouts.py)
    class_names: str | None = None  # imagefolder: class names, one per line (label i = line i)
    columns: str | None = None  # dataset files: "image=COL,label=COL" (formats/datafile.py)
    # fsspec storage options for remote sources (endpoint_url, key, secret, anon, ...):
    # never on a command line the daemon is started with, never in logs.
    storage_options: dict = field(default_factory=dict)
    # node_exporter's textfile-collector directory: metrics written there every metrics_interval s
    metrics_dir: str | None = None
    metrics_interval: float = 15.0
    # the disk tier (storage/disk.py): a node-local directory, or "off" where a default would apply
    disk_cache: str | None = None
    disk_cache_size: str | None = None  # "800G", or a share of the free space in disk_cache: "80%"
    # the nodes that serve shards to each other (storage/peers), "HOST:PORT" each: None when none
    # were given (`shardfs run` then derives them in a Slurm job), [] for "off"; and this node's entry
    peers: list[str] | None = None
    peer_self: str | None = None


# key -> (accepted types, description used in messages)
_KEYS = {
    "sources": ((list, str), "a list of shard directories, files or globs"),
    "mountpoint": ((str,), "a path"),
    "cache_size": ((str, int), 'a size such as "64G" or "50%", or bytes'),
    "prefetch": ((str,), f"one of {', '.join(PREFETCH_POLICIES)}"),
    "loaders": ((int,), "a whole number >= 1"),
    "allow_other": ((bool,), "true or false"),
    "index_dir": ((str,), "a path"),
    "workers": ((int,), "a whole number >= 1"),
    "log_level": ((str,), f"one of {', '.join(LOG_LEVELS)}"),
    "auto_unmount": ((bool,), "true or false"),
    "log_file": ((str,), "a path"),
    "layout": ((str,), "plain or imagefolder"),
    "class_names": ((str,), "a path"),
    "columns": ((str,), '"image=COL,label=COL"'),
    "storage_options": ((dict,), "a table of fsspec storage options (endpoint_url, key, secret, ...)"),
    "metrics_dir": ((str,), "a directory (node_exporter's --collector.textfile.directory)"),
    "metrics_interval": ((int, float), "seconds between metrics writes (> 0)"),
    "disk_cache": ((str,), 'a directory on node-local disk, or "off"'),
    "disk_cache_size": ((str, int), 'a size such as "800G" or "80%" (of the free space there), or bytes'),
    "peers": ((list, str), 'a list of "HOST:PORT", or "@FILE" (one per line), or "off"'),
    "peer_self": ((str,), 'this node\'s entry among the peers, "HOST:PORT"'),
}
_REQUIRED = ("sources", "mountpoint")


def _fail(path: str, key: str, why: str) -> UsageError:
    return UsageError(f"{path}: {key}: {why}")


def load_config(path: str) -> MountConfig:
    try:  # here, not for every mount: --config only
        import tomllib
    except ImportError:  # Python 3.10: the same parser, from PyPI (tomllib is tomli, taken into 3.11)
        import tomli as tomllib
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such configuration file") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:  # tomllib decodes the whole file first (found by fuzzing)
        raise UsageError(f"{path}: not valid TOML: not UTF-8 at byte {exc.start}") from None
    return parse_config(data, path)


def parse_config(data: dict, path: str = "<config>") -> MountConfig:
    for key, value in data.items():
        if key not in _KEYS:
            raise _fail(path, key, f"unknown key (known: {', '.join(_KEYS)})")
        types, what = _KEYS[key]
        # bool is an int in Python: do not let `loaders = true` pass as 1
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise _fail(path, key, f"expected {what}, got {type(value).__name__} {value!r}")
    for key in _REQUIRED:
        if key not in data:
            raise _fail(path, key, "missing (required)")

    sources = data["sources"]
    if isinstance(sources, str):
        sources = [sources]
    if not sources or not all(isinstance(s, str) and s for s in sources):
        raise _fail(path, "sources", "expected a non-empty list of paths")
    cfg = MountConfig(sources=sources, **{k: v for k, v in data.items() if k != "sources"})
    for key in ("cache_size", "disk_cache_size"):
        if isinstance(getattr(cfg, key), int):
            setattr(cfg, key, str(getattr(cfg, key)))
    if isinstance(cfg.peers, str):
        try:
            cfg.peers = parse_peers(cfg.peers)
        except UsageError as exc:
            raise _fail(path, "peers", str(exc)) from None
    elif cfg.peers is not None and not all(isinstance(p, str) for p in cfg.peers):
        raise _fail(path, "peers", f"expected {_KEYS['peers'][1]}, got {cfg.peers!r}")
    elif cfg.peers is not None:  # as parse_list takes them: " b:2" is b:2 (the daemon's list must be the same)
        cfg.peers = [p.strip() for p in cfg.peers]
        if any("," in p for p in cfg.peers):  # the daemon's --peers would split it in two
            raise _fail(path, "peers", f"an entry with a comma in {cfg.peers!r}")
    check(cfg, lambda key, why: _fail(path, key, why))
    return cfg


def check(cfg: MountConfig, fail=lambda key, why: UsageError(f"{key}: {why}")) -> None:
    """Values the types alone do not rule out; ``fail(key, why)`` makes the error to raise."""
    for key in ("cache_size", "disk_cache_size"):
        if getattr(cfg, key) is not None:
            try:
                parse_size(getattr(cfg, key), room=1 << 30)  # the whole it is a share of comes later
            except ValueError as exc:
                raise fail(key, str(exc)) from None
    if cfg.prefetch not in PREFETCH_POLICIES:
        raise fail("prefetch", f"expected {_KEYS['prefetch'][1]}, got {cfg.prefetch!r}")
    if cfg.log_level not in LOG_LEVELS:
        raise fail("log_level", f"expected {_KEYS['log_level'][1]}, got {cfg.log_level!r}")
    for key in ("loaders", "workers"):
        value = getattr(cfg, key)
        if value is not None and value < 1:
            raise fail(key, f"expected {_KEYS[key][1]}, got {value}")
    if cfg.metrics_dir is not None and not os.path.isdir(cfg.metrics_dir):
        raise fail("metrics_dir", f"{cfg.metrics_dir} is not a directory")
    if cfg.log_file is not None and os.path.isdir(cfg.log_file):
        raise fail("log_file", f"{cfg.log_file} is a directory: name a file")
    _check_folders({"log_file": cfg.log_file and os.path.dirname(os.path.abspath(cfg.log_file)),
                    "metrics_dir": cfg.metrics_dir}, fail)
    if cfg.metrics_interval <= 0:
        raise fail("metrics_interval", f"expected {_KEYS['metrics_interval'][1]}, got {cfg.metrics_interval}")
    if cfg.layout not in ("plain", "imagefolder"):
        raise fail("layout", f"expected {_KEYS['layout'][1]}, got {cfg.layout!r}")
    if cfg.peers:
        try:  # here, so that a bad list stops `shardfs mount` and `run` before a daemon starts
            check_peers(cfg.peers)
            if len(cfg.peers) > 1 or cfg.peer_self is not None:
                cfg.peer_self = pick_self(cfg.peers, cfg.peer_self)
        except UsageError as exc:
            raise fail("peers", str(exc)) from None
    if cfg.class_names is not None:
        if cfg.layout != "imagefolder":
            raise fail("class_names", "applies to layout imagefolder only")
        from shardfs.view.layouts import read_classes

        try:  # here, so that `shardfs mount` fails before starting a daemon
            read_classes(cfg.class_names)
        except UsageError as exc:
            raise fail("class_names", str(exc)) from None
    if cfg.columns is not None:
        from shardfs.formats.datafile import Columns

        try:
            Columns.parse(cfg.columns)
        except UsageError as exc:
            raise fail("columns", str(exc)) from None


def check_storage_folders(cfg: MountConfig) -> None:
    """The index and disk-tier folders, where they are given: checked by the daemon as it starts, not
    by `shardfs mount`, which gives up on a daemon stuck there (a hung filesystem) in time. An index
    folder that is there may be read-only (indexes built by others)."""
    fail = lambda key, why: UsageError(f"--{key.replace('_', '-')}: {why}")  # noqa: E731
    _check_folders({"index_dir": cfg.index_dir}, fail, read_only_ok=True)
    _check_folders({"disk_cache": None if cfg.disk_cache == "off" else cfg.disk_cache}, fail)


def _check_folders(folders: dict[str, str | None], fail, read_only_ok: bool = False) -> None:
    for key, folder in folders.items():
        why = folder and unusable_folder(folder, read_only_ok)
        if why:
            raise fail(key, why)


# fstab options mount(8) passes along that mean nothing to us (the mount is always read-only).
_IGNORED_OPTIONS = {"ro", "rw", "defaults", "auto", "noauto", "user", "users", "nouser", "nofail", "_netdev",
                    "dev", "nodev", "suid", "nosuid", "exec", "noexec", "atime", "noatime", "relatime",
                    "default_permissions", "async", "sync"}
STORAGE_PREFIX = "storage_options."  # fstab: -o storage_options.endpoint_url=http://host:9000
_VALUE_OPTIONS = {"cache_size": str, "prefetch": str, "loaders": int, "workers": int, "index_dir": str,
                  "log_level": str, "log_file": str, "layout": str, "class_names": str, "columns": str,
                  "metrics_dir": str, "metrics_interval": float, "disk_cache": str, "disk_cache_size": str,
                  "peers": parse_peers, "peer_self": str}


def apply_options(cfg: MountConfig, text: str) -> None:
    """Apply ``-o`` options (``allow_other,cache_size=64G``), as given on the command line or in fstab.
    A comma inside a value is escaped with a backslash, as libfuse's option parser takes it
    (``columns=image=pixels\\,label=cls``); ``peers=a:1,b:2`` goes on over plain commas."""
    after_peers = False
    for opt in (part.replace("\\,", ",") for part in re.split(r"(?<!\\),", text)):
        key, sep, value = opt.partition("=")
        if after_peers and not sep and ":" in opt:  # peers=a:1,b:2: the list goes on
            cfg.peers.extend(parse_peers(opt))
            continue
        after_peers = key == "peers"
        if not opt or key in _IGNORED_OPTIONS or key.startswith(("x-", "comment=")):
            continue
        if key in ("allow_other", "auto_unmount") and not sep:
            setattr(cfg, key, True)
        elif key == "no_auto_unmount" and not sep:
            cfg.auto_unmount = False
        elif key.startswith(STORAGE_PREFIX) and sep and len(key) > len(STORAGE_PREFIX):
            from shardfs.storage.remote import parse_option

            name, typed = parse_option(opt[len(STORAGE_PREFIX):])
            cfg.storage_options[name] = typed
        elif key in _VALUE_OPTIONS and sep:
            try:
                setattr(cfg, key, _VALUE_OPTIONS[key](value))
            except ValueError:
                raise UsageError(f"-o {opt}: expected a number") from None
        else:
            known = ", ".join(["allow_other", "no_auto_unmount", *(f"{k}=" for k in _VALUE_OPTIONS),
                               f"{STORAGE_PREFIX}KEY="])
            raise UsageError(f"unknown mount option -o {key} (known: {known})")


def to_args(cfg: MountConfig) -> list[str]:
    """The ``shardfs mount`` arguments that say the same as ``cfg`` (to start the daemon).
    Storage options are not among them (they may hold credentials, and any user can read a
    command line): they go through the environment, see ``storage_env``."""
    # A path starting with "-" would read as an option (found by fuzzing): "./-x" is the same file.
    args = [*map(_not_an_option, cfg.sources), _not_an_option(cfg.mountpoint), *_option("log-level", cfg.log_level),
            *_option("prefetch", cfg.prefetch), *_option("layout", cfg.layout)]
    if cfg.class_names is not None:  # the daemon may run elsewhere than our working directory
        args += _option("class-names", os.path.abspath(cfg.class_names))
    if cfg.metrics_dir is not None:  # the daemon runs in /
        args += [*_option("metrics-dir", os.path.abspath(cfg.metrics_dir)),
                 *_option("metrics-interval", cfg.metrics_interval)]
    if cfg.disk_cache not in (None, "off"):
        args += _option("disk-cache", os.path.abspath(cfg.disk_cache))
    elif cfg.disk_cache == "off":
        args += ["--disk-cache", "off"]
    if cfg.peers is not None:
        args += _option("peers", ",".join(cfg.peers) or "off")
    for key in ("loaders", "cache_size", "disk_cache_size", "index_dir", "workers", "log_file", "peer_self",
                "columns"):
        if getattr(cfg, key) is not None:
            args += _option(key.replace("_", "-"), getattr(cfg, key))
    if cfg.allow_other:
        args += ["-o", "allow_other"]
    if not cfg.auto_unmount:
        args += ["--no-auto-unmount"]
    return args


def _not_an_option(path: str) -> str:
    return "./" + path if path.startswith("-") else path


def _option(name: str, value) -> list[str]:
    """``--name value``; ``--name=value`` for a value that starts with "-", which would read as an
    option of its own (found by fuzzing: peers = "-node:7")."""
    text = str(value)
    return [f"--{name}={text}"] if text.startswith("-") else [f"--{name}", text]


def storage_env(cfg: MountConfig) -> dict:
    """The environment that hands ``cfg.storage_options`` to a daemon or a `shardfs mount` we start."""
    import json
    import os

    from shardfs.storage.remote import OPTIONS_ENV

    env = dict(os.environ)
    if cfg.storage_options:
        env[OPTIONS_ENV] = json.dumps(cfg.storage_options)
    return env
