"""Shard formats, chosen by file suffix. A format module is imported only when used."""

from __future__ import annotations

import importlib

from shardfs.formats.base import ShardFormat, ShardFormatError  # noqa: F401 (re-exported)

_BY_SUFFIX = {".tar": "tar", ".lz4shard": "lz4shard", ".parquet": "parquet", ".arrow": "arrowipc", ".h5": "hdf5",
              ".hdf5": "hdf5", ".zip": "zip", ".sqfs": "squashfs", ".squashfs": "squashfs"}
# Dataset files (datafile.py): each row a sample, shown as SPLIT/CLASS/NAME.EXT.
DATA_FORMATS = ("parquet", "arrow", "hdf5")


def suffixes() -> tuple[str, ...]:
    return tuple(_BY_SUFFIX)


def format_for(path: str) -> ShardFormat | None:
    for suffix, module in _BY_SUFFIX.items():
        if path.endswith(suffix):
            return importlib.import_module(f"{__name__}.{module}").FORMAT
    return None
