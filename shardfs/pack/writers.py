"""Write one shard (tar or lz4) from a list of members, byte-identically for the same input.

Tar headers carry nothing from the environment: uid/gid 0, empty user and group
names, the member's own mode (0644/0755) and integer mtime, PAX records only for
what ustar cannot hold (long or non-ASCII names). Every shard is written to
``NAME.tmp``, fsynced and renamed, then indexed (``NAME.shardfs-idx``) so that the
first mount reads no headers.

:class:`SizeBound` gives, before anything is written, an upper bound of the shard
file size (exact for tar; for lz4 the bound assumes no block compresses), so the
planner can cut shards under a byte limit.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
from dataclasses import dataclass
from typing import Callable

from shardfs.errors import ShardfsError
from shardfs.index import store as index_store
from shardfs.pack.inputs import Member

TAR_BLOCK = 512
TAR_RECORD = 20 * TAR_BLOCK  # what tar(1) and tarfile pad archives to
SUFFIXES = {"tar": ".tar", "lz4": ".lz4shard"}

Progress = Callable[[int, int], None]  # (files, bytes) just written


class PackError(ShardfsError):
    """Writing failed (a source changed or vanished, a disk error); the message says which file."""


@dataclass
class ShardInfo:
    name: str
    format: str
    size: int
    members: int
    data_bytes: int
    sha256: str


def _pad(n: int, to: int = TAR_BLOCK) -> int:
    return -n % to


def tar_header(name: str, size: int, mode: int, mtime: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, mode, mtime
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def tar_member_bytes(m: Member) -> int:
    if len(m.name) <= 100 and m.name.isascii() and m.size < 8**11 and 0 <= m.mtime < 8**11:
        header = TAR_BLOCK  # plain ustar: no PAX record needed
    else:
        header = len(tar_header(m.name, m.size, m.mode, m.mtime))
    return header + m.size + _pad(m.size)


class SizeBound:
    """Upper bound of a shard's file size as members are added."""

    def __init__(self, fmt: str, block_size: int):
        self.fmt, self.block_size = fmt, block_size
        self.count = self.body = self.names = 0

    def _total(self, count: int, body: int, names: int) -> int:
        if self.fmt == "tar":
            end = body + 2 * TAR_BLOCK
            return end + _pad(end, TAR_RECORD)
        blocks = -(-body // self.block_size)
        return 16 + body + 24 * blocks + 40 * count + names + 88  # stored <= raw for every block

    def _cost(self, m: Member) -> tuple[int, int]:
        if self.fmt == "tar":
            return tar_member_bytes(m), 0
        return m.size, len(m.key)

    def with_members(self, ms: list[Member]) -> int:
        costs = [self._cost(m) for m in ms]
        return self._total(self.count + len(ms), self.body + sum(c[0] for c in costs),
                           self.names + sum(c[1] for c in costs))

    def add(self, m: Member) -> None:
        body, names = self._cost(m)
        self.count, self.body, self.names = self.count + 1, self.body + body, self.names + names


def read_member(m: Member) -> bytes:
    try:
        with open(m.source, "rb") as f:
            if m.offset >= 0:
                f.seek(m.offset)
                data = f.read(m.size)
            else:
                data = f.read(m.size + 1)
    except OSError as exc:
        raise PackError(f"{m.source}: cannot read: {exc.strerror}") from None
    if len(data) != m.size:
        raise PackError(f"{m.source}: changed while packing ({len(data)} bytes, expected {m.size})")
    return data


def _write_all(fd: int, parts: list) -> None:
    want = sum(len(p) for p in parts)
    done = os.writev(fd, parts)
    if done != want:  # a short write (rare: signals, full quota): finish it piece by piece
        rest = b"".join(parts)[done:]
        while rest:
            rest = rest[os.write(fd, rest):]


def _write_tar(path: str, members: list[Member], progress: Progress | None) -> str:
    """Write to path (a temp name); return the sha256 of what was written."""
    digest = hashlib.sha256()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        written = 0
        for m in members:
            data = read_member(m)
            parts = [tar_header(m.name, m.size, m.mode, m.mtime), data, bytes(_pad(m.size))]
            for part in parts:
                digest.update(part)
            _write_all(fd, parts)
            written += sum(len(p) for p in parts)
            if progress:
                progress(1, m.size)
        end = bytes(2 * TAR_BLOCK + _pad(written + 2 * TAR_BLOCK, TAR_RECORD))
        digest.update(end)
        _write_all(fd, [end])
        os.fsync(fd)
    finally:
        os.close(fd)
    return digest.hexdigest()


def _write_lz4(path: str, members: list[Member], block_size: int, progress: Progress | None) -> None:
    from shardfs.formats.lz4shard import Lz4ShardWriter

    with Lz4ShardWriter(path, block_size=block_size) as w:  # writes path.tmp, fsyncs, renames
        for m in members:
            w.add_file(m.name, read_member(m), mode=m.mode, mtime=m.mtime)
            if progress:
                progress(1, m.size)


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(4 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_shard(path: str, fmt: str, members: list[Member], block_size: int = 1 << 20,
                progress: Progress | None = None) -> ShardInfo:
    """Write the shard at ``path`` (never partially: temp name, fsync, rename) and index it."""
    tmp = path + ".tmp"
    try:
        if fmt == "tar":
            sha = _write_tar(tmp, members, progress)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        else:
            _write_lz4(path, members, block_size, progress)
            os.chmod(path, 0o644)
            sha = sha256_file(path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and exc.filename is None:  # a write or fsync (a full disk): name the shard
            raise OSError(exc.errno, exc.strerror, path) from None
        raise
    ix, _how = index_store.load_or_build(path, rebuild=True)
    if ix.error or ix.warnings or len(ix) != len(members):
        raise PackError(f"{path}: the shard just written does not read back: "
                        f"{ix.error or '; '.join(ix.warnings) or f'{len(ix)} of {len(members)} members'}")
    return ShardInfo(os.path.basename(path), fmt, os.path.getsize(path), len(members),
                     sum(m.size for m in members), sha)
