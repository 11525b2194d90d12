"""Shard formats, chosen by file suffix, then by the file's first bytes where they carry another
format's magic (a ``.tar`` that is gzip inside is a compressed tar). A format module is imported
only when used.

One line of ``REGISTRY`` registers a format: its module, its suffixes, and the bytes its files
begin with (any of them; none for formats that have no magic at their start, such as tar). The
sources' messages ("looked for ...") list the suffixes from it. The first bytes cost no read of
their own: a scan that finds another format's magic where its own header should be (``carries_magic``)
raises OtherFormat with them, and the index build reads the shard as ``format_of`` says.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from shardfs.formats.base import OtherFormat, ShardFormat, ShardFormatError  # noqa: F401 (re-exported)


@dataclass(frozen=True)
class Registered:
    module: str
    suffixes: tuple[str, ...]
    magic: tuple[bytes, ...] = ()  # how its files begin: a file of another suffix with these bytes is this format
    # The format a file of these suffixes is when it begins with none of ``magic`` (a .tar.gz that a
    # browser decompressed as it downloaded it, keeping its name, is a plain tar).
    plain: str | None = None


REGISTRY = (
    Registered("tar", (".tar",)),
    Registered("lz4shard", (".lz4shard",)),
    Registered("parquet", (".parquet",)),
    Registered("arrowipc", (".arrow",)),
    Registered("hdf5", (".h5", ".hdf5")),
    Registered("zip", (".zip",)),
    Registered("squashfs", (".sqfs", ".squashfs")),
    # gzip (also pigz, several members), zstd, xz, bzip2 (formats/compressed.py)
    Registered("ctar", (".tar.gz", ".tgz", ".tar.zst", ".tar.zstd", ".tzst", ".tar.xz", ".txz", ".tar.bz2", ".tbz2",
                        ".tbz"), (b"\x1f\x8b", b"\x28\xb5\x2f\xfd", b"\xfd7zXZ\x00", b"BZh"), plain="tar"),
)
# Dataset files (datafile.py): each row a sample, shown as SPLIT/CLASS/NAME.EXT.
DATA_FORMATS = ("parquet", "arrow", "hdf5")
# The longest suffix wins (".tar.gz" before ".gz" of another format), whatever the order above.
_BY_SUFFIX = sorted(((s, r) for r in REGISTRY for s in r.suffixes), key=lambda item: -len(item[0]))


def suffixes() -> tuple[str, ...]:
    return tuple(s for r in REGISTRY for s in r.suffixes)


def _load(module: str) -> ShardFormat:
    return importlib.import_module(f"{__name__}.{module}").FORMAT


def format_for(path: str) -> ShardFormat | None:
    """The format a shard's name says (its suffix), or None."""
    for suffix, registered in _BY_SUFFIX:
        if path.endswith(suffix):
            return _load(registered.module)
    return None


def carries_magic(head: bytes) -> bool:
    """Whether ``head`` (a shard's first bytes) begins with a registered format's magic."""
    return any(head.startswith(magic) for registered in REGISTRY for magic in registered.magic)


def format_of(path: str, head: bytes) -> ShardFormat | None:
    """The format of a shard named ``path`` whose first bytes are ``head``: the one whose magic
    they carry, else the one its suffix says (its ``plain`` one where it has magic and ``head``
    none of it); None if neither."""
    for registered in REGISTRY:
        if any(head.startswith(magic) for magic in registered.magic):
            return _load(registered.module)
    for suffix, registered in _BY_SUFFIX:
        if path.endswith(suffix):
            return _load(registered.plain if registered.magic and registered.plain else registered.module)
    return None
