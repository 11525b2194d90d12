"""A saved view as a remount maps it (service/saved_view.py ``SavedView.load``: view/snapshot.py,
then the request loop's table made of it, fuse/table.py ``from_saved``, the C ``Table`` of
fuse/lowlevel/table.c), from the file's bytes.

The view is of two small tar shards whose index files are on disk (so the file is current for
them); the input replaces the saved view's bytes. Its first byte says whether to recompute every
CRC-32 first (the header's and each array's): a writer's bug or an edited file has good ones,
and a mount trusts the arrays behind them. Beyond "no crash": a file is either refused (load
answers None: the mount merges the indexes again) or gives a view and its table, as the daemon
asks for them (an exception there would stop the mount); lookups of every
path of the shards through the C table then answer an inode number or None, never crash.
(Out-of-bounds reads in C that do not crash are seen only under the sanitizer build.)
"""

from __future__ import annotations

import json
import os
import struct
import zlib

import numpy as np
from fuzzlib import scratch_path
from tarcraft import archive, header, member, old_sparse_member

from shardfs.atomic import atomic_file
from shardfs.formats.datafile import Columns
from shardfs.service.saved_view import SavedView
from shardfs.view import snapshot

_SETUP: dict | None = None
_PATHS = [b"cls/a.txt", b"cls/link", b"d", b"both.txt", b"sp.bin", b"many/0007.bin", b"cls/b.txt", b"nope/x"]


def _setup() -> dict:
    """Shards, their indexes and a saved view of them, made once per process by the real code."""
    global _SETUP
    if _SETUP is None:
        from shardfs.fuse import table
        from shardfs.view.dataset import open_dataset
        from shardfs.view.sources import find_shards

        root = scratch_path("view")
        src, idx = os.path.join(root, "src"), os.path.join(root, "idx")
        os.makedirs(src, exist_ok=True)
        os.makedirs(idx, exist_ok=True)
        with open(os.path.join(src, "a.tar"), "wb") as f:
            f.write(archive(member(b"cls/a.txt", b"from a\n"), header(b"cls/link", typeflag=b"2", linkname=b"a.txt"),
                            header(b"d/", typeflag=b"5"), member(b"both.txt", b"old\n")))
        with open(os.path.join(src, "b.tar"), "wb") as f:
            f.write(archive(member(b"cls/b.txt", b"from b\n"), member(b"both.txt", b"new\n"),
                            old_sparse_member(b"sp.bin", [(0, b"x" * 512), (4096, b"y" * 10)], 8192),
                            *(member(b"many/%04d.bin" % i, b"%d" % i) for i in range(20))))
        sources = [src]
        found = find_shards(sources)
        path, key = snapshot.place(sources, idx, None, Columns())
        view = open_dataset(sources, idx, 1, None, found=found)
        built, derived = table.build_keeping(view, table.Slots())
        assert snapshot.save(path, key, view, derived, idx)
        with open(path, "rb") as f:
            saved = f.read()
        head_length = snapshot._HEADER.unpack(saved[: snapshot._HEADER.size])[3]
        meta = json.loads(saved[snapshot._HEADER.size : snapshot._HEADER.size + head_length])
        _SETUP = dict(path=path, found=found, src=src, idx=idx, saved=saved, meta=meta)
    return _SETUP


def _made_current(data: bytes, fix_crcs: bool) -> bytes:
    """The file as this process's shards would have it: its key and shards (paths, sizes, mtimes,
    index file ids: new in every process) those of the view saved here, so that an input from
    another run (the corpus) is judged on its arrays; with ``fix_crcs``, the header's and arrays'
    CRC-32s recomputed. Where the JSON header no longer parses, the bytes as they are. The header
    is written back compactly, padded to its old length (so nothing moves)."""
    size = snapshot._HEADER.size
    if len(data) < size:
        return data
    magic, version, crc, length = snapshot._HEADER.unpack(data[:size])
    text = data[size : size + length]
    try:
        meta = json.loads(text.decode("utf-8", "surrogateescape"))
        meta.update((k, _setup()["meta"][k]) for k in ("key", "shards") if k in meta)
        if fix_crcs:
            names_at = snapshot._names_at(length, meta["body_length"])
            for a in meta["arrays"]:
                at = size + length + a["offset"]
                a["crc"] = snapshot._crcs(data[at : at + a["count"] * np.dtype(a["dtype"]).itemsize])
            meta["names"]["crc"] = snapshot._crcs(data[names_at : names_at + meta["names"]["length"]])
        new = json.dumps(meta, separators=(",", ":")).encode("utf-8", "surrogateescape")
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, OverflowError, SyntaxError):
        return data  # (SyntaxError: numpy reads a dtype string as literals)
    if len(new) > len(text):
        return data
    new = new.ljust(len(text), b" ")
    crc = zlib.crc32(new) if fix_crcs or zlib.crc32(text) == crc else crc  # (a bad one stays bad)
    return snapshot._HEADER.pack(magic, version, crc, length) + new + data[size + length :]


def one_input(data: bytes) -> None:
    if not data:
        return
    from shardfs.fuse import table

    setup = _setup()
    # Replaced by a rename, as the writer does (atomic_file): an earlier input's view may still map
    # the old file, and a mapped file cut short in place faults whoever reads it.
    with atomic_file(setup["path"]) as f:
        f.write(_made_current(data[1:], fix_crcs=bool(data[0] & 1)))
    saved, slots = SavedView([setup["src"]], setup["idx"], None, Columns()), table.Slots()
    view = saved.load(setup["found"], slots)
    if view is None:
        return
    loop_table = saved.table(view, slots)
    for path in _PATHS:
        ino = 1
        for name in path.split(b"/"):
            ino = loop_table.lookup(ino, name)
            if ino is None:
                break


def seeds() -> list[bytes]:
    saved = _setup()["saved"]
    damaged = bytearray(saved)
    damaged[-1] ^= 1  # a name's byte: its CRC-32 no longer matches
    return [b"\0" + saved, b"\1" + saved, b"\0" + bytes(damaged), b"\1" + struct.pack("<8s", b"SHFSVIEW")]
