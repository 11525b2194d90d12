"""Who owns a shard: every node computes the same assignment from the same inputs (the shards'
identities and sizes, the peer list), with no coordinator and no message.

Consistent hashing with bounded loads. Each peer has VNODES points on a ring (hashes of its
name); a shard's candidates are the peers met walking the ring clockwise from the shard's own
point. Each shard goes to its first candidate that has room (see ``Placement._assign`` for
the order): a load, with the shard, under the mean plus the largest shard (always possible:
some peer is below the mean until all is placed) or at most (1 + EPS) times the mean. So no
owner holds more than the larger of those two (and where shards are about equal, no more than
its share of them rounded up), whatever the hashes gave; hashing alone gave
one node 3-4 of 8 shards on 4 nodes, and 4.7x the mean with 1,281 shards on 1,000 nodes.

A peer that leaves takes its points off the ring: its shards go each to their next candidate,
and other shards move only where that filled a peer a later shard would have gone to (the
bound). A peer that comes back gets its shards back: the result depends on the inputs alone.
blake2b and shake, not Python's ``hash()``: that one is salted per process.

The assignment needs every shard's size at once: it is computed once per view and again when
peers go down or come back (``Placement``; 0.2-0.4 s for 100,000 shards), never per read, and
off the readers' threads (net.py). A read whose owner fails goes on
along the shard's candidates (``candidates``): the one the shard falls to is usually next.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence

import numpy as np

VNODES = 64  # points per peer: a leaving peer's shards spread over many others, not one neighbour
EPS_NUM, EPS_DEN = 1, 4  # a load of up to 1.25x the mean is within the bound (exact, integer arithmetic)


def identity(path: str, size: int, mtime_ns: int, tag: str | None = None) -> str:
    """What makes bytes one shard's bytes: its name and version (size, mtime, ETag)."""
    return f"{path}\0{size}\0{mtime_ns}\0{tag or ''}"


def digest(ident: str) -> str:
    """A short, URL-safe name of an identity (the path of a peer request)."""
    return hashlib.blake2b(ident.encode(), digest_size=16).hexdigest()


def point(shard_digest: str) -> int:
    """The shard's place on the ring: the first 8 bytes of its digest."""
    return int(shard_digest[:16], 16)


class Ring:
    """The peers' points, sorted; the same on every node whatever order the peers are listed in."""

    def __init__(self, peers: Sequence[str]):
        self.peers = sorted(peers)
        raw = b"".join(hashlib.shake_128(f"shardfs-peer\0{peer}".encode()).digest(8 * VNODES) for peer in self.peers)
        points = np.frombuffer(raw, dtype=">u8").astype(np.uint64)
        who = np.repeat(np.arange(len(self.peers), dtype=np.int64), VNODES)
        order = np.lexsort((who, points))  # equal points (never seen): the lower peer first
        self.points, self.who = points[order], who[order].tolist()

    def starts(self, shard_points: np.ndarray) -> np.ndarray:
        """Each shard's first ring position (the first peer point at or after its own)."""
        return np.searchsorted(self.points, shard_points.astype(np.uint64)) % len(self.who)


