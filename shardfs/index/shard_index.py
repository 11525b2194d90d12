"""The index of one shard: compact numpy arrays of its members, persisted beside it.

An index is built once per shard (scan its headers, vet its names) and saved as
an uncompressed ``.npz`` so that a remount only maps a few arrays back in. It is
valid while the shard's size and mtime are those it was built from.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import logging
import os
import tempfile
import zipfile
from dataclasses import dataclass, field

import numpy as np

from shardfs.index import labels
from shardfs.index import names
from shardfs.atomic import atomic_file
from shardfs.formats import ShardFormatError, format_for
from shardfs.formats.base import Kind, Window, open_source
from shardfs.view.sources import is_url

log = logging.getLogger(__name__)

INDEX_VERSION = 2  # 2: cls_member/cls_value (WebDataset labels)
INDEX_SUFFIX = ".shardfs-idx"
MAX_MTIME = 253402300799  # 9999-12-31T23:59:59


def path_hash(path: bytes) -> int:
    """Stable 64-bit hash of a member path (persisted, so not Python's ``hash``)."""
    return int.from_bytes(hashlib.blake2b(path, digest_size=8).digest(), "little")


@dataclass
class ShardIndex:
    """Members of one shard. Member ``i`` is ``names[name_end[i-1]:name_end[i]]``."""

    format: str
    shard_size: int
    shard_mtime_ns: int
    names: bytes
    name_end: np.ndarray  # int64, cumulative end offsets into ``names``
    kind: np.ndarray  # uint8 (formats.base.Kind)
    offset: np.ndarray  # int64, into the shard's logical data stream
    size: np.ndarray  # int64
    mode: np.ndarray  # uint16 permission bits
    mtime: np.ndarray  # float64
    hash: np.ndarray  # uint64 path_hash of each name
    parent: np.ndarray  # uint32 index into ``dirs``
    dirs: list[bytes]  # distinct parent directories ("" is the root)
    symlinks: dict[int, bytes] = field(default_factory=dict)  # member -> target
    # Labels of small ``*.cls`` members (see labels.py): member index, value (labels.UNPARSABLE if not an int)
    cls_member: np.ndarray = field(default_factory=lambda: labels.no_labels()[0])  # int32
    cls_value: np.ndarray = field(default_factory=lambda: labels.no_labels()[1])  # int64
    warnings: list[str] = field(default_factory=list)
    error: str | None = None  # the scan stopped here; members before it are good
    stored_at: str | None = None  # the index file it was loaded from or saved to (not persisted)
    shard_tag: str = ""  # remote shards: the object's ETag (or Last-Modified) it was built from

    def __len__(self) -> int:
        return len(self.kind)

    def name(self, i: int) -> bytes:
        start = int(self.name_end[i - 1]) if i else 0
        return self.names[start : int(self.name_end[i])]


def build(shard_path: str, obj=None) -> ShardIndex:
    """Scan a shard and vet every member name. Damage is recorded, never raised.

    ``obj``: the remote object (shardfs.storage.remote.ObjectInfo) when ``shard_path`` is a URL; it is
    scanned through 8 MiB ranged reads, conditional on its tag."""
    fmt = format_for(shard_path)
    if fmt is None:
        raise ValueError(f"{shard_path}: not a known shard type")
    if obj is None:
        st = os.stat(shard_path)
        size, mtime_ns, tag, src = st.st_size, st.st_mtime_ns, "", shard_path
    else:
        from shardfs.storage.remote import RemoteSource

        size, mtime_ns, tag, src = obj.size, obj.mtime_ns, obj.tag, RemoteSource(obj)
    result = fmt.scan(src)
    shown = os.path.basename(shard_path)
    warnings = [f"{shown}: {w}" for w in result.warnings]

    # Vet names; a later member of the same name replaces an earlier one (tar semantics).
    kept: dict[bytes, object] = {}
    for rec in result.members:
        try:
            path = names.normalise(rec.path)
        except names.BadName as why:
            if rec.kind == Kind.DIR and not rec.path.strip(b"./"):
                continue  # "./": the root itself, as `tar -C dir .` writes it
            warnings.append(f"{shown}: member {names.show(rec.path)} refused: name {why}")
            continue
        if rec.kind == Kind.HARDLINK:
            try:
                target = kept.get(names.normalise(rec.link))
            except names.BadName:
                target = None
            if target is None or target.kind == Kind.DIR:
                warnings.append(f"{shown}: hard link {names.show(path)} -> {names.show(rec.link)}: target missing")
                continue
            rec.kind, rec.offset, rec.size, rec.link, rec.small = (target.kind, target.offset, target.size, target.link,
                                                                   target.small)
        if not math.isfinite(rec.mtime) or abs(rec.mtime) > MAX_MTIME:
            rec.mtime = 0.0  # "inf", "nan" or past year 9999: not worth refusing the member for
        if rec.kind == Kind.SYMLINK:
            rec.size = len(rec.link)  # what lstat reports for a link, whatever the format stored
        if path in kept:
            warnings.append(f"{shown}: member {names.show(path)} appears twice; the later one is served")
            del kept[path]  # keep insertion order = position of the later member
        rec.path = path
        kept[path] = rec

    members = list(kept.values())
    offsets = np.array([rec.offset for rec in members], dtype=np.int64)
    sizes = np.array([rec.size for rec in members], dtype=np.int64)
    cls_member, cls_value = labels.no_labels()
    wanted = [i for i, rec in enumerate(members) if rec.kind == Kind.FILE and labels.is_label_member(rec.path, rec.size)]
    if wanted:  # only WebDataset-style shards pay for this
        try:
            cls_member, cls_value = _read_labels(src, fmt, size, members, wanted, offsets, sizes)
        except (OSError, ShardFormatError) as exc:
            warnings.append(f"{shown}: cannot read its .cls labels: {exc}")
    dir_ids: dict[bytes, int] = {}
    parent = np.empty(len(members), dtype=np.uint32)
    for i, rec in enumerate(members):
        parent[i] = dir_ids.setdefault(names.parent_of(rec.path), len(dir_ids))
    name_list = [rec.path for rec in members]
    return ShardIndex(
        format=fmt.name,
        shard_size=size,
        shard_mtime_ns=mtime_ns,
        shard_tag=tag,
        names=b"".join(name_list),
        name_end=np.cumsum([len(n) for n in name_list], dtype=np.int64),
        kind=np.array([rec.kind for rec in members], dtype=np.uint8),
        offset=offsets,
        size=sizes,
        mode=np.array([rec.mode for rec in members], dtype=np.uint16),
        mtime=np.array([rec.mtime for rec in members], dtype=np.float64),
        hash=np.array([path_hash(n) for n in name_list], dtype=np.uint64),
        parent=parent,
        dirs=list(dir_ids),
        symlinks={i: rec.link for i, rec in enumerate(members) if rec.kind == Kind.SYMLINK},
        warnings=warnings,
        error=f"{shown}: {result.error}" if result.error else None,
        cls_member=cls_member,
        cls_value=cls_value,
    )


def _read_labels(src, fmt, size: int, members: list, wanted: list[int], offsets, sizes):
    """Labels as the scan kept them with their headers (tar: no second pass over the shard);
    else read through the format's layout (lz4: whole blocks), in data order through forward
    windows: from a remote object that is 8 MiB ranged reads, not one request per label."""
    if all(members[i].small is not None for i in wanted):
        return labels.from_bytes(wanted, [members[i].small for i in wanted])
    with open_source(src) as source:
        layout = fmt.open_layout(source, size)
        window = Window(source)
        return labels.read_labels(wanted, offsets, sizes, lambda o, n: layout.read(o, n, window.get))


_ARRAYS = ("name_end", "kind", "offset", "size", "mode", "mtime", "hash", "parent", "cls_member", "cls_value")


def _text(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


def _bytes(s: str) -> bytes:
    return s.encode("utf-8", "surrogateescape")


def save(index: ShardIndex, path: str) -> None:
    """Write atomically (temp file + rename) so a reader never sees half an index."""
    meta = {
        "version": INDEX_VERSION,
        "format": index.format,
        "shard_size": index.shard_size,
        "shard_mtime_ns": index.shard_mtime_ns,
        "shard_tag": index.shard_tag,
        "dirs": [_text(d) for d in index.dirs],
        "symlinks": {str(i): _text(t) for i, t in index.symlinks.items()},
        "warnings": index.warnings,
        "error": index.error,
    }
    arrays = {name: getattr(index, name) for name in _ARRAYS}
    arrays["names"] = np.frombuffer(index.names, dtype=np.uint8)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with atomic_file(path) as out:
        np.savez(out, **arrays)


class OutdatedIndex(ValueError):
    """Written by another shardfs version: rebuilt, not an error."""


def load(path) -> ShardIndex:
    """From a file name, or a binary file object (an index fetched from beside a remote shard)."""
    with np.load(path, allow_pickle=False) as npz:
        meta = json.loads(npz["meta"].tobytes())
        if meta.get("version") != INDEX_VERSION:
            raise OutdatedIndex(f"index version {meta.get('version')}, this shardfs writes {INDEX_VERSION}")
        return ShardIndex(
            format=meta["format"],
            shard_size=meta["shard_size"],
            shard_mtime_ns=meta["shard_mtime_ns"],
            shard_tag=meta.get("shard_tag", ""),
            names=npz["names"].tobytes(),
            dirs=[_bytes(d) for d in meta["dirs"]],
            symlinks={int(i): _bytes(t) for i, t in meta["symlinks"].items()},
            warnings=meta["warnings"],
            error=meta["error"],
            **{name: npz[name] for name in _ARRAYS},
        )


def cache_dir() -> str:
    """$XDG_CACHE_HOME/shardfs, else ~/.cache/shardfs; a private folder in /tmp for users
    without a usable home (system accounts, some batch setups)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    preferred = os.path.join(base, "shardfs")
    try:
        os.makedirs(preferred, exist_ok=True)
        if os.access(preferred, os.W_OK):
            return preferred
    except OSError:
        pass
    fallback = os.path.join(tempfile.gettempdir(), f"shardfs-{os.getuid()}")
    os.makedirs(fallback, mode=0o700, exist_ok=True)
    return fallback


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
    from shardfs.storage import remote

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
    return _save_first(build(url, obj), [cached], url)


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
    return _save_first(build(shard_path), candidates, shard_path)
