"""Compressed streams of a whole shard (a ``.tar.gz``, ``.tar.zst``, ``.tar.xz``, ``.tar.bz2``):
which codec a shard's first bytes name, and its decompressed bytes read front to back.

A stream is one sequence of decompressed bytes however it was cut: several gzip members (pigz
-i, ``cat a.gz b.gz``), several zstd frames (``zstd --long``, pzstd, appended frames), several xz
or bzip2 streams (pixz, pbzip2) are read one after another, as ``gzip -d``, ``zstd -d``, ``xz -d``
and ``bzip2 -d`` read them. Each codec checks what its format carries (gzip's CRC-32 and length
per member, zstd's frame checksum when the frame has one, xz's check, bzip2's block and stream
CRCs); damage or a cut-off stream is a ShardFormatError naming where, never bytes served.

Libraries: gzip through ISA-L (PyPI ``isal``, its ``igzip`` reader: several times zlib's speed,
docs/performance.md has the figures), zstd through ``zstandard`` (the reference library's
binding), xz and bzip2 through the standard library. Each reader returns at most what it is
asked for, however well the input compresses (a stream of zeros is no bomb): the decompressed
bytes go where the caller puts them, never all at once into memory.
"""

from __future__ import annotations

import bz2
import contextlib
import io
import lzma
import mmap
import threading
from dataclasses import dataclass
from typing import Callable

from shardfs.formats.base import ShardFormatError
from shardfs.storage.base import ShardIOError

READ = 1 << 20  # compressed bytes read from the shard at once
ZSTD_MAX_WINDOW = 1 << 27  # zstd's own default limit (128 MiB); a frame asking for more is refused
XZ_MEMLIMIT = 256 << 20  # xz -9e needs 65 MiB to decompress: a need far beyond is hostile


_counts = {"streams": 0, "bytes": 0}  # decompressions started in this process, and what they gave
_counts_lock = threading.Lock()


def counts() -> dict:
    """Streams decompressed (started) in this process and their bytes (the daemon's stats:
    ``decompressed``), by which a mount that decompresses nothing again shows that it did not."""
    with _counts_lock:
        return dict(_counts)


def _count(key: str, n: int) -> None:
    with _counts_lock:
        _counts[key] += n


@dataclass(frozen=True)
class Codec:
    name: str
    magic: bytes
    open: Callable[[io.RawIOBase], io.BufferedIOBase]  # a reader of the decompressed bytes


def _gzip(raw):
    from isal import igzip, isal_zlib  # ISA-L: see the module's docstring

    # igzip.GzipFile's own reader (its members, CRCs and lengths), without GzipFile around it,
    # whose readinto reads into a new buffer and copies: this one decompresses into the caller's.
    reader = getattr(isal_zlib, "_GzipReader", None)
    if reader is None:  # (python-isal before 1.6)
        return igzip.GzipFile(fileobj=raw, mode="rb")
    return io.BufferedReader(reader(raw, READ))


def _zstd(raw):
    import zstandard

    return zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW).stream_reader(
        raw, read_size=READ, read_across_frames=True, closefd=False)


def _xz(raw):
    # What lzma.LZMAFile reads with (several streams, padding), with the memory limit it does not
    # take: a header asking for a 1.5 GiB dictionary is refused, not allocated.
    import _compression

    return io.BufferedReader(_compression.DecompressReader(raw, lzma.LZMADecompressor, trailing_error=lzma.LZMAError,
                                                           format=lzma.FORMAT_XZ, memlimit=XZ_MEMLIMIT))


def _bz2(raw):
    return bz2.BZ2File(raw, "rb")


CODECS = (
    Codec("gzip", b"\x1f\x8b", _gzip),
    Codec("zstd", b"\x28\xb5\x2f\xfd", _zstd),
    Codec("xz", b"\xfd7zXZ\x00", _xz),
    Codec("bzip2", b"BZh", _bz2),
)
MAGICS = tuple(codec.magic for codec in CODECS)


def codec_of(head: bytes) -> Codec | None:
    """The codec a shard's first bytes name, or None."""
    return next((codec for codec in CODECS if head.startswith(codec.magic)), None)


