"""Class labels of WebDataset samples, read once when a shard is indexed.

A ``<key>.cls`` member holds a sample's integer label as ASCII. The imagefolder layout
needs every label at every mount; reading them there would cost one random read per
sample (1.28M for ImageNet, on a slow shared filesystem), so they are read when the
index is built and persisted in it (``cls_member``, ``cls_value``).
"""

from __future__ import annotations

import re
from typing import Callable

import numpy as np

from shardfs.formats.base import SMALL_DATA

MAX_LABEL_BYTES = SMALL_DATA  # a larger .cls member is not a label: left unread, the sample reported
UNPARSABLE = np.iinfo(np.int64).min  # cls_value of a member whose bytes are not an integer
_INT = re.compile(rb"\s*[+-]?\d{1,18}\s*")

Read = Callable[[int, int], bytes]  # (logical offset, length) -> bytes of the shard's data stream


def is_label_member(name: bytes, size: int) -> bool:
    return name[-4:].lower() == b".cls" and size <= MAX_LABEL_BYTES  # webdataset lower-cases extensions


def parse(raw: bytes) -> int:
    return int(raw) if _INT.fullmatch(raw) else int(UNPARSABLE)


def read_labels(members: list[int], offsets: np.ndarray, sizes: np.ndarray, read: Read) -> tuple[np.ndarray, np.ndarray]:
    """(cls_member, cls_value) for the given member indices, read in data order (for lz4,
    consecutive labels then share one decompressed block)."""
    chosen = np.array(members, dtype=np.int32)
    chosen = chosen[np.argsort(offsets[chosen], kind="stable")]
    values = np.array([parse(read(int(offsets[m]), int(sizes[m]))) for m in chosen], dtype=np.int64)
    order = np.argsort(chosen, kind="stable")
    return chosen[order], values[order]


def from_bytes(members: list[int], raws: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(cls_member, cls_value) from labels the scan already read, ``members`` in ascending order."""
    return np.array(members, dtype=np.int32), np.array([parse(raw) for raw in raws], dtype=np.int64)


def no_labels() -> tuple[np.ndarray, np.ndarray]:
    return np.empty(0, np.int32), np.empty(0, np.int64)
