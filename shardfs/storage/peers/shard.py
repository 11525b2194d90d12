"""A shard whose bytes come from its owner among the peers, and from shared storage only
where this node is the first of the shard's candidates that answers (owner.py).

The caches above call it as any ``Shard``: the RAM cache's loads ask for whole runs in file
order (so a shard this node keeps is fetched whole, in order), its direct reads for one member's
bytes (then only those cross the network). Which peers are up, the key, the counters: ``PeerNet``.
"""

from __future__ import annotations

import time

from shardfs.storage import deadline, origin
from shardfs.storage.base import SHARED_BROKEN, Shard, ShardIOError
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
        self.in_order_only = getattr(inner, "in_order_only", False)  # a compressed tar's stream (ram.py)
        self.digest = owner.digest(owner.identity(inner.path, inner.size, inner.mtime_ns, self.tag))
        self._lacking: dict[str, float] = {}  # peer -> until when it is taken not to hold this shard
        self._not_held: dict[str, float] = {}  # the same for a former owner's RAM (GET /held)
        inner.when_broken(self._tell_broken)  # the inner shard marks itself broken: we are told as one

    @property
    def owned(self) -> bool:
        """Whether this node owns the shard among the peers up now: its owner, or whom the shard
        fell to (then it keeps the shard first, as the owner did). Not placed: ours to read."""
        return self.net.owner_of(self.digest) in (self.net.me, None)

    broken = SHARED_BROKEN  # the inner shard marks itself broken (a changed file), and so may we

    def _wrapped(self) -> Shard:
        return self.inner

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
        """The bytes from the first peer before us among the shard's candidates that gives them,
        else from a peer that owned the shard before the owners changed and holds them still,
        or None: we are next in line (or everyone before us failed), so storage it is.
        Reading for a peer, only the second (it reads nothing for us: no requests in circles)."""
        ends = time.monotonic() + PEER_BUDGET_S
        tried: set[str] = set()
        if not serving_peer():
            while (peer := self._next_peer(tried, ends)) is not None and ends - time.monotonic() > 0.5:
                tried.add(peer)
                data = self._fetch(peer, offset, length, ends, self._lacking)
                if data is not None:
                    return data
        now = time.monotonic()
        for peer in self.net.holders(self.digest):
            if peer not in tried and self.net.client.usable(peer) and self._not_held.get(peer, 0.0) <= now:
                if ends - time.monotonic() <= 0.5:
                    return None
                data = self._fetch(peer, offset, length, ends, self._not_held, held=True)
                if data is not None:
                    return data
        return None

    def _fetch(self, peer: str, offset: int, length: int, ends: float, lacking: dict, held: bool = False):
        try:
            data = self.net.client.fetch(peer, self.digest, offset, length, ends - time.monotonic(), held)
        except PeerFailure as exc:
            if not exc.down and not exc.busy:
                lacking[peer] = time.monotonic() + LACKS_S
            return None  # (down: the owners are placed again without it)
        origin.add_from_peers(len(data))
        return data

    def _next_peer(self, tried: set[str], ends: float) -> str | None:
        """Whom to ask next: the owner were all up, if it is down but due for another try (so a
        peer that comes back is found); then the candidates among the peers up, until us, in
        the placement this read goes by (its owner down: the new one, waited for up to ``ends``)."""
        client, me, now = self.net.client, self.net.me, time.monotonic()
        first = self.net.placement(with_down=False).owner_of(self.digest)
        if first not in (None, me) and first not in tried and client.is_down(first) and client.usable(first):
            return first
        for peer in self.net.placement_for(self.digest, ends - 0.5).candidates(self.digest):
            if peer == me:
                return None
            if peer not in tried and client.usable(peer) and self._lacking.get(peer, 0.0) <= now:
                return peer
        return None
