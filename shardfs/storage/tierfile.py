"""One shard's file in the disk tier, and the tier directory as a whole (listing, clearing).

A cache file, named by a hash of the shard's path or URL:

    [header, 4 KiB: MAGIC, then the shard's identity as one JSON line (path, size, mtime_ns, tag)]
    [one record per 1 MiB chunk: RECORD_MAGIC, then the crc32 of each of its 16 KiB blocks]
    [the shard's bytes, page aligned; sparse until filled]

A chunk's data is written before its record, and every read from the file checks the crc32 of
the blocks it returns, so a chunk is trusted only once its record is there *and* its bytes match
it: a torn write, a crash between the two writes or a flipped bit on disk all show as a mismatch
and the chunk is read from shared storage again. That is why no fsync is needed. crc32 (zlib, in
the standard library) runs at ~2 GB/s here, far above a local disk's random reads, and catches
exactly the accidents a local disk has; nobody else can write the files (0600 in a 0700 folder).

Locks, all released by the kernel when a daemon dies:
* ``flock`` shared, on every cache file a daemon uses, for as long as it uses it: eviction and
  ``shardfs cache clear`` remove only files they can lock exclusively;
* ``lockf`` on byte 0, taken without waiting: the daemon holding it is the shard's filler, the one
  that writes chunks; the others wait for the chunks to appear (or take over when it goes away).
Files are created under a temporary name and linked into place, so a name always holds a whole
header, and two daemons creating the same shard's file at once end up sharing one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import stat
import struct
import threading
import zlib
from dataclasses import dataclass

CHUNK = 1 << 20  # the RAM cache's chunk: one RAM chunk load is one tier chunk
# A checksum covers this much: a member read reads and checks little more than itself (a 110 KB
# JPEG reads ~1.15x its bytes; with 64 KiB blocks it read ~1.5x, the limit of epochs from the tier).
BLOCK = 16 << 10
BLOCKS = CHUNK // BLOCK
HEADER = 4096
MAGIC = b"shardfs disk tier 2\n"  # 2: 16 KiB blocks (files of 1 are replaced when next opened)
RECORD = struct.Struct(f"<I{BLOCKS}I")
RECORD_MAGIC = 0x4B4E4843
SUFFIX = ".shard"
PAGE = 4096


def identity(shard) -> dict:
    """What makes cached bytes the shard's bytes: a change of any of these drops the file."""
    return {"path": shard.path, "size": shard.size, "mtime_ns": shard.mtime_ns, "tag": getattr(shard, "tag", None)}


def file_name(path: str) -> str:
    return hashlib.blake2b(path.encode(), digest_size=16).hexdigest() + SUFFIX


def prepare_dir(directory: str) -> None:
    """Create the tier directory private to us (0700), or check that an existing one is ours."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    st = os.stat(directory)
    if st.st_uid != os.getuid():
        raise PermissionError(f"{directory} belongs to another user")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(directory, 0o700)


def checksums(data) -> tuple[int, ...]:
    view = memoryview(data)
    crcs = [zlib.crc32(view[i : i + BLOCK]) for i in range(0, len(view), BLOCK)]
    return tuple(crcs + [0] * (BLOCKS - len(crcs)))


def header_of(ident: dict) -> bytes:
    return MAGIC + json.dumps(ident).encode() + b"\n"


def fits(ident: dict) -> bool:
    """Whether a shard's identity fits a header (a path or URL of up to ~4,000 characters)."""
    return len(header_of(ident)) <= HEADER


def read_header(fd: int) -> dict | None:
    raw = os.pread(fd, HEADER, 0)
    if not raw.startswith(MAGIC):
        return None
    try:
        return json.loads(raw[len(MAGIC) :].split(b"\n", 1)[0])
    except ValueError:
        return None


