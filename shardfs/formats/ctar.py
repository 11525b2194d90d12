"""Compressed tar shards (``.tar.gz``/``.tgz``, ``.tar.zst``, ``.tar.xz``, ``.tar.bz2``, or a
``.tar`` that is one of them inside): served as the tar they decompress to.

A compressed stream cannot be read from the middle, so a shard is decompressed whole, once,
front to back (compressed.py), and everything above works on the decompressed tar, the shard's
*logical stream* (base.py): the index's offsets point into it, the RAM cache and the disk tier
hold it (their budgets count its bytes), the compiled loop serves members from them as from a
tar shard's. Two shards stand for one (both ``Shard``, with the decompressed size and an
identity of their own, ``tag``, so that the caches never take one for the stored file):

* ``SpooledShard``, at an index build: the stream written once to a scratch file (unlinked at
  once: nothing is left behind) while it is decompressed, then scanned as a tar from there, and
  read by the build's keeper (storage/buildfill.py) into the disk tier and the RAM cache. So the
  index is built in the pass that fills the caches: one decompression.
* ``StreamShard``, when serving: the stream decompressed front to back as the caches ask for
  its bytes (a RAM cache load, a disk tier fill: in file order, one pass). A read behind the
  stream's position starts it again from the beginning: the slow path of a shard that neither
  cache holds (no disk tier, and more than the RAM cache can give), said once in the log.

Damage (a cut-off stream, a CRC that does not match) refuses the whole shard with one line: a
compressed stream's check is known only at its end, so no member of it is trusted before.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading

from shardfs.formats import compressed, format_for
from shardfs.formats.base import OtherFormat, ShardFormatError
from shardfs.formats.tar import TarFormat
from shardfs.storage.base import Shard, ShardIOError

log = logging.getLogger(__name__)

SPOOL = 4 << 20  # decompressed bytes written to the scratch file at once
BEHIND = 1 << 20  # what a StreamShard keeps of what it last gave (a read just behind needs no restart)


class CompressedTarFormat(TarFormat):
    name = "ctar"
    suffixes = (".tar.gz", ".tgz", ".tar.zst", ".tar.zstd", ".tzst", ".tar.xz", ".txz", ".tar.bz2", ".tbz2", ".tbz")
    decompresses = True  # index builds read it through ``spooled`` (shard_index.build)

    def spooled(self, shard: Shard, scratch: str | None = None) -> SpooledShard:
        return SpooledShard(shard, scratch)


FORMAT = CompressedTarFormat()


def _codec(shard: Shard) -> compressed.Codec:
    codec = compressed.codec_of(shard.pread(0, 8))
    if codec is None:
        raise ShardFormatError("not gzip, zstd, xz or bzip2 data")
    return codec


def _codec_at_build(shard: Shard) -> compressed.Codec:
    """Its codec; OtherFormat where it has none (a plain tar named .tar.gz: the build reads it so)."""
    head = shard.pread(0, 512)
    codec = compressed.codec_of(head)
    if codec is None:
        raise OtherFormat(head)
    return codec


class _Decompressed(Shard):
    """A compressed shard seen as its decompressed tar: ``stored`` is the shard as stored."""

    def __init__(self, stored: Shard, size: int):
        super().__init__(stored.path, size, stored.mtime_ns)
        self.stored, self.remote, self.window = stored, stored.remote, max(stored.window, 1 << 20)
        # the caches' identity of its bytes (tierfile.identity, peers): never the stored file's
        self.tag = f"decompressed:{stored.size}:{getattr(stored, 'tag', None) or ''}"

    def changed(self) -> bool:
        return self.stored.changed()

    def close(self) -> None:
        self.stored.close()


class SpooledShard(_Decompressed):
    """The decompressed tar of ``stored``, written to an unlinked scratch file in ``scratch``
    (default: TMPDIR) as it is decompressed. ShardFormatError for damage; OtherFormat if it is
    not compressed at all."""

    def __init__(self, stored: Shard, scratch: str | None = None):
        codec = _codec_at_build(stored)
        self.codec = codec.name
        scratch = scratch or tempfile.gettempdir()
        self._fd = _scratch_file(scratch)
        try:
            size = _spool(compressed.Stream(codec, stored.pread, stored.size, stored.window), self._fd, _room(scratch))
        except BaseException:
            os.close(self._fd)
            raise
        super().__init__(stored, size)

    def _pread(self, offset: int, length: int) -> bytes:
        return os.pread(self._fd, length, offset)

    def close(self) -> None:  # (not the stored shard: its opener closes it)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _room(directory: str) -> int:
    """What a spool may take of the scratch space: its free space but a tenth (a stream of zeros
    that decompresses to terabytes is refused, not allowed to fill the node's disk)."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize - st.f_blocks * st.f_frsize // 10


def _scratch_file(directory: str) -> int:
    try:
        return os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except (OSError, AttributeError):  # a file system without O_TMPFILE
        fd, path = tempfile.mkstemp(dir=directory)
        os.unlink(path)
        return fd


def _spool(stream: compressed.Stream, fd: int, room: int) -> int:
    at = 0
    try:
        while True:
            data = stream.read(SPOOL)
            if not data:
                return at
            if at + len(data) > room:
                raise ShardFormatError(f"decompresses to more than the {max(room, 0) >> 20} MiB its scratch space "
                                       "(TMPDIR) can take")
            os.pwrite(fd, data, at)
            at += len(data)
    finally:
        stream.close()


class StreamShard(_Decompressed):
    """The decompressed tar of ``stored`` (``size`` bytes, from its index), read front to back."""

    in_order_only = True  # the RAM cache's loader reads it, in order; its readers wait (ram.py)

    def __init__(self, stored: Shard, size: int):
        super().__init__(stored, size)
        self._stream: compressed.Stream | None = None
        self._behind = bytearray()  # the last bytes the stream gave, ending at its position
        self._restarts = 0
        self._lock_stream = threading.Lock()

    def _pread(self, offset: int, length: int) -> bytes:
        with self._lock_stream:
            try:
                return self._read(offset, length)
            except ShardFormatError as exc:  # the index was built from these bytes: they changed
                self._stream = None
                raise self.read_failed(offset, str(exc)) from None

    def _read(self, offset: int, length: int) -> bytes:
        stream = self._stream
        if stream is None or offset < stream.pos - len(self._behind):
            if stream is not None:
                stream.close()
                self._restarts += 1
                if self._restarts == 1:
                    log.warning("%s: read out of order while neither cache holds it: each such read "
                                "decompresses it again from its start (give it a disk tier, or more RAM)", self.path)
            stream = self._stream = compressed.Stream(_codec(self.stored), self.stored.pread, self.stored.size,
                                                      self.stored.window)
            self._behind = bytearray()
        behind = self._behind
        while stream.pos < offset + length:
            data = stream.read(SPOOL)
            if not data:
                break
            behind += data
            keep = max(BEHIND, stream.pos - offset)  # from the offset asked for, once the stream is past it
            if len(behind) > keep:
                del behind[: len(behind) - keep]
        start = offset - (stream.pos - len(behind))
        if start < 0 or start + length > len(behind):
            self._stream = None
            raise ShardIOError(f"{self.path}: its decompressed stream ends at {stream.pos}, before {offset + length}")
        return bytes(behind[start : start + length])

    def close(self) -> None:
        with self._lock_stream:
            if self._stream is not None:
                self._stream.close()
                self._stream = None
        super().close()


def stored_of(shard: Shard) -> Shard:
    """The shard as stored, under a decompressed view and the layers that wrap one (peers)."""
    inner = getattr(shard, "inner", shard)
    return getattr(inner, "stored", inner)


def logical_size_of(shard: Shard) -> int:
    """The size of the tar a compressed shard decompresses to (under the layers that wrap it); 0
    for any other shard."""
    inner = getattr(shard, "inner", shard)
    return inner.size if isinstance(inner, _Decompressed) else 0


def format_name(shard: Shard) -> str:
    """The format a served shard is read as: a compressed tar by what it is, not by its name (a
    .tar that is gzip inside; a .tar.gz that is a plain tar)."""
    if logical_size_of(shard):
        return FORMAT.name
    fmt = format_for(shard.path)
    return "tar" if fmt is FORMAT else fmt.name  # (REGISTRY's plain format of a compressed tar's suffix)
