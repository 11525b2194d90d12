"""A merged view saved once and mapped again by the next mount of the same shards ("view snapshot").

A remount of 4,000,000 members in 2,000 shards spent ~2.1 s reading the index files and merging
them into the tree, then ~0.85 s deriving the request loop's table (0.7 s of it sorting every
directory's children by name), most of it in memory touched for the first time (see
index/member_columns.py). What a mount ends up with depends only on the shards as they are,
their index files, the options that shape the view (layout, --columns, where indexes live) and
this code: saved in one file, the next mount with all of that unchanged maps it read-only (pages
come from the page cache, or from the disk in large read-ahead requests) and hands its arrays
to the tree and the table as they are. Measured at 4M members, page cache dropped, medians of 3
(tools/bench_scale.py): remount 1.76 s against 5.17 s merging the indexes (load 2.5), 2.44 s
against 5.20 s (load 3); resident memory 115 B per member against 117.

One file per set of sources and options (in the index directory, else the cache directory),
written atomically by a thread after a mount that made its view from index files (``save``).
``load`` uses it only when everything it was made from is as it was: the same shards (paths,
sizes, mtimes), each with the same index file in the same place (device, inode, size, mtime: a
rebuilt or replaced index is another file) and the same in the places looked at before it; this
shardfs (its version and the files of its view-making code); the same options; and its bytes
checked whole (CRC-32 of every array, of the header too) before anything is used. Anything else:
None, with one log line, and the mount merges the indexes as before and writes the file anew.
Never used for remote shards, peers or rescans (their views are made the normal way; a rescan
does not write one).

Safety of the mapped bytes: they are checked after mapping, before use; the file is only ever
replaced by a rename, so the mapped inode does not change under the daemon (a file truncated
in place by someone else would fault the daemon on its next access, as a truncated
memory-mapped file does any program).

Layout: a fixed header (magic, format version, header length, CRC-32 of the header), the header
as JSON (what the view was made from, plain values, and each array's dtype, length, offset and
CRC-32s of 64 MiB pieces), then the arrays, each at an offset that is a multiple of 8; the member
names last, at a page boundary (mapped on their own: a map's slices are bytes, as the tree's
names need).
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import mmap
import os
import struct
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from shardfs.atomic import atomic_file
from shardfs.dirs import cache_dir
from shardfs.index import store as index_store
from shardfs.index.index_file import file_id, plain_dtype
from shardfs.storage.local import LocalShard
from shardfs.formats.ctar import logical_size_of, stored_of
from shardfs.view.dataset import Dataset, serving
from shardfs.view.tree import Tree

log = logging.getLogger(__name__)

MAGIC = b"SHFSVIEW"
VERSION = 2  # 2: XXH64 path hashes (index version 5)
_HEADER = struct.Struct("<8sIIQ")  # magic, version, CRC-32 of the JSON, its length
SUFFIX = ".shardfs-view"
PIECE = 64 << 20  # bytes per CRC-32 (pieces are checked on two threads)
CHECKERS = 2
STALE_TEMP_S = 600.0  # a temporary file this old was left by a writer that was killed


def place(sources: list[str], index_dir: str | None, layout, columns) -> tuple[str, str]:
    """(the snapshot's file, the key it is saved under): one per set of sources and view options."""
    which = json.dumps({"sources": [os.path.abspath(s) for s in sources], "index_dir": index_dir,
                        "layout": repr(layout), "columns": str(columns)}, sort_keys=True)
    name = "view-" + hashlib.sha256(which.encode("utf-8", "surrogateescape")).hexdigest()[:20] + SUFFIX
    # (Another shardfs writes the same file again: no file left behind per version.)
    return os.path.join(index_dir or cache_dir(), name), json.dumps([which, _code_id()])


def code_files() -> list[str]:
    """The files of the code that makes a view: the package's __init__.py (its version), index/,
    view/, formats/ with its subpackages (squashfs/: what its offsets mean), the table and the
    compiled modules."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return sorted([os.path.join(root, "__init__.py")]
                  + glob.glob(os.path.join(root, "index", "*.py")) + glob.glob(os.path.join(root, "view", "*.py"))
                  + glob.glob(os.path.join(root, "formats", "**", "*.py"), recursive=True)
                  + glob.glob(os.path.join(root, "formats", "*.so"))
                  + glob.glob(os.path.join(root, "fuse", "table.py")) + glob.glob(os.path.join(root, "fuse", "*.so")))


def _code_id() -> str:
    """This shardfs: its version and the files of the code that makes a view (a checkout edited
    since the snapshot was written, or another release, makes views anew)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256()
    for path in code_files():
        st = os.stat(path)
        digest.update(f"{os.path.relpath(path, root)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return digest.hexdigest()


# ---- writing ---------------------------------------------------------------


def save(path: str, key: str, view: Dataset, table_arrays: dict, index_dir: str | None) -> bool:
    """Write ``view`` (made from index files: ``view.index_ids``, with ``index_dir``) and its
    table's arrays to ``path`` atomically; False (logged) if it cannot be written."""
    if view.index_ids is None:
        return False
    started = time.monotonic()
    arrays, values = view.tree.saved()
    names = arrays.pop("names")
    items = [(f"tree.{n}", np.ascontiguousarray(a)) for n, a in arrays.items()]
    items += [(f"table.{n}", np.ascontiguousarray(np.frombuffer(a, np.uint8) if isinstance(a, bytes) else a))
              for n, a in table_arrays.items()]
    meta = {
        "key": key,
        # Per shard also what was where its index was looked for first (an older index beside a shard
        # on read-only storage, its current one in the cache directory): the same there next time.
        # (a compressed tar: the file's size, then the size of the tar it decompresses to)
        "shards": [[s.path, stored_of(s).size, s.mtime_ns, s.index_path, list(i),
                    index_store.looked_at_first(s.path, s.index_path, index_dir),
                    logical_size_of(s)]
                   for s, i in zip(view.shards, view.index_ids)],
        "problems": view.problems, "damaged": view.damaged, "tree": values, "arrays": [],
    }
    at = 0
    for name, a in items:
        meta["arrays"].append({"name": name, "dtype": a.dtype.str, "count": len(a), "offset": at,
                               "crc": _crcs(memoryview(a).cast("B"))})
        at = _aligned(at + a.nbytes, 8)
    meta["body_length"] = at
    meta["names"] = {"length": len(names), "crc": _crcs(memoryview(names).cast("B") if len(names) else b"")}
    head = _encoded(meta)
    names_at = _names_at(len(head), at)
    _remove_stale_temps(path)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with atomic_file(path) as out:
            out.write(_HEADER.pack(MAGIC, VERSION, zlib.crc32(head), len(head)))
            out.write(head)
            written = 0
            for _, a in items:
                out.write(memoryview(a).cast("B"))
                written += a.nbytes
                pad = _aligned(written, 8) - written
                out.write(b"\0" * pad)
                written += pad
            out.write(b"\0" * (names_at - (_HEADER.size + len(head) + written)))
            out.write(names)
    except OSError as exc:
        log.warning("could not save the view in %s (%s): the next mount merges the indexes again", path, exc)
        return False
    log.info("view saved in %s for the next mount (%.0f MB, %.2f s)", path, (names_at + len(names)) / 1e6,
             time.monotonic() - started)
    return True


def _names_at(head_len: int, body_len: int) -> int:
    """Where the names start: the first page boundary after the arrays (mapped on their own)."""
    return _aligned(_HEADER.size + head_len + body_len, mmap.ALLOCATIONGRANULARITY)


def _encoded(meta: dict) -> bytes:
    """The JSON header, padded with spaces so that the body after it starts 8-byte aligned."""
    text = json.dumps(meta).encode("utf-8", "surrogateescape")
    return text + b" " * (_aligned(_HEADER.size + len(text), 8) - _HEADER.size - len(text))


def _aligned(n: int, to: int) -> int:
    return -(-n // to) * to


def _crcs(data) -> list[int]:
    return [zlib.crc32(data[i:i + PIECE]) for i in range(0, len(data), PIECE)] or [0]


def _remove_stale_temps(path: str) -> None:
    """Temporary files of writers killed mid-write (atomic_file names them .tmp-*NAME)."""
    for temp in glob.glob(os.path.join(os.path.dirname(path), ".tmp-*" + os.path.basename(path))):
        try:
            if time.time() - os.stat(temp).st_mtime > STALE_TEMP_S:
                os.unlink(temp)
        except OSError:
            pass


# ---- reading ---------------------------------------------------------------


def load(path: str, key: str, found: list[str], index_dir: str | None) -> tuple[Dataset, dict] | None:
    """(the view, its table's arrays) saved in ``path`` if it is current for the shards ``found``
    (and ``key``: see ``place``), else None (why is logged)."""
    started = time.monotonic()
    try:
        with open(path, "rb", buffering=0) as f:
            why, meta = _header(f, key, found, index_dir)
            if why is None:
                view, table_arrays = _mapped(f, meta, body_at=f.tell())
    except FileNotFoundError:
        log.info("no saved view of these shards (%s): merging their indexes", path)
        return None
    except (OSError, ValueError) as exc:
        why = f"unreadable or damaged ({exc})"
    except (KeyError, TypeError, IndexError) as exc:  # a header's fields missing or of other types
        why = f"unreadable or damaged ({type(exc).__name__}: {exc})"
    if why is not None:
        log.info("saved view %s not used: %s; merging the indexes and saving it again", path, why)
        return None
    view.seconds = time.monotonic() - started
    return view, table_arrays


def _header(f, key: str, found: list[str], index_dir: str | None) -> tuple[str | None, dict]:
    head = f.read(_HEADER.size)
    if len(head) < _HEADER.size or head[:8] != MAGIC:
        raise ValueError("not a saved view")
    _, version, crc, length = _HEADER.unpack(head)
    if version != VERSION:
        return f"written in format {version}, this shardfs reads {VERSION}", {}
    if length > os.fstat(f.fileno()).st_size - _HEADER.size:  # read nothing that large (found by fuzzing)
        raise ValueError("its header's length goes past its end")
    text = f.read(length)
    if len(text) != length or zlib.crc32(text) != crc:
        raise ValueError("its header's checksum does not match")
    meta = json.loads(text.decode("utf-8", "surrogateescape"))
    if meta["key"] != key:
        return "made for other sources, options or another shardfs", meta
    return _not_current(meta["shards"], found, index_dir), meta


def _not_current(shards: list, found: list[str], index_dir: str | None) -> str | None:
    """Why the shards and their index files are not those the view was made from, or None."""
    if [s[0] for s in shards] != sorted(found):
        return "the shards are not those it was made from (added, removed or renamed)"
    for path, size, mtime_ns, index_path, index_id, first, *_ in shards:
        try:
            st = os.stat(path)
        except OSError as exc:
            return f"{path} cannot be stat'ed ({exc.strerror})"
        if (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
            return f"{path} changed since"
        if index_store.looked_at_first(path, index_path, index_dir) != first:
            return f"{path}: the places its index is looked for first hold something else now"
        try:
            if list(file_id(os.stat(index_path))) != index_id:
                return f"{path}: its index file {index_path} was written again since"
        except FileNotFoundError:
            return f"{path}: its index file {index_path} is gone"
    return None


def _mapped(f, meta: dict, body_at: int) -> tuple[Dataset, dict]:
    """The arrays mapped from the file (read-only) and checked whole, made into the view.
    ``body_at``: where the arrays start (after the header)."""
    names_at, names_len = _names_at(body_at - _HEADER.size, meta["body_length"]), meta["names"]["length"]
    whole = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if len(whole) != names_at + names_len:
        raise ValueError(f"{len(whole)} bytes, it was written with {names_at + names_len}")
    whole.madvise(mmap.MADV_WILLNEED)  # read ahead in large requests, while the first pieces are checked
    arrays, pieces = {}, []
    for a in meta["arrays"]:
        dtype = plain_dtype(a["dtype"])
        at = body_at + a["offset"]
        if at % 8 or at + a["count"] * dtype.itemsize > names_at:
            raise ValueError(f"array {a['name']} out of place")
        arrays[a["name"]] = np.frombuffer(whole, dtype, a["count"], at)
        pieces += _pieces(whole, at, a["count"] * dtype.itemsize, a["crc"])
    pieces += _pieces(whole, names_at, names_len, meta["names"]["crc"])
    with ThreadPoolExecutor(CHECKERS, thread_name_prefix="shardfs-view-check") as pool:
        bad = [at for at, ok in pool.map(_check, pieces) if not ok]
    if bad:
        raise ValueError(f"its checksum does not match at byte {bad[0]}")
    names = mmap.mmap(f.fileno(), names_len, offset=names_at, access=mmap.ACCESS_READ) if names_len else b""
    tree_arrays = {n[5:]: a for n, a in arrays.items() if n.startswith("tree.")}
    tree_arrays["names"] = names
    tree = Tree.restore(tree_arrays, meta["tree"])
    shards = []
    for path, size, mtime_ns, index_path, *rest in meta["shards"]:
        logical = rest[2] if len(rest) > 2 else 0
        shard = serving(LocalShard(path, size, mtime_ns), "ctar" if logical else "", logical)
        shard.index_path = index_path
        shards.append(shard)
    view = Dataset(tree, shards, meta["problems"], 0.0, 0, meta["damaged"],
                   index_ids=[tuple(s[4]) for s in meta["shards"]])
    return view, {n[6:]: a for n, a in arrays.items() if n.startswith("table.")}


def _pieces(whole: mmap.mmap, at: int, length: int, crcs: list[int]) -> list:
    count = max(1, -(-length // PIECE))
    if len(crcs) != count:
        raise ValueError("its checksums do not match its arrays")
    return [(whole, at + i * PIECE, min(PIECE, length - i * PIECE), crc) for i, crc in enumerate(crcs)]


def _check(piece) -> tuple[int, bool]:
    whole, at, length, crc = piece
    with memoryview(whole) as view:
        return at, zlib.crc32(view[at:at + length]) == crc
