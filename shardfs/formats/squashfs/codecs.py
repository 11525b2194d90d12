"""The block compressors a SquashFS 4.0 image may name in its superblock, as bounded decompressors.

Every data block, fragment block and metadata block of an image is compressed alone, with the one
compressor the superblock names. ``decompressor(id)`` gives ``decompress(raw, limit)``: the block's
bytes, never more than ``limit`` (the block size, or 8 KiB for metadata): a block that would expand
beyond it, or that does not decode, raises ShardFormatError, so damage costs at most one block of
memory.
"""

from __future__ import annotations

import lzma
import threading
import zlib
from typing import Callable

from shardfs.formats.base import ShardFormatError

# As the kernel (squashfs_fs.h) and both writers number them (format.adoc swaps 2 and 3).
GZIP, LZMA, LZO, XZ, LZ4, ZSTD = 1, 2, 3, 4, 5, 6
NAMES = {GZIP: "gzip", LZO: "lzo", LZMA: "lzma", XZ: "xz", LZ4: "lz4", ZSTD: "zstd"}

Decompress = Callable[[bytes, int], bytes]


def decompressor(comp: int) -> Decompress:
    """The image's decompressor, or ShardFormatError (one line) for one shardfs cannot read."""
    if comp == LZO:
        # python-lzo (PyPI) publishes no wheels: it would need liblzo2's headers and a compiler on
        # every node. unsquashfs reads such an image; mksquashfs -comp zstd rewrites it readable here.
        raise ShardFormatError("compressed with lzo, which shardfs does not read (no Python binding with "
                               "wheels): rewrite it with mksquashfs -comp zstd (or gzip, xz, lz4)")
    found = _BY_ID.get(comp)
    if found is None:
        raise ShardFormatError(f"unknown compressor id {comp}")
    return found


def _gzip(raw: bytes, limit: int) -> bytes:
    d = zlib.decompressobj()  # SquashFS's "gzip" is a zlib stream (RFC 1950), header and adler32
    try:
        out = d.decompress(raw, limit)
    except zlib.error as exc:
        raise ShardFormatError(f"gzip block does not decode: {exc}") from None
    if d.unconsumed_tail:
        raise ShardFormatError(f"gzip block expands beyond {limit} bytes")
    if not d.eof:
        raise ShardFormatError("gzip block is cut short")
    return out


def _lzma_family(fmt: int, what: str) -> Decompress:
    def decompress(raw: bytes, limit: int) -> bytes:
        d = lzma.LZMADecompressor(format=fmt)
        try:
            out = d.decompress(raw, limit)
        except lzma.LZMAError as exc:
            raise ShardFormatError(f"{what} block does not decode: {exc}") from None
        if not d.eof:
            # Either more output than ``limit`` is waiting, or the stream stops early.
            raise ShardFormatError(f"{what} block expands beyond {limit} bytes or is cut short")
        return out

    return decompress


def _lz4(raw: bytes, limit: int) -> bytes:
    import lz4.block

    try:
        # A raw LZ4 block; ``uncompressed_size`` is the output buffer's bound, which it never passes.
        return lz4.block.decompress(raw, uncompressed_size=limit)
    except (lz4.block.LZ4BlockError, ValueError) as exc:
        raise ShardFormatError(f"lz4 block does not decode (or expands beyond {limit} bytes): {exc}") from None


_zstd_local = threading.local()  # a decompression context is not for two threads at once


def _zstd(raw: bytes, limit: int) -> bytes:
    import zstandard

    d = getattr(_zstd_local, "d", None)
    if d is None:
        d = _zstd_local.d = zstandard.ZstdDecompressor()
    try:
        declared = zstandard.frame_content_size(raw)
        if declared > limit:  # refused before anything of that size is allocated
            raise ShardFormatError(f"zstd block declares {declared} bytes, more than {limit}")
        out = d.decompress(raw, max_output_size=limit)
    except zstandard.ZstdError as exc:
        raise ShardFormatError(f"zstd block does not decode (or expands beyond {limit} bytes): {exc}") from None
    if len(out) > limit:
        raise ShardFormatError(f"zstd block expands beyond {limit} bytes")
    return out


_BY_ID: dict[int, Decompress] = {
    GZIP: _gzip,
    LZMA: _lzma_family(lzma.FORMAT_ALONE, "lzma"),  # LZMA1 with its 13-byte header (gensquashfs -c lzma)
    XZ: _lzma_family(lzma.FORMAT_XZ, "xz"),  # an .xz stream per block: the filters (x86, arm...) are in it
    LZ4: _lz4,
    ZSTD: _zstd,
}
