"""The configuration file (TOML): everything the mount command line can say, for services.

Example: ``systemd/imagenet.toml``. Unknown keys and wrong types are errors that name
the key and the file, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass

from .cache import PREFETCH_POLICIES, parse_size
from .errors import UsageError

LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass
class MountConfig:
    sources: list[str]
    mountpoint: str
    cache_size: str | None = None
    prefetch: str = "touched"
    loaders: int = 2
    allow_other: bool = False
    index_dir: str | None = None
    workers: int | None = None
    log_level: str = "info"


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
}
_REQUIRED = ("sources", "mountpoint")


def _fail(path: str, key: str, why: str) -> UsageError:
    return UsageError(f"{path}: {key}: {why}")


def load_config(path: str) -> MountConfig:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such configuration file") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML: {exc}") from None
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
    cache_size = data.get("cache_size")
    if cache_size is not None:
        cache_size = str(cache_size)
        try:
            parse_size(cache_size)
        except ValueError as exc:
            raise _fail(path, "cache_size", str(exc)) from None
    if data.get("prefetch", "touched") not in PREFETCH_POLICIES:
        raise _fail(path, "prefetch", f"expected {_KEYS['prefetch'][1]}, got {data['prefetch']!r}")
    if data.get("log_level", "info") not in LOG_LEVELS:
        raise _fail(path, "log_level", f"expected {_KEYS['log_level'][1]}, got {data['log_level']!r}")
    for key in ("loaders", "workers"):
        if key in data and data[key] < 1:
            raise _fail(path, key, f"expected {_KEYS[key][1]}, got {data[key]}")
    return MountConfig(
        sources=sources,
        mountpoint=data["mountpoint"],
        cache_size=cache_size,
        prefetch=data.get("prefetch", "touched"),
        loaders=data.get("loaders", 2),
        allow_other=data.get("allow_other", False),
        index_dir=data.get("index_dir"),
        workers=data.get("workers"),
        log_level=data.get("log_level", "info"),
    )
