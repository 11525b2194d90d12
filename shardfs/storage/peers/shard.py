"""A shard whose bytes come from its owner among the peers, and from shared storage only
where this node is the first peer in the shard's order that answers.

The caches above call it as any ``Shard``: the RAM cache's loads ask for whole runs in file
order (so a shard this node keeps is fetched whole, in order), its direct reads for one member's
bytes (then only those cross the network). Which peers are up, the key, the counters: ``PeerNet``.
"""

from __future__ import annotations

import time

from shardfs.storage import deadline
from shardfs.storage.base import Shard, ShardIOError
from shardfs.storage.peers import owner
from shardfs.storage.peers.client import PeerFailure
from shardfs.storage.peers.server import serving_peer

LACKS_S = 60.0  # a peer that said it lacks a shard (404) is not asked for it again for this long
# Peers together get at most this long per read before storage is asked: a read never waits
# much past what storage alone could take (deadline.TIMEOUT).
PEER_BUDGET_S = min(6.0, deadline.TIMEOUT / 4)


class PeerShard(Shard):
    def __init__(self, inner: Shard, net):
        self.inner, self.net = inner, net
        super().__init__(inner.path, inner.size, inner.mtime_ns)
        self.remote, self.window = inner.remote, inner.window
        self.index_path = inner.index_path
        self.tag = getattr(inner, "tag", None)
        ident = owner.identity(inner.path, inner.size, inner.mtime_ns, self.tag)
        self.digest = owner.digest(ident)
        self.order = owner.order(ident, net.peers)
        self._lacking: dict[str, float] = {}  # peer -> until when it is taken not to hold this shard

    @property
    def owned(self) -> bool:
        """Whether this node is the first peer in the shard's order not known to be down: its
        owner, or whom the shard fell to (then it keeps the shard first, as the owner did)."""
        for peer in self.order:
            if peer == self.net.me or not self.net.client.is_down(peer):
                return peer == self.net.me
        return True

    # One state for both: the inner shard marks itself broken (a changed file), and so may we.
    # (A shard is never mended: Shard.__init__'s None leaves a broken inner one broken.)
    @property
    def broken(self) -> str | None:
        return self.inner.broken

    @broken.setter
    def broken(self, why: str | None) -> None:
        if why is not None:
            self.inner.broken = why

    def changed(self) -> bool:
        return self.inner.changed()

    def forget(self, offset: int, length: int) -> None:
        self.inner.forget(offset, length)

    def close(self) -> None:
        self.inner.close()

    def _pread(self, offset: int, length: int) -> bytes:
        data = self._from_peers(offset, length)
        if data is not None:
            return data
        return self.net.from_storage(length, self.inner.pread, offset, length)

    def read_into(self, buf: memoryview, offset: int, length: int) -> None:
        if self.broken:
            raise ShardIOError(self.broken, unavailable=True, permanent=True)
        data = self._from_peers(offset, length)
        if data is not None:
            buf[offset : offset + length] = data
        else:
            self.net.from_storage(length, self.inner.read_into, buf, offset, length)

    def _from_peers(self, offset: int, length: int) -> bytes | None:
        """The bytes from the first peer before us in the shard's order that gives them, or None:
        we are next in line (or everyone before us failed), so storage it is."""
        if serving_peer():
            return None
        client = self.net.client
        ends = time.monotonic() + PEER_BUDGET_S
        for peer in self.order:
            if peer == self.net.me:
                return None
            left = ends - time.monotonic()
            if left <= 0.5:
                return None
            if not client.usable(peer) or self._lacking.get(peer, 0.0) > time.monotonic():
                continue
            try:
                return client.fetch(peer, self.digest, offset, length, left)
            except PeerFailure as exc:
                if not exc.down:
                    self._lacking[peer] = time.monotonic() + LACKS_S
        return None
