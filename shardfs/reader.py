"""Member reads: from the tree's (shard, offset, size) to bytes, through a fetcher of raw shard bytes."""

from __future__ import annotations

from typing import Protocol

from .shards import Shard
from .tree import Tree


class Fetcher(Protocol):
    def fetch(self, shard: Shard, offset: int, length: int) -> bytes: ...


class MemberReader:
    def __init__(self, tree: Tree, shards: list[Shard], fetcher: Fetcher):
        self.tree, self.shards, self.fetcher = tree, shards, fetcher

    def read(self, m: int, offset: int, size: int) -> bytes:
        tree = self.tree
        length = min(size, int(tree.size[m]) - offset)
        if length <= 0:
            return b""
        shard = self.shards[int(tree.shard[m])]
        fetch = lambda off, n: self.fetcher.fetch(shard, off, n)  # noqa: E731
        layout = shard.layout()
        return layout.read(int(tree.offset[m]) + offset, length, fetch)
