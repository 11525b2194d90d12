"""The SquashFS image reader (formats/squashfs/): superblock, metadata blocks, the inode table
walk, the fragment and id tables, the directory listings, and every file read through the layout,
on an image's bytes.

Beyond "no crash": an image that scans has each file either served as a range of the image or
virtual; each file read through its layout fails cleanly (ShardFormatError) or gives exactly its
size; an image as mksquashfs wrote it (a seed) gives back the writer's input tree, names, kinds,
bytes and symlink targets; the scan and the reads stay within a memory bound (tracemalloc peak).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile

from fuzzlib import bounded
from test_fuzz_tar_writers import MemorySource

from shardfs.formats.base import Kind, ShardFormatError
from shardfs.formats.lz4shard import BlockCache
from shardfs.formats.squashfs import FORMAT, tables
from shardfs.formats.squashfs.layout import SquashfsLayout

_WRITTEN: dict[str, dict[bytes, tuple]] = {}  # sha256 of a seed image -> the tree mksquashfs was given
MEMORY_BOUND = 64 << 20  # tables of a < 1 MiB input, a block of at most 1 MiB decompressed, copies


def one_input(data: bytes) -> None:
    src = MemorySource(data)
    with bounded(MEMORY_BOUND, f"a {len(data)}-byte image's scan and reads"):
        result = FORMAT.scan(src)
        if result.error is not None:
            assert not result.members
            return
        try:
            tables.read(src)
            layout = SquashfsLayout(src, BlockCache(4 << 20))  # its own cache: nothing carried between inputs
        except ShardFormatError as exc:
            raise AssertionError(f"the tables refuse an image whose scan passed: {exc}") from None
        got = {}
        for m in result.members:
            if m.kind == Kind.FILE:
                try:
                    part = layout.read(m.offset, m.size, lambda o, n: data[o : o + n]) if m.size < (8 << 20) else None
                except ShardFormatError:
                    continue
                if part is not None:
                    assert len(part) == m.size, f"{m.path!r}: {len(part)} bytes for {m.size}"
                    got[m.path] = ("file", hashlib.sha256(part).hexdigest())
            elif m.kind == Kind.SYMLINK:
                got[m.path] = ("symlink", m.link)
            else:
                got[m.path] = ("dir", None)
    written = _WRITTEN.get(hashlib.sha256(data).hexdigest())
    if written is not None:
        assert got == written, f"the seed's tree differs: {sorted(set(got.items()) ^ set(written.items()))}"


def _tree(root: str) -> dict[bytes, tuple]:
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.fsencode(os.path.relpath(full, root))
            if os.path.islink(full):
                found[rel] = ("symlink", os.fsencode(os.readlink(full)))
            elif os.path.isdir(full):
                found[rel] = ("dir", None)
            else:
                with open(full, "rb") as f:
                    found[rel] = ("file", hashlib.sha256(f.read()).hexdigest())
    return found


def seeds() -> list[bytes]:
    """Small images by mksquashfs (each compressor, fragments or not, 4K blocks; uncompressed ones,
    whose structure mutations reach; a crowded folder) and damaged copies of one; none when
    mksquashfs is not installed."""
    if shutil.which("mksquashfs") is None:
        return []
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src")
        os.makedirs(os.path.join(src, "d", "empty"))
        with open(os.path.join(src, "d", "text"), "wb") as f:
            f.write(b"".join(b"%d\n" % i for i in range(3000)))
        with open(os.path.join(src, "tiny"), "wb") as f:
            f.write(b"hi")
        with open(os.path.join(src, "rand"), "wb") as f:
            f.write(hashlib.sha256(b"seed").digest() * 200)
        os.symlink("d/text", os.path.join(src, "link"))
        os.link(os.path.join(src, "tiny"), os.path.join(src, "hard"))
        tree = _tree(src)
        for options in (["-comp", "gzip"], ["-comp", "xz"], ["-comp", "lz4", "-no-fragments"],
                        ["-comp", "zstd", "-always-use-fragments"], ["-noI", "-noD", "-noF", "-noX"]):
            image = os.path.join(tmp, "img")
            subprocess.run(["mksquashfs", src, image, "-noappend", "-quiet", "-no-progress", "-b", "4K", "-nopad",
                            *options], check=True, capture_output=True)
            with open(image, "rb") as f:
                data = f.read()
            _WRITTEN[hashlib.sha256(data).hexdigest()] = tree
            out.append(data)
        crowded = os.path.join(tmp, "crowded")  # a listing over 8 KiB: an extended directory with an index
        os.makedirs(crowded)
        for i in range(300):
            with open(os.path.join(crowded, f"entry-{i:04d}"), "wb") as f:
                f.write(b"%d" % i)
        image = os.path.join(tmp, "crowded.img")
        subprocess.run(["mksquashfs", crowded, image, "-noappend", "-quiet", "-no-progress", "-nopad", "-noI", "-noD",
                        "-noF", "-noX"], check=True, capture_output=True)
        with open(image, "rb") as f:
            data = f.read()
        _WRITTEN[hashlib.sha256(data).hexdigest()] = _tree(crowded)
        out.append(data)
    base = out[0]
    out.append(base[: len(base) // 2])  # cut short
    for at in (20, 28, 40, 64, len(base) // 2, len(base) - 40):  # compressor, sizes, table positions, tables
        flipped = bytearray(base)
        flipped[at] ^= 0x5A
        out.append(bytes(flipped))
    return out
