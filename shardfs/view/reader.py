"""Member reads: from a member of the tree to bytes, through the shard's layout and the cache."""

from __future__ import annotations

from typing import Protocol

from shardfs.formats import sparse
from shardfs.storage.base import Shard
from shardfs.view.dataset import Dataset


class Fetcher(Protocol):
    def fetch(self, shard: Shard, offset: int, length: int) -> bytes | memoryview: ...


def read_member(view: Dataset, fetcher: Fetcher, m: int, offset: int, size: int) -> bytes | memoryview:
    col = view.tree.col
    length = min(size, col.size[m] - offset)
    if length <= 0:
        return b""
    shard = view.shards[col.shard[m]]
    fetch = lambda off, n: fetcher.fetch(shard, off, n)  # noqa: E731
    layout, start = view.layout(shard), col.offset[m]
    runs = view.tree.sparse.get(m)
    if runs is not None:  # holes and runs (the compiled loop sends every read of such a member here)
        return sparse.read(runs, offset, length, lambda off, n: layout.read(start + off, n, fetch))
    return layout.read(start + offset, length, fetch)