class Placement:
    """The owners of a set of shards among the peers not ``down``."""

    def __init__(self, digests: Sequence[str], sizes: Sequence[int], peers: Sequence[str],
                 down: frozenset[str] = frozenset(), ring: Ring | None = None):
        self.ring = ring if ring is not None and ring.peers == sorted(peers) else Ring(peers)
        self.down = frozenset(down) & set(self.ring.peers)
        self.digests = list(digests)
        self.slot = {d: i for i, d in enumerate(self.digests)}
        self.sizes = [int(s) for s in sizes]
        self._up = [peer not in self.down for peer in self.ring.peers]
        points = np.array([point(d) for d in self.digests], dtype=np.uint64)
        self.start = self.ring.starts(points).tolist() if self.digests else []
        self.owner = self._assign(points) if self.digests and any(self._up) else [-1] * len(self.digests)

    def _assign(self, points: np.ndarray) -> list[int]:
        """Each shard's owner (an index into ring.peers).

        A peer has room for a shard if, with it, it stays within (1 + EPS) times the mean over
        all peers listed (the same whoever is down: a peer leaving does not move the bar for all
        the others); or it holds fewer shards than its share (S / peers up, rounded up) and stays
        under the mean (of the peers up) plus the largest shard. First every shard goes to its first candidate up if that has room,
        shards nearest their candidate's point first; then the shards left over, in the same
        order, walk on to the next candidate with room (past a full round: the first under the
        mean plus the largest shard, which some peer always is). A peer that leaves makes its
        shards far from their (new) first candidate: they come late and displace few others
        (measured: tools/sim_peers.py)."""
        up = np.array(self._up)
        alive_points = self.ring.points[up[np.array(self.ring.who)]]
        nearest = alive_points[np.searchsorted(alive_points, points) % len(alive_points)]
        order = np.lexsort((points, nearest - points)).tolist()  # uint64: the distance wraps round the ring
        alive = int(up.sum())
        total, largest = sum(self.sizes), max(self.sizes)
        share = -(-len(self.sizes) // alive)
        # (load + size) / mean <= 1 + EPS, or < 1 + largest / mean: scaled by the peers (and EPS_DEN) to stay integers
        within, under, listed = total * (EPS_DEN + EPS_NUM), total + alive * largest, len(self.ring.peers)
        load, count = [0] * len(self.ring.peers), [0] * len(self.ring.peers)
        owner = [-1] * len(self.digests)
        who, start, sizes, positions, is_up = self.ring.who, self.start, self.sizes, len(self.ring.who), self._up

        def place(shard: int, first_only: bool, last: bool = False) -> bool:
            """With its first candidate up with room (``first_only``: the first candidate up, if it has)."""
            size, pos = sizes[shard], start[shard]
            for _ in range(positions):
                peer = who[pos]
                if is_up[peer]:
                    new = load[peer] + size
                    if new * alive < under and (last or count[peer] < share) or new * listed * EPS_DEN <= within:
                        load[peer] += size
                        count[peer] += 1
                        owner[shard] = peer
                        return True
                    if first_only:
                        return False
                pos = pos + 1 if pos + 1 < positions else 0
            return False

        left = [shard for shard in order if not place(shard, first_only=True)]
        for shard in left:
            place(shard, False) or place(shard, False, last=True)  # the last always finds room within a round
        return owner

    def owner_of(self, shard_digest: str) -> str | None:
        """The shard's owner; None: not one of the placed shards, or no peer is up."""
        i = self.slot.get(shard_digest)
        if i is None or self.owner[i] < 0:
            return None
        return self.ring.peers[self.owner[i]]

    def candidates(self, shard_digest: str) -> Iterator[str]:
        """The peers to ask for the shard in turn: its owner, then the others up along its walk
        of the ring (whom it would fall to), each once. A shard not placed: its walk alone."""
        i = self.slot.get(shard_digest)
        first = self.owner[i] if i is not None else -1
        if first >= 0:
            yield self.ring.peers[first]
        pos = self.start[i] if i is not None else int(self.ring.starts(np.array([point(shard_digest)]))[0])
        seen, who, up = {first}, self.ring.who, self._up
        left = sum(up) - (first >= 0)
        for step in range(len(who)):
            if not left:
                return
            peer = who[(pos + step) % len(who)]
            if peer not in seen and up[peer]:
                seen.add(peer)
                left -= 1
                yield self.ring.peers[peer]

    def loads(self) -> np.ndarray:
        """Bytes each peer (in ring.peers' order) owns."""
        owner = np.array(self.owner, dtype=np.int64)
        placed = owner >= 0
        return np.bincount(owner[placed], weights=np.array(self.sizes, dtype=np.float64)[placed],
                           minlength=len(self.ring.peers)).astype(np.int64)
