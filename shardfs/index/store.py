"""Where a shard's index is kept and found again: beside the shard (``SHARD.shardfs-idx``),
else in the cache directory; for a remote shard, in the cache keyed by URL, else uploaded
beside the object. An index is used only while it describes the shard as it is now."""

from __future__ import annotations

import hashlib
import io
import logging
import os
import zipfile

from shardfs.dirs import cache_dir
from shardfs.index.shard_index import INDEX_SUFFIX, OutdatedIndex, ShardIndex, build, load, save
from shardfs.storage.base import is_url
from shardfs.storage.local import LocalShard

log = logging.getLogger(__name__)


def cached_path(key: str, index_dir: str | None = None) -> str:
    """The index's file in the cache directory, for a shard's real path or URL."""
    tag = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return os.path.join(index_dir or cache_dir(), f"{os.path.basename(key)}.{tag}{INDEX_SUFFIX}")


def candidate_paths(shard_path: str, index_dir: str | None = None) -> list[str]:
    """Where an index may live: beside the shard first, then in the cache directory."""
    real = os.path.realpath(shard_path)
    return [real + INDEX_SUFFIX, cached_path(real, index_dir)]


def is_current(index: ShardIndex, st: os.stat_result) -> bool:
    return index.shard_size == st.st_size and index.shard_mtime_ns == st.st_mtime_ns


def _try_load(path, shown: str | None = None) -> ShardIndex | None:
    try:
        return load(path)
    except FileNotFoundError:
        return None
    except OutdatedIndex as exc:
        log.info("index %s: %s; rebuilding", shown or path, exc)
        return None
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        log.warning("ignoring unreadable index %s: %s", shown or path, exc)
        return None


def _save_first(index: ShardIndex, candidates: list[str], shard_path: str,
                how: str = "built") -> tuple[ShardIndex, str]:
    """Save in the first candidate place that takes it; ``how`` the index was obtained."""
    for path in candidates:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            save(index, path)
            index.stored_at = path
            return index, how
        except OSError:
            continue
    log.warning("%s: could not save its index anywhere (%s)", shard_path, ", ".join(candidates))
    return index, f"{how}, not saved"


def load_or_build_remote(url: str, index_dir: str | None = None, rebuild: bool = False) -> tuple[ShardIndex, str]:
    """A remote shard's index: from the local cache (keyed by URL), else from beside the object
    (``URL.shardfs-idx``, copied into the cache), else built by streaming the object once.
    Valid while the object's size and ETag (or Last-Modified) are those it was built from."""
    from shardfs.storage import remote  # network clients: only for URLs
    from shardfs.storage.remote import RemoteShard

    obj = remote.known_info(url)
    cached = cached_path(url, index_dir)
    if not rebuild:
        index = _try_load(cached)
        if index is not None and (index.shard_size, index.shard_tag) == (obj.size, obj.tag):
            index.stored_at = cached
            return index, "loaded"
        if index is not None:
            log.info("index %s is stale (%s changed); rebuilding", cached, url)
        beside = url + INDEX_SUFFIX
        data = None
        if remote.may_exist(beside):
            try:
                data = remote.read_whole(beside)
            except remote.RemoteError as exc:
                log.warning("cannot fetch %s (%s): building the index instead", beside, exc)
        index = _try_load(io.BytesIO(data), beside) if data else None
        # An index written by `shardfs index`/`pack` and uploaded with the shard knows the
        # local file's size and mtime, not the object's tag: its size must match.
        if index is not None and index.shard_size == obj.size and index.shard_tag in ("", obj.tag):
            index.shard_tag, index.shard_mtime_ns = obj.tag, obj.mtime_ns
            return _save_first(index, [cached], url, how="loaded")
        if index is not None:
            log.info("index %s does not match %s (size or tag differ); building one", beside, url)
    return _save_first(build(RemoteShard.of(obj)), [cached], url)


def load_or_build(shard_path: str, index_dir: str | None = None, rebuild: bool = False) -> tuple[ShardIndex, str]:
    """The shard's index and how it was obtained ("loaded", "built" or "built, not saved")."""
    if is_url(shard_path):
        return load_or_build_remote(shard_path, index_dir, rebuild)
    st = os.stat(shard_path)
    candidates = candidate_paths(shard_path, index_dir)
    if not rebuild:
        for path in candidates:
            index = _try_load(path)
            if index is None:
                continue
            if is_current(index, st):
                index.stored_at = path
                return index, "loaded"
            log.info("index %s is stale (shard changed); rebuilding", path)
    shard = LocalShard(shard_path, st.st_size, st.st_mtime_ns, sequential=True)
    try:
        return _save_first(build(shard), candidates, shard_path)
    finally:
        shard.close()
