"""Shard bytes, wherever they are stored, and the caches in front of them.

One interface (``base.Shard``) reads a shard's bytes: a local file (``local``) or an object
in S3 or on an HTTP server (``remote``). Index builds scan through it and the mount serves
through it, by way of the RAM cache (``ram``) within a memory budget (``memory``).
"""

from __future__ import annotations

from shardfs.storage.base import Shard, is_url


def open_shard(path: str) -> Shard:
    """A shard as it is now, to read it through once (a scan, a check): a local file, or a
    remote object (one HEAD, unless a listing already said its size and tag)."""
    if is_url(path):
        from shardfs.storage.remote import RemoteShard, known_info

        return RemoteShard.of(known_info(path))
    from shardfs.storage.local import LocalShard

    return LocalShard.open(path)
