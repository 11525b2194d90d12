"""Sparse members: a file stored as its data runs only, served as `tar -x` writes it.

A sparse map is a list of runs ``(offset in the file, length)``; the runs' bytes are stored one
after the other from the member's data offset, and everything between them is a hole that reads
as zeros, up to the file's real size. Tar writes the map in four encodings (GNU's old ``S``
headers, PAX 0.0, 0.1 and 1.0); ``formats/tar.py`` reads them into :func:`runs` arrays.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from shardfs.formats.base import ShardFormatError

MAX_RUNS = 1 << 18  # a map longer than this is hostile (a real one lists each hole once)
MAX_SIZE = 1 << 48  # 256 TiB: any offset or size beyond is hostile (and would overflow the int64 tables)


def runs(pairs: list[int], real_size: int, stored: int) -> np.ndarray:
    """The map as an (n, 2) int64 array, checked: runs in order, not overlapping, inside the real
    size, and their lengths adding up to at most the ``stored`` bytes. ShardFormatError if not."""
    if len(pairs) % 2 or len(pairs) > 2 * MAX_RUNS:
        raise ShardFormatError(f"a sparse map of {len(pairs)} numbers")
    if not 0 <= real_size < MAX_SIZE or not all(0 <= n < MAX_SIZE for n in pairs):
        raise ShardFormatError("a sparse map with numbers out of range")
    table = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    table = table[table[:, 1] > 0]  # tar ends a map with an empty run at the real size
    ends = table[:, 0] + table[:, 1]
    if (len(table) and int(ends[-1]) > real_size) or (ends[:-1] > table[1:, 0]).any() or sum(pairs[1::2]) > stored:
        raise ShardFormatError("a sparse map out of order or beyond the file")
    return table


def numbers(text: bytes, what: str) -> list[int]:
    """Decimal numbers, separated by commas or newlines (PAX maps), each below 2^63."""
    parts = text.replace(b"\n", b",").split(b",")
    if not all(p.isdigit() and len(p) <= 18 for p in parts):
        raise ShardFormatError(f"bad sparse map in {what}")
    return [int(p) for p in parts]


def read(table: np.ndarray, offset: int, length: int, read_stored: Callable[[int, int], bytes]) -> bytes:
    """Bytes [offset, offset+length) of the file (clamped by the caller to its real size), holes as
    zeros; ``read_stored(pos, n)`` reads the runs' bytes as stored. The runs a range overlaps lie
    back to back in the stored bytes: one read brings them all."""
    out = bytearray(length)
    starts, lengths = table[:, 0], table[:, 1]
    ends = starts + lengths
    first, last = np.searchsorted(ends, offset, "right"), np.searchsorted(starts, offset + length, "left")
    if first >= last:
        return bytes(out)  # all hole
    stored_at = np.concatenate(([0], np.cumsum(lengths)))
    lo = max(offset, int(starts[first]))
    hi = min(offset + length, int(ends[last - 1]))
    base = int(stored_at[first]) + lo - int(starts[first])
    want = int(stored_at[last - 1]) + hi - int(starts[last - 1]) - base
    data = read_stored(base, want)
    if len(data) != want:
        raise ShardFormatError(f"short read of a sparse member ({len(data)} of {want} bytes)")
    for i in range(first, last):
        a, b = max(offset, int(starts[i])), min(offset + length, int(ends[i]))
        src = int(stored_at[i]) + a - int(starts[i]) - base
        out[a - offset : b - offset] = data[src : src + b - a]
    return bytes(out)
