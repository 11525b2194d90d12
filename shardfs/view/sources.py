"""Turn the SRC arguments of the command line into a sorted list of shard files or URLs."""

from __future__ import annotations

import glob
import os

from shardfs.errors import UsageError
from shardfs.formats import format_for, suffixes


def is_url(src: str) -> bool:
    return src.startswith(("s3://", "http://", "https://"))


def _is_shard(path: str) -> bool:
    return format_for(path) is not None and os.path.isfile(path)


def find_shards(sources: list[str]) -> list[str]:
    """Shard files named by SRC arguments: directories (their shards, not recursive),
    single shard files, or glob patterns; or remote ones (s3://bucket/prefix/, URLs with
    {000..146} brace ranges, see shardfs.storage.remote). Sorted by path, duplicates removed, so
    the order (and with it the duplicate-path rule) does not depend on argument order."""
    if not sources:
        raise UsageError("no SRC given: name a directory of shards, a shard file or a glob")
    found: set[str] = set()
    for src in sources:
        if is_url(src):
            from shardfs.storage.remote import find_objects

            found.update(obj.url for obj in find_objects(src))
        elif glob.has_magic(src) and not os.path.exists(src):
            matches = [p for p in glob.glob(src) if _is_shard(p)]
            if not matches:
                raise UsageError(f"{src}: the pattern matches no shard ({', '.join(suffixes())})")
            found.update(os.path.abspath(p) for p in matches)
        elif os.path.isdir(src):
            matches = [os.path.join(src, n) for n in os.listdir(src)]
            matches = [p for p in matches if _is_shard(p)]
            if not matches:
                raise UsageError(
                    f"{src}: no shard found in this directory (looked for {', '.join(suffixes())} files)"
                )
            found.update(os.path.abspath(p) for p in matches)
        elif os.path.isfile(src):
            if format_for(src) is None:
                raise UsageError(f"{src}: not a shard (expected one of {', '.join(suffixes())})")
            found.add(os.path.abspath(src))
        else:
            raise UsageError(f"{src}: no such file or directory")
    return sorted(found)
