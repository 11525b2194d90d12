"""What the dataset-file formats (Parquet, Arrow IPC, HDF5) share: which columns hold the image
and the label, and the name each row is shown under.

Each row of such a file is one sample. A format finds where each row's image bytes lie and its
label; this module turns that into member records named ``SPLIT/NAME.EXT`` with the label beside
(the view adds the class folder: view/layouts.py), so that the rest of shardfs sees them as it
sees any shard's members.
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
import re
from dataclasses import dataclass

from shardfs.errors import UsageError
from shardfs.formats.base import ByteSource, Kind, MemberRecord, ScanResult, ShardFormatError

# By convention (first that fits): Hugging Face's `image` struct and `label`; the JSC course's
# Arrow (`image_data`/`label`) and HDF5 (`images`/`targets`) names. Else one binary and one integer column.
IMAGE_NAMES = ("image", "image_data", "images", "img", "jpg")
LABEL_NAMES = ("label", "labels", "targets", "target", "cls")
_MAGIC = (  # (prefix, offset, extension): what the bytes say they are
    (b"\xff\xd8\xff", 0, "jpg"), (b"\x89PNG\r\n\x1a\n", 0, "png"), (b"GIF8", 0, "gif"), (b"WEBP", 8, "webp"),
    (b"BM", 0, "bmp"), (b"II*\x00", 0, "tif"), (b"MM\x00*", 0, "tif"),
)
HEAD = 12  # bytes of an image enough to tell its type
# A scan that walks a file whose metadata lies between the images (Arrow batches, Parquet values)
# reads it in windows this large: more bytes than the metadata, but a read per several images
# rather than two per image, where reads (IOPS), not bytes, are what shared storage runs out of.
SCAN_WINDOW = 1 << 20
_SPLITS = ("train", "validation", "valid", "val", "test")
# A split's name as a word of the file name: `train-00000-of-00294.parquet`, the course's `ImageNet-val.arrow`.
_SPLIT_IN_NAME = re.compile(r"(?:^|[-_.])(train|validation|valid|val|test)(?=[-_.]|$)")


class MissingReader(UsageError):
    """A dataset file met without the library that reads it (one message argument: it crosses
    from an index worker process as a pickle)."""


class NoColumns(UsageError):
    """A dataset file none of whose columns is an image and a label (by convention or --columns)."""


# What hostile bytes raise in the decoding of a format's structures (a field missing or of another
# type, a buffer too short, a value out of range): each becomes a ShardFormatError naming the place.
# RuntimeError: h5py's for damaged metadata.
MALFORMED = (KeyError, IndexError, TypeError, ValueError, AttributeError, OverflowError, RuntimeError, struct.error)


@contextlib.contextmanager
def checked(where: str):
    try:
        yield
    except MALFORMED as exc:
        raise ShardFormatError(f"{where}: malformed ({type(exc).__name__}: {exc})") from None


def need(module: str, path: str):
    """Import a reader library, or say which package to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingReader(f"{os.path.basename(path)}: reading it needs {module.split('.')[0]}: "
                            "pip install 'shardfs[formats]'") from None


class FileObject(io.RawIOBase):
    """A ByteSource as the file object pyarrow and h5py read (local or remote alike)."""

    def __init__(self, src: ByteSource):
        self.src, self.pos = src, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = (pos, self.pos + pos, self.src.size + pos)[whence]
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, b) -> int:
        data = self.src.pread(self.pos, min(len(b), max(self.src.size - self.pos, 0)))
        b[: len(data)] = data
        self.pos += len(data)
        return len(data)


@dataclass(frozen=True)
class Columns:
    """``--columns image=COL,label=COL``: the columns to use, else found by convention."""

    image: str | None = None
    label: str | None = None

    @classmethod
    def parse(cls, spec: str | None) -> "Columns":
        if not spec:
            return cls()
        fields = {}
        for part in spec.split(","):
            key, sep, value = part.partition("=")
            if not sep or key.strip() not in ("image", "label") or not value.strip():
                raise UsageError(f"--columns {spec!r}: expected image=COL,label=COL")
            fields[key.strip()] = value.strip()
        return cls(**fields)

    def __str__(self) -> str:
        return ",".join(f"{k}={v}" for k, v in (("image", self.image), ("label", self.label)) if v)


def choose(path: str, columns: Columns, binary: list[str], integer: list[str], every: list[str]) -> tuple[str, str]:
    """(image column, label column) of a file whose binary and integer columns are given;
    NoColumns naming the file and its columns when none fits."""

    def pick(named: str | None, conventional: tuple[str, ...], candidates: list[str]) -> str | None:
        if named is not None:
            return named if named in candidates else None
        for name in conventional:
            if name in candidates:
                return name
        return candidates[0] if len(candidates) == 1 else None

    image, label = pick(columns.image, IMAGE_NAMES, binary), pick(columns.label, LABEL_NAMES, integer)
    if image is None or label is None:
        asked = f" (asked for {columns})" if columns.image or columns.label else ""
        raise NoColumns(f"{os.path.basename(path)}: no image and label columns{asked}; it has "
                        f"{', '.join(every) or 'none'} (name them with --columns image=COL,label=COL)")
    return image, label


def split_of(path: str) -> str:
    """The split a file's name or folder says (`train-00000-of-00294.parquet`, `data/train/...`), or ""."""
    base = os.path.basename(path)
    found = _SPLIT_IN_NAME.search(base)
    if found:
        return found.group(1)
    parent = os.path.basename(os.path.dirname(path))
    return parent if parent in _SPLITS else ""


def extension(stored_name: str | None, head: bytes) -> str:
    """The extension of the stored path, else the one the bytes' magic number says, else bin."""
    if stored_name:
        ext = os.path.splitext(stored_name)[1][1:]
        if ext:
            return ext
    for magic, at, ext in _MAGIC:
        if head[at : at + len(magic)] == magic:
            return ext
    return "bin"


def name_width(rows: int) -> int:
    return len(str(max(rows - 1, 0)))


@dataclass(slots=True)
class Row:
    offset: int  # in the shard's logical stream (the file itself where the bytes lie as stored)
    size: int
    label: int
    number: int  # the row (HDF5: the index) in its table
    split: str = ""
    stored_name: str | None = None  # the sample's own path, where the file keeps one
    head: bytes = b""  # the first bytes of the image, for its type when no name says it


def result(rows: list[Row], total_rows: int, mtime: float, classes: list[str] | None,
           warnings: list[str], error: str | None = None) -> ScanResult:
    """Member records ``SPLIT/NAME.EXT`` with their labels: NAME is the stored path's, else the row
    number zero-padded to the table's width."""
    width = name_width(total_rows)
    members = []
    for row in rows:
        stem = os.path.splitext(os.path.basename(row.stored_name))[0] if row.stored_name else ""
        name = f"{row.split}/" if row.split else ""
        name += f"{stem or f'{row.number:0{width}d}'}.{extension(row.stored_name, row.head)}"
        members.append(MemberRecord(name.encode("utf-8", "surrogateescape"), Kind.FILE, row.offset, row.size,
                                    0o444, mtime, label=row.label))
    return ScanResult(members=members, warnings=warnings, error=error, classes=classes)
