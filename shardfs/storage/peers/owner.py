"""Who owns a shard: rendezvous (highest-random-weight) hashing, computed alike on every node.

Each peer's weight for a shard is a hash of the peer's name and the shard's identity; the
shard's peers in order of falling weight are its owner, then whom it falls to if the owner is
down, and so on. Losing a peer moves only the shards it owned, each to the next peer in its own
order. blake2b, not Python's ``hash()``: that one is salted per process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def identity(path: str, size: int, mtime_ns: int, tag: str | None = None) -> str:
    """What makes bytes one shard's bytes: its name and version (size, mtime, ETag)."""
    return f"{path}\0{size}\0{mtime_ns}\0{tag or ''}"


def digest(ident: str) -> str:
    """A short, URL-safe name of an identity (the path of a peer request)."""
    return hashlib.blake2b(ident.encode(), digest_size=16).hexdigest()


def _weight(ident: str, peer: str) -> bytes:
    return hashlib.blake2b(f"{peer}\0{ident}".encode(), digest_size=8).digest()


def order(ident: str, peers: Sequence[str]) -> list[str]:
    """The peers in the shard's order: the owner first."""
    return sorted(peers, key=lambda peer: (_weight(ident, peer), peer), reverse=True)


def owner(ident: str, peers: Sequence[str]) -> str:
    return max(peers, key=lambda peer: (_weight(ident, peer), peer))
