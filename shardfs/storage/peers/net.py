"""This node among its peers: the peer list, our entry, the key, the server and the client, who
owns which shard (``owner.Placement``, made anew when peers go down or come back), and the
figures `shardfs stats` shows.

A placement is a loop over every shard (0.2-0.4 s for 100,000), so no reader makes one, and
none is made under a lock a reader takes (the RAM cache asks who owns a shard under its own).
Whoever assigns the shards (the mount, a rescan) makes the first ones; a change of the peers
down starts one builder thread, which makes the placement of the peers down now, again while
they changed meanwhile, and installs it. Until then the placement in force stays in force, with
ONE owner per shard on every node, so that a job's nodes read each shard from storage once:

* a read of a shard whose owner in it is up asks that owner, as before the change (a shard the
  new placement moves between survivors is then loaded by its new owner from the former one's
  RAM: ``holders``, ``_pull_moved``);
* a read of a shard whose owner in it is down waits for the new placement (``placement_for``,
  up to the read's own deadline): asking the next peer along the ring instead could read the
  shard from storage where its new owner (the bounded loads may pick another) reads it too.
"""

from __future__ import annotations

import logging
import threading
import time

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
        nothing = owner.Placement([], [], self.peers, ring=self.ring)
        self._everyone = self._current = nothing  # with every peer up / without those down at _generation
        self._generation = 0  # the client's generation (of the peers down) that _current follows
        self._building = False  # a builder thread makes the placement of a newer generation
        self._installed = threading.Condition(self._lock)  # notified when a placement is installed
        self._assigning = threading.Lock()  # one assignment at a time (each made whole, off _lock)
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
        """Place these shards among the peers (before the view exists: their indexes' owners).
        The placements are made here, on the assigning thread, before any read of the set."""
        with self._assigning:
            generation, down = self.client.down()
            everyone = owner.Placement(digests, sizes, self.peers, ring=self.ring)
            current = owner.Placement(digests, sizes, self.peers, down=down, ring=self.ring) if down else everyone
            with self._lock:
                self._placed = (list(digests), list(sizes))
                # (a rescan: an old shard the new set moved is still in its former owner's RAM)
                self._previous = self._current if self._current.digests else self._previous
                self._everyone, self._current, self._generation = everyone, current, generation
                self._installed.notify_all()

    def _wrap(self, shard: Shard) -> PeerShard:
        if isinstance(shard, PeerShard):
            return shard
        wrapped = PeerShard(shard, self)
        self._shards[wrapped.digest] = wrapped
        return wrapped

    def placement(self, with_down: bool = True) -> owner.Placement:
        """Who owns what now: without the peers down (``with_down``), or as if all were up (the
        owner to try again once its backoff is over). Never made here, never waited for: after
        a change of the peers down, the one in force until the builder installs the new one."""
        generation = self.client.down()[0]
        with self._lock:
            if generation != self._generation:
                self._build_locked()
            return self._current if with_down else self._everyone

    def placement_for(self, digest: str, until: float) -> owner.Placement:
        """The placement a read of this shard goes by: the one in force, unless the shard's owner
        in it is down and a placement without that peer is under way: that one then, waited
        for until ``until`` (time.monotonic(); past it, the one in force: the read goes on
        along the shard's candidates, as it would without peers changing)."""
        with self._lock:
            while True:
                placed, generation = self._current, self.client.down()[0]
                if generation == self._generation:
                    return placed
                self._build_locked()
                peer = placed.owner_of(digest)
                if peer in (None, self.me) or not self.client.is_down(peer):
                    return placed  # (its owner is up: asked as before; moved or not, one owner)
                left = until - time.monotonic()
                if left <= 0:
                    log.warning("the owners without the peers down took longer than a read may wait: "
                                "a shard of %s asked along its candidates", peer)
                    return placed
                self._installed.wait(left)

    def _build_locked(self) -> None:
        """Start the builder unless it runs (it makes the latest generation's before it stops). Lock held."""
        if not self._building:
            self._building = True
            threading.Thread(target=self._build, name="shardfs-peer-placement", daemon=True).start()

    def _build(self) -> None:
        """Make the placement of the peers down now and install it, until the one installed is of
        the latest change (they may change again meanwhile); then load the shards that moved to
        us (``_pull_moved``)."""
        before = None
        try:
            while True:
                with self._lock:  # (the client's generation read under our lock: a change after it starts a builder)
                    generation, down = self.client.down()
                    if generation == self._generation:
                        self._building = False
                        self._installed.notify_all()
                        break
                    everyone, placed = self._everyone, self._placed
                made = owner.Placement(*placed, self.peers, down=down, ring=self.ring) if down else everyone
                with self._lock:
                    if self._everyone is not everyone:
                        continue  # assigned anew meanwhile (that made its own): the latest generation's turn
                    if before is None:
                        before = self._current
                    self._previous, self._current, self._generation = self._current, made, generation
                    self._installed.notify_all()
        except BaseException:
            with self._lock:
                self._building = False
                self._installed.notify_all()  # (a reader waiting looks again, and starts another)
            raise
        if before is not None and before.digests:
            self._pull_moved(before)

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

    def owner_of(self, digest: str, until: float | None = None) -> str | None:
        """The shard's owner in the placement in force (never waits: the RAM cache asks under its
        lock); ``until``: as a read of it would go by (``placement_for``)."""
        return (self.placement() if until is None else self.placement_for(digest, until)).owner_of(digest)

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