class TierFile:
    """An open cache file; holds a shared flock for as long as it is open."""

    def __init__(self, fd: int, path: str, ident: dict):
        self.fd, self.path, self.ident = fd, path, ident
        self.size = ident["size"]
        self.nchunks = -(-self.size // CHUNK)
        self.data_at = -(-(HEADER + self.nchunks * RECORD.size) // PAGE) * PAGE
        # We read whole checksum blocks or whole chunks: kernel readahead would only read more.
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)

    @classmethod
    def open_or_create(cls, directory: str, ident: dict) -> TierFile | None:
        """The shard's file (made if missing); None when a file of another version of the shard
        is in use by another daemon. OSError when the local disk fails."""
        path = os.path.join(directory, file_name(ident["path"]))
        for _ in range(10):  # only races with other daemons loop
            try:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                made = cls._create(directory, path, ident)
                if made is not None:
                    return made
                continue
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                current = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                current = False
            if not current:  # evicted between our open and our lock
                os.close(fd)
                continue
            if read_header(fd) == ident:
                return cls(fd, path, ident)
            # The source changed (or the file is damaged): drop it unless another daemon reads it.
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            os.unlink(path)
            os.close(fd)
        return None

    @classmethod
    def _create(cls, directory: str, path: str, ident: dict) -> TierFile | None:
        tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{threading.get_ident()}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # before the name exists: nobody can evict it in between
            made = cls(fd, path, ident)
            os.pwrite(fd, header_of(ident), 0)
            os.ftruncate(fd, made.data_at + made.size)
            os.link(tmp, path)  # atomic, and never replaces a file another daemon made meanwhile
            return made
        except FileExistsError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        finally:
            os.unlink(tmp)

    # ---- locks ---------------------------------------------------------------------------

    def take_fill_lock(self) -> bool:
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
            return True
        except OSError:
            return False

    def release_fill_lock(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, 0)

    def close(self) -> None:
        os.close(self.fd)  # releases both locks

    # ---- chunks ---------------------------------------------------------------------------

    def records(self) -> list[tuple[int, ...] | None]:
        raw = os.pread(self.fd, self.nchunks * RECORD.size, HEADER)
        return [self._parse(raw[i * RECORD.size : (i + 1) * RECORD.size]) for i in range(self.nchunks)]

    def record(self, chunk: int) -> tuple[int, ...] | None:
        return self._parse(os.pread(self.fd, RECORD.size, HEADER + chunk * RECORD.size))

    @staticmethod
    def _parse(raw: bytes) -> tuple[int, ...] | None:
        if len(raw) < RECORD.size:
            return None
        fields = RECORD.unpack(raw)
        return fields[1:] if fields[0] == RECORD_MAGIC else None

    def write_chunk(self, chunk: int, data) -> None:
        """Data first, then its record (see the module's docstring)."""
        self.write_record(chunk, self.write_data(chunk, data))

    def write_data(self, chunk: int, data) -> tuple[int, ...]:
        """A chunk's bytes, not trusted until ``write_record`` writes the checksums returned."""
        if os.pwrite(self.fd, data, self.data_at + chunk * CHUNK) != len(data):
            raise OSError(errno.ENOSPC, "short write (disk full?)")
        return checksums(data)

    def write_record(self, chunk: int, crcs: tuple[int, ...]) -> None:
        os.pwrite(self.fd, RECORD.pack(RECORD_MAGIC, *crcs), HEADER + chunk * RECORD.size)

    def forget(self, offset: int, length: int) -> None:
        """Bytes of the shard held elsewhere now (RAM): drop the kernel's copy. A hint: dirty
        pages are only sent to disk, and a folio reaching outside the range stays."""
        with contextlib.suppress(OSError):
            os.posix_fadvise(self.fd, self.data_at + offset, length, os.POSIX_FADV_DONTNEED)

    def read_verified(self, chunk: int, crcs: tuple[int, ...], lo: int, hi: int, into=None):
        """Bytes lo..hi of the shard (within ``chunk``) if the blocks holding them match ``crcs``,
        else None. With ``into`` (a buffer of the whole shard) they are read into it instead."""
        start = chunk * CHUNK
        first, last = (lo - start) // BLOCK, (hi - 1 - start) // BLOCK
        begin, end = start + first * BLOCK, min(start + (last + 1) * BLOCK, self.size)
        if into is not None:
            view = memoryview(into)[begin:end]
            if os.preadv(self.fd, [view], self.data_at + begin) != end - begin:
                return None
        else:
            view = memoryview(os.pread(self.fd, end - begin, self.data_at + begin))
            if len(view) != end - begin:
                return None
        for i in range(last - first + 1):
            if zlib.crc32(view[i * BLOCK : (i + 1) * BLOCK]) != crcs[first + i]:
                return None
        return True if into is not None else view[lo - begin : hi - begin]


# ---- the directory as a whole (eviction, `shardfs cache ls|clear`) -------------------------------


@dataclass
class CachedShard:
    path: str  # the cache file
    source: str  # the shard's path or URL ("?" when the header cannot be read)
    size: int  # the shard's size
    filled: int  # bytes of it held (chunks with a record)
    disk_bytes: int  # what the file takes on disk
    mtime: float  # last use
    in_use: bool  # some daemon has it open


def cache_files(directory: str) -> list[os.DirEntry]:
    try:
        with os.scandir(directory) as it:
            return [e for e in it if e.name.endswith(SUFFIX) and not e.name.startswith(".")]
    except FileNotFoundError:
        return []


def logical_size(entry: os.DirEntry) -> int:
    """What a file counts against the tier's bound: the whole shard, filled or not."""
    try:
        return entry.stat().st_size
    except FileNotFoundError:
        return 0


def remove_if_unused(path: str) -> bool:
    """Remove a cache file no daemon has open; False if one does (or it is gone already)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    else:
        with contextlib.suppress(FileNotFoundError):
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                os.unlink(path)
                return True
        return False
    finally:
        os.close(fd)


def describe(directory: str) -> list[CachedShard]:
    found = []
    for entry in cache_files(directory):
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            st = os.fstat(fd)
            ident = read_header(fd)
            filled, in_use = 0, False
            if ident is not None:
                tf = TierFile(fd, entry.path, ident)
                filled = min(sum(CHUNK for r in tf.records() if r is not None), tf.size)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                in_use = True
            found.append(CachedShard(entry.path, ident["path"] if ident else "?", ident["size"] if ident else 0,
                                     filled, st.st_blocks * 512, st.st_mtime, in_use))
        finally:
            os.close(fd)
    return sorted(found, key=lambda c: c.source)


def clear(directory: str) -> tuple[int, int]:
    """Remove every cache file no daemon has open (and leftover temporary files of dead ones).
    Returns (removed, skipped because in use)."""
    removed = skipped = 0
    for entry in cache_files(directory):
        if remove_if_unused(entry.path):
            removed += 1
        else:
            skipped += 1
    with os.scandir(directory) as it:
        for entry in it:
            if entry.name.endswith(".tmp") and not _creator_alive(entry.name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
    return removed, skipped


def _creator_alive(tmp_name: str) -> bool:
    try:
        pid = int(tmp_name.split(".")[-3])
        os.kill(pid, 0)
        return True
    except (ValueError, IndexError, ProcessLookupError):
        return False
    except PermissionError:
        return True
