"""Where a shard's index is kept and found again: beside the shard (``SHARD.shardfs-idx``),
else in the cache directory; for a remote shard, in the cache keyed by URL, else uploaded
beside the object. An index is used only while it describes the shard as it is now: a local
one by the file's size and mtime, a remote one by the object's ETag or, for an index written
elsewhere, by a fingerprint of the object's bytes."""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import os
import stat
import threading

from shardfs.dirs import cache_dir
from shardfs.index import fingerprint
from shardfs.index.index_file import OutdatedIndex, file_id, load, save
from shardfs.index.member_columns import MemberColumns
from shardfs.formats import DATA_FORMATS
from shardfs.formats.datafile import Columns
from shardfs.index.shard_index import INDEX_SUFFIX, ShardIndex, build
from shardfs.storage.base import is_url
from shardfs.storage.local import LocalShard

log = logging.getLogger(__name__)


def cached_path(key: str, index_dir: str | None = None) -> str:
    """The index's file in the cache directory, for a shard's real path or URL."""
    tag = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return os.path.join(index_dir or cache_dir(), f"{os.path.basename(key)}.{tag}{INDEX_SUFFIX}")


def candidate_paths(shard_path: str, index_dir: str | None = None) -> list[str]:
    """Where an index may live: beside the shard first, then in the cache directory."""
    real = _realpath(shard_path)
    return [real + INDEX_SUFFIX, cached_path(real, index_dir)]


def _realpath(path: str) -> str:
    """os.path.realpath, with the directory's resolved once for all its shards (a remount of
    2,000 shards spent 0.1 s resolving the same directory again and again)."""
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            return os.path.realpath(path)
    except OSError:
        return os.path.realpath(path)
    head, tail = os.path.split(os.path.abspath(path))
    return os.path.join(_real_dir(head), tail)


@functools.lru_cache(maxsize=256)
def _real_dir(path: str) -> str:
    return os.path.realpath(path)


def looked_at_first(shard_path: str, index_path: str, index_dir: str | None = None) -> list | None:
    """What is now in the places find_current looks before ``index_path`` (candidate_paths): per
    place, its file_id or None where nothing is; None if ``index_path`` is not one of the places.
    (Beside the shard comes first: for indexes kept there, one realpath and no stat.)"""
    real = _realpath(shard_path)
    beside = real + INDEX_SUFFIX
    if index_path == beside:
        return []
    if index_path != cached_path(real, index_dir):
        return None
    try:
        return [list(file_id(os.stat(beside)))]
    except FileNotFoundError:
        return [None]


def stored_bytes(shard_paths: list[str], index_dir: str | None = None) -> int:
    """The size of the index files the shards have (the first candidate found of each)."""
    total = 0
    for shard in shard_paths:
        for path in candidate_paths(shard, index_dir):
            try:
                total += os.stat(path).st_size
                break
            except OSError:
                continue
    return total


def prefetch(shard_paths: list[str], index_dir: str | None = None) -> threading.Thread:
    """Ask the kernel to read the shards' index files ahead (POSIX_FADV_WILLNEED), from a thread
    of its own, while they are loaded one after another: after a drop of the page cache a
    remount of 2,000 indexes (350 MB) waited 1.1 s on one read at a time, 0.3-0.6 s with the
    reads queued at once. Only system calls: no buffer of its own."""
    def run():
        for shard in shard_paths:
            for path in candidate_paths(shard, index_dir):
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    continue
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
                finally:
                    os.close(fd)
                break
    _real_dir.cache_clear()  # a directory may have been replaced by a link since the last mount
    thread = threading.Thread(target=run, name="index-prefetch", daemon=True)
    thread.start()
    return thread


def is_current(index: ShardIndex, st: os.stat_result, columns: Columns = Columns()) -> bool:
    return index.shard_size == st.st_size and index.shard_mtime_ns == st.st_mtime_ns and _same_columns(index, columns)


def _same_columns(index: ShardIndex, columns: Columns) -> bool:
    """A dataset file's index serves only the --columns it was built with."""
    return index.format not in DATA_FORMATS or index.columns == str(columns)


