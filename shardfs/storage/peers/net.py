"""This node among its peers: the peer list, our entry, the key, the server and the client, who
owns which shard (``owner.Placement``, recomputed when peers go down or come back), and the
figures `shardfs stats` shows."""

from __future__ import annotations

import logging
import threading

from shardfs.storage.base import Shard
from shardfs.storage.peers import auth, owner
from shardfs.storage.peers.client import PeerClient
from shardfs.storage.peers.server import PeerServer
from shardfs.storage.peers.shard import PeerShard

log = logging.getLogger(__name__)


class PeerNet:
    def __init__(self, peers: list[str], me: str, key: bytes | None = None):
        """Listens at ``me`` at once (UsageError if it cannot); requests get 503 until ``ready``."""
        self.peers, self.me = list(peers), me
        key = key if key is not None else auth.load_or_create()
        self._shards: dict[str, PeerShard] = {}
        self._lock = threading.Lock()
        self.storage_bytes_read = 0
        self.ring = owner.Ring(self.peers)  # the peers' points: made once, placements reuse them
        self._placed: tuple[list[str], list[int]] = ([], [])  # the shards placed: digests, sizes
        self._placements: dict[bool, owner.Placement] = {}  # all up (False) / without those down now (True)
        self._generation = -1
        self._previous: owner.Placement | None = None  # the one in force before the last change of peers
        self._load = None  # the RAM cache's load(shards), once it exists
        self.server = PeerServer(me, key, self._shards.get)
        self.server.start()
        self.client = PeerClient(self.peers, me, key)
        log.info("%d peers; this node is %s", len(self.peers), me)

    def place(self, shards: list[Shard]) -> list[PeerShard]:
        """The shards as their peers serve them (a shard wrapped already stays as it is), and
        their owners: computed here for the whole set at once, as on every node."""
        wrapped = [self._wrap(shard) for shard in shards]
        self.assign([s.digest for s in wrapped], [s.size for s in wrapped])
        return wrapped

    def assign(self, digests: list[str], sizes: list[int]) -> None:
        """Place these shards among the peers (before the view exists: their indexes' owners)."""
        with self._lock:
            self._placed = (list(digests), list(sizes))
            # (a rescan: an old shard the new set moved is still in its former owner's RAM)
            self._previous = self._placements.get(True) or self._placements.get(False) or self._previous
            self._placements.clear()
            self._generation = -1

    def _wrap(self, shard: Shard) -> PeerShard:
        if isinstance(shard, PeerShard):
            return shard
        wrapped = PeerShard(shard, self)
        self._shards[wrapped.digest] = wrapped
        return wrapped

    def placement(self, with_down: bool = True) -> owner.Placement:
        """Who owns what now: without the peers down (``with_down``), or as if all were up (the
        owner to try again once its backoff is over). Recomputed only when a peer went down or
        came back, never per read."""
        generation, down = self.client.down()
        changed = None
        with self._lock:
            if generation != self._generation:
                self._previous = self._placements.get(True) or self._placements.get(False) or self._previous
                self._placements.clear()
                changed = self._generation >= 0 and self._previous
                self._generation = generation
            key = with_down and bool(down)
            found = self._placements.get(key)
            if found is None:
                found = self._placements[key] = owner.Placement(*self._placed, self.peers,
                                                               down=down if key else frozenset(), ring=self.ring)
        if changed:  # (on a thread of its own: we may be inside the cache's lock here)
            threading.Thread(target=self._pull_moved, args=(changed,), name="shardfs-peer-moved", daemon=True).start()
        return found

    def holders(self, digest: str) -> list[str]:
        """Other peers that owned the shard before the owners last changed (the placement in
        force before, and the one with every peer up): they may still hold it in their caches,
        which beats reading it from storage again when it moved to us."""
        everyone = self.placement(with_down=False)
        with self._lock:
            before = self._previous
        out = []
        for placed in (before, everyone):
            peer = placed.owner_of(digest) if placed is not None else None
            if peer not in (None, self.me) and peer not in out:
                out.append(peer)
        return out

    def shard(self, digest: str) -> PeerShard | None:
        return self._shards.get(digest)

    def owner_of(self, digest: str) -> str | None:
        return self.placement().owner_of(digest)

    def ready(self, read, loaded, load=None) -> None:
        """Serve peers from the RAM cache: ``read`` its fetch, ``loaded`` what it holds now;
        ``load(shards)``: have it load shards whole (those that move to us from a live peer)."""
        self._load = load
        self.server.ready(read, loaded)

    def _pull_moved(self, before: owner.Placement) -> None:
        """The owners changed: shards now ours whose former owner is up are loaded at once, while
        that peer still holds them (GET /held; it evicts them for its own new shards soon)."""
        now, client = self.placement(), self.client
        moved = []
        for digest in self._placed[0]:
            was = before.owner_of(digest)
            shard = self._shards.get(digest)
            if shard is not None and now.owner_of(digest) == self.me and was not in (None, self.me) \
                    and not client.is_down(was):
                moved.append(shard)
        if moved and self._load is not None:
            log.info("%d shards moved to this node from peers that are up: loading them from those peers", len(moved))
            self._load(moved)

    @staticmethod
    def owns(shard: Shard) -> bool:
        """Whether this node owns the shard (the caches give those precedence)."""
        return getattr(shard, "owned", True)

    def from_storage(self, length: int, read, *args):
        got = read(*args)
        with self._lock:
            self.storage_bytes_read += length
        return got

    def figures(self) -> dict:
        placed = self.placement()
        mine = placed.ring.peers.index(self.me)
        with self._lock:
            storage = self.storage_bytes_read
        return {"self": self.me, "peers": len(self.peers), **self.client.figures(),
                **self.server.counts,
                "storage_bytes_read": storage,
                "shards_owned": placed.owner.count(mine)}

    def close(self) -> None:
        self.server.stop()
        self.client.close()
