"""The configuration file (service/config.py: TOML, for services), from the file's bytes.

Beyond "no crash": a file is either refused with a UsageError (which names the file) or gives a
MountConfig whose every field has its declared type and passes the checks; and that config says
the same thing once it crosses to the daemon: ``to_args`` (the command line `shardfs mount`
starts the daemon with) parsed by the daemon's own command line (cli.py) gives the same config
(storage options excepted: they go through the environment).

Host names in ``peers`` are resolved from /etc/hosts only (numeric addresses as they are): the
loader asks which peer is this machine, and through the network's resolver each made-up name was
a DNS query, so the fuzzer spent 96% of its time waiting (154 inputs/s, 21 CPU seconds in 600).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket

from fuzzlib import write_scratch

from shardfs import cli
from shardfs.errors import UsageError
from shardfs.service import config

_RESOLVE = socket.getaddrinfo


def _hosts_file() -> set[str]:
    names = set()
    try:
        with open("/etc/hosts") as f:
            for line in f:
                names.update(n.lower() for n in line.split("#", 1)[0].split()[1:])
    except OSError:
        pass
    return names


_HOSTS = _hosts_file()


def _no_dns(host, port, *args, **kwargs):
    """getaddrinfo answering numeric addresses and /etc/hosts names, with no query on the network."""
    if isinstance(host, str) and host.lower() in _HOSTS:
        return _RESOLVE(host, port, *args, **kwargs)
    flags = kwargs.pop("flags", 0) | socket.AI_NUMERICHOST
    return _RESOLVE(host, port, *args, flags=flags, **kwargs)


@contextlib.contextmanager
def _resolver_without_dns():
    fqdn = socket.getfqdn
    socket.getaddrinfo, socket.getfqdn = _no_dns, lambda name="": name or socket.gethostname()
    try:
        yield
    finally:
        socket.getaddrinfo, socket.getfqdn = _RESOLVE, fqdn

# (paths the daemon is given as absolute: it runs in /)
_ABSOLUTE = ("class_names", "metrics_dir", "disk_cache")


def one_input(data: bytes) -> None:
    path = write_scratch("fuzz.toml", data)
    try:
        with _resolver_without_dns():
            cfg = config.load_config(path)
    except UsageError as exc:
        assert path in str(exc) or "fuzz.toml" in str(exc) or "--" in str(exc), f"a message not naming the file: {exc}"
        return
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name in config._KEYS and value is not None:
            types = config._KEYS[f.name][0]
            assert isinstance(value, types) and not (isinstance(value, bool) and bool not in types), \
                f"{f.name} = {value!r} after loading"
    args = config.to_args(cfg)
    try:
        parsed = cli.build_parser().parse_args(["mount", *args])
    except SystemExit:
        raise AssertionError(f"the daemon's command line refuses what to_args made of a good config: {args}") from None
    with _resolver_without_dns():
        again = cli._mount_config(parsed)
    for f in dataclasses.fields(cfg):
        if f.name == "storage_options":
            continue
        mine, theirs = getattr(cfg, f.name), getattr(again, f.name)
        if f.name in _ABSOLUTE and mine not in (None, "off"):
            mine = os.path.abspath(mine)
        if f.name in ("sources", "mountpoint"):  # ("./-x" for "-x": the same path)
            mine, theirs = _same_paths(mine), _same_paths(theirs)
        if f.name == "metrics_interval" and cfg.metrics_dir is None:
            continue  # (not passed without a metrics directory: it means nothing then)
        if f.name == "metrics_interval":  # (an int in the file, a float on the command line)
            mine, theirs = float(mine), float(theirs)
        assert str(mine) == str(theirs) if f.name in ("cache_size", "disk_cache_size") \
            else mine == theirs, f"{f.name}: {mine!r} in the file, {theirs!r} in the daemon"


def _same_paths(value):
    return [os.path.normpath(p) for p in value] if isinstance(value, list) else os.path.normpath(value)


def seeds() -> list[bytes]:
    example = os.path.join(os.path.dirname(__file__), "..", "..", "..", "systemd", "example.toml")
    with open(example, "rb") as f:
        out = [f.read()]
    out += [
        b'sources = ["/data/a", "/data/b"]\nmountpoint = "/mnt/x"\ncache_size = "64G"\nprefetch = "all"\n'
        b'loaders = 4\nallow_other = true\nlog_level = "debug"\nauto_unmount = false\nlayout = "imagefolder"\n',
        b'sources = "/data"\nmountpoint = "/mnt"\npeers = ["node1:7000", "node2:7000"]\npeer_self = "node1:7000"\n',
        b'sources = ["s3://bucket/x/"]\nmountpoint = "m"\n[storage_options]\nendpoint_url = "http://127.0.0.1:9"\n',
        b'sources = ["/d"]\nmountpoint = "/m"\ncolumns = "image=img,label=cls"\ndisk_cache = "off"\ncache_size = 1024\n',
        b'sources = ["/d"]\nmountpoint = "/m"\nmetrics_dir = "/tmp"\nmetrics_interval = 2.5\nworkers = 3\n',
        b'sources = []\nmountpoint = "/m"\n',  # refused
        b'sources = ["/d"]\nmountpoint = "/m"\nloaders = true\n',  # refused: a bool for a number
    ]
    return out