def _left_out_what_we_serve(index: ShardIndex) -> bool:
    """An older version's index that left out sparse files, absolute names or the members after
    damage (an older file format), or names with '..' (any format; its warnings and error say so):
    this version serves them, so it is rebuilt. So is one that served names with '..' without their
    leading part (``a/../../x`` as ``x``): this version serves them where they resolve, or not at all."""
    if any("name climbs out of the tree (..)" in w or "served without their leading" in w for w in index.warnings):
        return True
    return index.legacy and (bool(index.error) or any("sparse" in w or "is absolute" in w for w in index.warnings))


def _try_load(path, shown: str | None = None, columns: MemberColumns | None = None) -> ShardIndex | None:
    try:
        index = load(path, columns)
        if _left_out_what_we_serve(index):
            raise OutdatedIndex("an index of an older version that left members out")
        return index
    except FileNotFoundError:
        return None
    except OutdatedIndex as exc:
        log.info("index %s: %s; rebuilding", shown or path, exc)
        return None
    except (OSError, ValueError) as exc:  # OutdatedIndex is a ValueError too: caught above
        log.warning("ignoring unreadable index %s: %s", shown or path, exc)
        return None


def _in_current_format(index: ShardIndex, path: str) -> None:
    """An index read from an older file format, written again where it was, so that the next
    mount reads the fast one (a conversion, not a rebuild: the shard is not read)."""
    if not index.legacy:
        return
    try:
        save(index, path)
        index.legacy = False
        index.stored_id = None  # (not the file read: a view saved now would not be found current)
        log.debug("index %s: rewritten in the current format", path)
    except OSError as exc:
        log.info("index %s: cannot rewrite it in the current format (%s); still used", path, exc)


def _save_first(index: ShardIndex, candidates: list[str], shard_path: str,
                how: str = "built") -> tuple[ShardIndex, str]:
    """Save in the first candidate place that takes it; ``how`` the index was obtained."""
    for path in candidates:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            save(index, path)
            index.stored_at, index.stored_id = path, file_id(os.stat(path))
            return index, how
        except OSError:
            continue
    log.warning("%s: could not save its index anywhere (%s)", shard_path, ", ".join(candidates))
    return index, f"{how}, not saved"


def _built(shard, columns: Columns, keep) -> ShardIndex:
    """``keep(shard)``: a context around the build that keeps what it reads (storage/buildfill.py)."""
    return build(shard, columns, keep)


def load_or_build_remote(url: str, index_dir: str | None = None, rebuild: bool = False,
                         columns: Columns = Columns(), keep=None) -> tuple[ShardIndex, str]:
    """A remote shard's index: from the local cache (keyed by URL), else from beside the object
    (``URL.shardfs-idx``, copied into the cache), else built by streaming the object once.
    An index is used only if it describes the object: built from it (same size and ETag or
    Last-Modified), or its fingerprint matches the object's bytes (fingerprint.py)."""
    from shardfs.storage import remote  # network clients: only for URLs
    from shardfs.storage.remote import RemoteShard

    obj = remote.known_info(url)
    cached = cached_path(url, index_dir)
    if not rebuild:
        index = _try_load(cached)
        if index is not None:
            why = _not_describing(index, obj, columns)
            if why is None:
                index.stored_at = cached
                _in_current_format(index, cached)
                return index, "loaded"
            log.info("index %s does not describe %s (%s); rebuilding", cached, url, why)
        beside = url + INDEX_SUFFIX
        data = None
        if remote.may_exist(beside):
            try:
                data = remote.read_whole(beside)
            except remote.RemoteError as exc:
                log.warning("cannot fetch %s (%s): building the index instead", beside, exc)
        index = _try_load(io.BytesIO(data), beside) if data else None
        if index is not None:
            why = _not_describing(index, obj, columns)
            if why is None:
                # Cached with the object's tag: the next mount trusts it without a GET.
                index.shard_tag, index.shard_mtime_ns = obj.tag, obj.mtime_ns
                return _save_first(index, [cached], url, how="loaded")
            log.warning("index %s does not describe %s (%s); building one", beside, url, why)
    return _save_first(_built(RemoteShard.of(obj), columns, keep), [cached], url)