class _ShardFile(io.RawIOBase):
    """A shard's bytes as a file read front to back, ``window`` at a time (the readers ask for
    8 KiB-1 MiB; a remote object is read 8 MiB a request).

    With ``read_at`` (``Shard.read_at``), windows are read into two buffers of its own, used in
    turn, and ``read`` hands out views of them, not copies: a decompressor takes its input as any
    bytes-like object, and asks for more only once it has used what it was given. So the input
    passes through memory whose pages are faulted in once per stream, not at every read (on a VM
    that gives freed pages back to its host, a fresh page costs a trip to the host)."""

    def __init__(self, pread: Callable[[int, int], bytes], size: int, window: int, watch=None, read_at=None):
        self.pread, self.size, self.watch, self._read_at = pread, size, watch, read_at
        self.window = -(-max(window, READ) // mmap.PAGESIZE) * mmap.PAGESIZE
        self.pos = 0  # the next byte handed out
        self._buf, self._at = b"", 0  # the last window read, and where in it ``pos`` is
        self._mems = [mmap.mmap(-1, self.window) for _ in range(2)] if read_at is not None else []
        self._turn = 0

    def readable(self) -> bool:
        return True

    def _pending(self, n: int | None) -> memoryview | None:
        """Up to ``n`` (None: all) of the bytes the last window has left, reading the next one
        first if none are; None at the end of the shard."""
        if self._at == len(self._buf):
            want = min(self.window, self.size - self.pos)
            if want <= 0:
                return None
            if self._read_at is None:
                self._buf = self.pread(self.pos, want)
            else:
                self._turn ^= 1
                self._buf = memoryview(self._mems[self._turn])[:want]
                self._read_at(self._buf, self.pos, want)
            self._at = 0
            if not self._buf:
                return None
        k = len(self._buf) - self._at if n is None or n < 0 else min(n, len(self._buf) - self._at)
        data = memoryview(self._buf)[self._at : self._at + k]
        self._at += k
        self.pos += k
        if self.watch is not None:
            self.watch(data)
        return data

    def read(self, n: int = -1):
        data = self._pending(n)
        return b"" if data is None else data

    def readinto(self, buf) -> int:
        data = self._pending(len(buf))
        if data is None:
            return 0
        buf[: len(data)] = data
        return len(data)

    def close(self) -> None:
        super().close()
        self._buf = b""
        for mem in self._mems:
            with contextlib.suppress(BufferError):  # a view still held: the mapping goes with it
                mem.close()


class ZstdFrames:
    """zstd's framing followed in the compressed bytes as they pass (frame headers, block sizes,
    checksums, skippable frames; not the data): whether the input ended where a frame ends. The
    library's reader ends quietly where its input ends, even inside a frame (tried: 0.25)."""

    ZSTD, SKIPPABLE = 0xFD2FB528, 0x184D2A50  # skippable: 0x184D2A50-5F

    def __init__(self):
        self.state, self.want, self.held = "magic", 4, b""  # the next field's size, and its bytes so far
        self.skip = 0  # bytes of data to pass over before the next field
        self.checksum = False
        self.bad = False  # not zstd framing: the library says what is wrong

    @property
    def complete(self) -> bool:
        return not self.bad and self.state == "magic" and not self.held and not self.skip

    def __call__(self, data) -> None:
        pos, n = 0, len(data)
        while pos < n and not self.bad:
            if self.skip:
                step = min(self.skip, n - pos)
                self.skip -= step
                pos += step
                continue
            take = min(self.want - len(self.held), n - pos)
            self.held += bytes(data[pos : pos + take])
            pos += take
            if len(self.held) == self.want:
                field, self.held = self.held, b""
                self._field(int.from_bytes(field, "little"))

    def _field(self, value: int) -> None:
        state = self.state
        if state == "magic":
            if value == self.ZSTD:
                self.state, self.want = "descriptor", 1
            elif value & ~0xF == self.SKIPPABLE:
                self.state, self.want = "skippable", 4
            else:
                self.bad = True
        elif state == "skippable":
            self.state, self.want, self.skip = "magic", 4, value
        elif state == "descriptor":
            single = value >> 5 & 1
            self.checksum = bool(value >> 2 & 1)
            self.skip = (0 if single else 1) + (0, 1, 2, 4)[value & 3] + ((single, 2, 4, 8)[value >> 6])
            self.state, self.want = "block", 3
        elif state == "block":
            kind, size = value >> 1 & 3, value >> 3
            if kind == 3:  # reserved
                self.bad = True
                return
            self.skip = 1 if kind == 1 else size  # an RLE block stores one byte
            if value & 1:  # the frame's last block
                self.skip += 4 if self.checksum else 0
                self.state, self.want = "magic", 4


class Stream:
    """The decompressed bytes of a shard, read front to back (``read``); ``pos`` is how many
    were read so far. Errors of the data are ShardFormatError (with the offset in the
    decompressed stream); a failed read of the shard stays a ShardIOError."""

    def __init__(self, codec: Codec, pread: Callable[[int, int], bytes], size: int, window: int = READ,
                 read_at=None):
        """``read_at``: the shard's ``read_at``, to read its bytes into buffers of the stream's own."""
        self.codec, self.pos = codec, 0
        self.frames = ZstdFrames() if codec.name == "zstd" else None
        self.raw = _ShardFile(pread, size, window, self.frames, read_at)
        self._reader = codec.open(self.raw)
        _count("streams", 1)

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes (fewer only at the end of the stream)."""
        with self._errors():
            data = self._reader.read(n)
        self._advance(len(data), n)
        return data

    def readinto(self, buf) -> int:
        """As ``read``, into ``buf`` (a writable buffer): the bytes it holds."""
        with self._errors():
            got = self._reader.readinto(buf)
        self._advance(got, len(buf))
        return got

    @contextlib.contextmanager
    def _errors(self):
        try:
            yield
        except ShardIOError:
            raise
        except EOFError:
            raise ShardFormatError(f"{self.codec.name} stream cut short: the file ends inside it") from None
        except (OSError, ValueError, lzma.LZMAError, *_library_errors()) as exc:
            raise ShardFormatError(f"damaged {self.codec.name} data (read up to byte {self.raw.pos} of the file): "
                                   f"{exc}") from None

    def _advance(self, got: int, asked: int) -> None:
        if not got and asked:
            self._check_whole()
        self.pos += got
        _count("bytes", got)

    def _check_whole(self) -> None:
        """zstd's reader ends quietly where the input ends, even inside a frame: a cut-off frame is
        found by what was left over."""
        if self.frames is not None and (self.raw.pos < self.raw.size or not self.frames.complete):
            raise ShardFormatError("zstd stream cut short: the file ends inside a frame")

    def close(self) -> None:
        self._reader.close()
        self.raw.close()


def _library_errors() -> tuple[type[Exception], ...]:
    """What the libraries raise for bad data beside OSError (isal's IsalError is none: found by
    fuzzing, tests/fuzz/corpus/ctar_stream/)."""
    import zstandard
    from isal import isal_zlib

    return zstandard.ZstdError, isal_zlib.error
