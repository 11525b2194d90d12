"""Turn the SRC arguments of the command line into a sorted list of shard files or URLs."""

from __future__ import annotations

import fnmatch
import glob
import logging
import os

from shardfs.errors import UsageError
from shardfs.formats import DATA_FORMATS, format_for, suffixes
from shardfs.redact import redact
from shardfs.storage.base import is_url

log = logging.getLogger(__name__)


def is_shard_url(url: str) -> bool:
    return format_for(url) is not None


def _is_shard(path: str) -> bool:
    return format_for(path) is not None and os.path.isfile(path)


def find_shards(sources: list[str]) -> list[str]:
    """Shard files named by SRC arguments: directories (see _shards_in), single shard files, or
    glob patterns; or remote ones (s3://bucket/prefix/, URLs with
    {000..146} brace ranges, see _remote_objects). Sorted by path, duplicates removed, so
    the order (and with it the duplicate-path rule) does not depend on argument order."""
    if not sources:
        raise UsageError("no SRC given: name a directory of shards, a shard file or a glob")
    found: set[str] = set()
    for src in sources:
        if is_url(src):
            found.update(obj.url for obj in _remote_objects(src))
        elif glob.has_magic(src) and not os.path.exists(src):
            matches = [p for p in glob.glob(src) if _is_shard(p)]
            if not matches:
                raise UsageError(f"{src}: the pattern matches no shard ({', '.join(suffixes())})")
            found.update(os.path.abspath(p) for p in matches)
        elif os.path.isdir(src):
            found.update(os.path.abspath(p) for p in _shards_in(src))
        elif os.path.isfile(src):
            if format_for(src) is None:
                raise UsageError(f"{src}: not a shard (expected one of {', '.join(suffixes())})")
            found.add(os.path.abspath(src))
        else:
            raise UsageError(f"{src}: no such file or directory")
    return sorted(found)


# How far below a directory without shards at its top its dataset files are looked for: a hub
# cache's `snapshots/REV/data/x.parquet` is 3 folders down. The entries are capped too: a folder of
# extracted images named by mistake must not cost a walk of millions of names on shared storage.
SEARCH_DEPTH = 3
SEARCH_ENTRIES = 20_000


def _shards_in(folder: str) -> list[str]:
    """A directory's shards: those at its top. Where there are none, the dataset files (Parquet,
    Arrow, HDF5) below it (SEARCH_DEPTH folders down at most), as the hub's snapshots
    (`data/train-00000-of-00294.parquet`) and `datasets`' save_to_disk of several splits
    (`train/data-00000-of-00002.arrow`) keep them: each is placed under the split its name or
    folder says. Tar and lz4 shards below the top are not taken: their members carry their own
    paths, and a train/ and a val/ folder of shards would be merged into one tree (named with a
    glob they can be)."""
    top = [p for p in (os.path.join(folder, n) for n in os.listdir(folder)) if _is_shard(p)]
    if top:
        return top
    below, seen = [], 0
    for parent, dirs, files in os.walk(folder):  # symlinked files followed (the hub's cache), folders not
        seen += len(dirs) + len(files)
        if seen > SEARCH_ENTRIES:
            raise UsageError(f"{folder}: no shard at its top, and more than {SEARCH_ENTRIES:,} entries below it "
                             "were searched in vain: name the folder that holds the shards, or a glob of them")
        depth = os.path.relpath(parent, folder).count(os.sep) + (parent != folder)
        dirs[:] = [d for d in dirs if not d.startswith(".")] if depth < SEARCH_DEPTH else []
        below += [p for p in (os.path.join(parent, n) for n in files) if _is_shard(p)]
    data = [p for p in below if format_for(p).name in DATA_FORMATS]
    if data:
        log.info("%s: no shard at its top: mounting the %d dataset files in its subdirectories", folder, len(data))
        if len(data) < len(below):
            log.warning("%s: %d tar/lz4 shards below its top left out (name them with a glob, e.g. %s)", folder,
                        len(below) - len(data), os.path.join(folder, "*", "*.tar"))
        return data
    where = sorted({os.path.relpath(os.path.dirname(p), folder) for p in below})
    hint = (f"; shards in its subdirectories {', '.join(where[:5])}{' ...' if len(where) > 5 else ''}: name one "
            f"of them, or them all with a glob ({os.path.join(folder, '*', '*' + os.path.splitext(below[0])[1])})"
            if below else "")
    raise UsageError(f"{folder}: no shard found in this directory (looked for {', '.join(suffixes())} files){hint}")


def expand_braces(url: str) -> list[str]:
    """WebDataset's brace notation (``train-{000000..000146}.tar``, ``{a,b}``), expanded by the
    library WebDataset itself uses, so a URL names the same shards for both."""
    from braceexpand import braceexpand

    urls = list(braceexpand(url))
    if any("{" in u or "}" in u for u in urls):  # braceexpand leaves what it cannot expand
        raise UsageError(f"{redact(url)}: cannot expand its braces (expected {{000..146}} or {{a,b}})")
    return urls


def _remote_objects(src: str) -> list:
    """Shard objects named by one remote SRC: a prefix (``s3://b/p/``), a glob, a brace pattern, one URL."""
    from shardfs.storage.remote.errors import RemoteError  # network clients: only for URLs
    from shardfs.storage.remote.listing import info_many, list_folder

    shown = redact(src)
    try:
        if "{" in src:
            urls = expand_braces(src)
            bad = [u for u in urls if format_for(u) is None]
            if bad:
                raise UsageError(f"{shown}: {redact(bad[0])} is not a shard (expected {', '.join(suffixes())})")
            found = info_many(urls)
        elif src.endswith("/") or (src.startswith("s3://") and format_for(src) is None
                                   and not any(c in src for c in "*?[")):  # s3://bucket/prefix
            found = list_folder(src, is_shard_url)
            if not found:
                raise UsageError(f"{shown}: no shard found under this prefix (looked for {', '.join(suffixes())})")
        elif any(c in src for c in "*?["):
            folder = src[: src.rfind("/", 0, min(i for i in (src.find(c) for c in "*?[") if i >= 0)) + 1]
            found = [o for o in list_folder(folder, is_shard_url) if fnmatch.fnmatchcase(o.url, src)]
            if not found:
                raise UsageError(f"{shown}: the pattern matches no shard ({', '.join(suffixes())})")
        else:
            if format_for(src) is None:
                raise UsageError(f"{shown}: not a shard (expected one of {', '.join(suffixes())})")
            found = info_many([src])
    except RemoteError as exc:
        raise UsageError(str(exc)) from None
    return found
