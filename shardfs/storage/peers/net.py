"""This node among its peers: the peer list, our entry, the key, the server and the client,
and the figures `shardfs stats` shows."""

from __future__ import annotations

import logging
import threading

from shardfs.storage.base import Shard
from shardfs.storage.peers import auth
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
        self.server = PeerServer(me, key, self._shards.get)
        self.server.start()
        self.client = PeerClient(self.peers, me, key)
        log.info("%d peers; this node is %s", len(self.peers), me)

    def wrap(self, shard: Shard) -> PeerShard:
        """The shard as its peers serve it (a shard wrapped already stays as it is)."""
        if isinstance(shard, PeerShard):
            return shard
        wrapped = PeerShard(shard, self)
        self._shards[wrapped.digest] = wrapped
        return wrapped

    def ready(self, read, loaded) -> None:
        """Serve peers from the RAM cache: ``read`` its fetch, ``loaded`` what it holds now."""
        self.server.ready(read, loaded)

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
        with self._lock:
            storage = self.storage_bytes_read
        return {"self": self.me, "peers": len(self.peers), **self.client.figures(),
                **self.server.counts,
                "storage_bytes_read": storage,
                "shards_owned": sum(1 for s in self._shards.values() if s.owned)}

    def close(self) -> None:
        self.server.stop()
        self.client.close()
