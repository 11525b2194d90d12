"""Read an index of version 2 (an uncompressed ``.npz``), as shardfs wrote them before the flat
file of index_file.py. Kept so that indexes already uploaded beside remote objects, or built
for a large local dataset, serve without a rebuild; nothing writes this format any more."""

from __future__ import annotations

import io
import json

import numpy as np

from shardfs.index.index_file import ARRAYS, DTYPES, OutdatedIndex, check, text_bytes
from shardfs.index.shard_index import ShardIndex


def load(data: bytes | bytearray, version: int) -> ShardIndex:
    """The index in ``data``; OutdatedIndex unless it is of ``version``; ValueError, KeyError or
    zipfile.BadZipFile for a damaged one (index_file.load makes them all ValueErrors)."""
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        # shardfs never wrote encrypted members; zipfile would raise RuntimeError (found by fuzzing)
        if any(info.flag_bits & 0x1 for info in npz.zip.infolist()):
            raise ValueError("an encrypted member: not an index shardfs wrote")
        meta = json.loads(_array(npz, "meta").tobytes())
        if meta.get("version") != version:
            raise OutdatedIndex(f"index version {meta.get('version')}, this shardfs writes a newer one")
        index = ShardIndex(
            format=meta["format"],
            shard_size=meta["shard_size"],
            shard_mtime_ns=meta["shard_mtime_ns"],
            shard_tag=meta.get("shard_tag", ""),
            shard_fingerprint=meta.get("shard_fingerprint", ""),
            names=_array(npz, "names").tobytes(),
            dirs=[text_bytes(d) for d in meta["dirs"]],
            symlinks={int(i): text_bytes(t) for i, t in meta["symlinks"].items()},
            warnings=meta["warnings"],
            error=meta["error"],
            # (as the flat file's: the checks and the tree take these types)
            **{name: _array(npz, name).astype(DTYPES[name], copy=False) for name in ARRAYS},
        )
    index.legacy = True
    check(index)
    return index


def _array(npz, name: str) -> np.ndarray:
    """A member as an array: numpy gives a member without the .npy magic as its raw bytes (found by
    fuzzing: AttributeError on bytes)."""
    value = npz[name]
    if not isinstance(value, np.ndarray):
        raise ValueError(f"member {name!r} is not an array")
    return value