def _not_describing(index: ShardIndex, obj, columns: Columns = Columns()) -> str | None:
    """Why ``index`` cannot serve the object ``obj``, or None if it provably describes it:
    built from this very object (its tag), or its fingerprint matches the object's bytes."""
    from shardfs.storage.remote import RemoteShard

    if index.shard_size != obj.size:
        return f"size {index.shard_size}, the object has {obj.size}"
    if not _same_columns(index, columns):
        return f"built for --columns {index.columns!r}"
    if obj.tag and index.shard_tag == obj.tag:
        return None
    if not index.shard_fingerprint:
        return "no fingerprint to check it by (written by an older shardfs)"
    shard = RemoteShard.of(obj)
    try:
        now = fingerprint.of(shard)  # a few ranged GETs, not the whole object
    finally:
        shard.close()
    return None if now == index.shard_fingerprint else "its fingerprint differs from the object's bytes"


def find_current(shard_path: str, index_dir: str | None = None, columns: Columns = Columns(),
                 into: MemberColumns | None = None) -> ShardIndex | None:
    """The persisted index that describes the local shard as it is now (its size and mtime), or
    None; OSError if the shard cannot be stat'ed. ``into``: where its member columns go."""
    st = os.stat(shard_path)
    for path in candidate_paths(shard_path, index_dir):
        index = _try_load(path, columns=into)
        if index is None:
            continue
        if is_current(index, st, columns):
            index.stored_at = path
            _in_current_format(index, path)
            return index
        log.info("index %s is stale (shard changed); rebuilding", path)
    return None


def load_or_build(shard_path: str, index_dir: str | None = None, rebuild: bool = False,
                  columns: Columns = Columns(), keep=None, save: bool = True) -> tuple[ShardIndex, str]:
    """The shard's index and how it was obtained ("loaded", "built" or "built, not saved").
    ``rebuild``: build it without looking for a persisted one. ``columns``: see datafile.Columns.
    ``keep``: see _built. ``save=False``: a local shard's index built here is returned unsaved
    ("built, to be saved"): its caller saves it later (save_built)."""
    if is_url(shard_path):
        return load_or_build_remote(shard_path, index_dir, rebuild, columns, keep)
    if not rebuild:
        index = find_current(shard_path, index_dir, columns)
        if index is not None:
            return index, "loaded"
    st = os.stat(shard_path)
    shard = LocalShard(shard_path, st.st_size, st.st_mtime_ns, sequential=True)
    try:
        index = _built(shard, columns, keep)
    finally:
        shard.close()
    return save_built(index, shard_path, index_dir) if save else (index, TO_BE_SAVED)


TO_BE_SAVED = "built, to be saved"


def save_built(index: ShardIndex, shard_path: str, index_dir: str | None = None) -> tuple[ShardIndex, str]:
    """Save a local shard's index built here where the next mount looks first (beside the shard, else
    in the cache directory)."""
    return _save_first(index, candidate_paths(shard_path, index_dir), shard_path)


def received_describes(index: ShardIndex, shard_path: str, columns: Columns = Columns()) -> str | None:
    """Why an index a peer sent cannot serve the local shard, or None: it was built from the shard
    as it is here (its size and mtime), for these --columns, and its fingerprint matches the
    shard's bytes (three small reads). OSError if the shard cannot be stat'ed or read."""
    st = os.stat(shard_path)
    if not is_current(index, st, columns):
        return (f"built from another version or --columns (size {index.shard_size}, mtime {index.shard_mtime_ns}; "
                f"here {st.st_size}, {st.st_mtime_ns})")
    if not index.shard_fingerprint:
        return "no fingerprint to check it by"
    shard = LocalShard(shard_path, st.st_size, st.st_mtime_ns)
    try:
        now = fingerprint.of(shard)
    finally:
        shard.close()
    return None if now == index.shard_fingerprint else "its fingerprint differs from the shard's bytes"


def keep_received(index: ShardIndex, shard_path: str, index_dir: str | None = None) -> ShardIndex:
    """An index a peer sent (checked by ``received_describes``), saved in the cache directory,
    where the next mount on this node finds it; not beside the shard, where its owner wrote it
    if it could (a thousand nodes need not all write that one file)."""
    return _save_first(index, [cached_path(os.path.realpath(shard_path), index_dir)], shard_path,
                       how="from a peer")[0]

