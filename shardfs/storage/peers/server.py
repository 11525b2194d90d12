"""The peer server: answers other nodes' range requests for shards, from this node's caches.

``GET /shard/<digest>`` with ``Range: bytes=A-B`` and the request's HMAC (``auth``) gets 206 and
those bytes, read through ``read`` (the RAM cache's fetch: resident bytes at once; else the cache
admits the shard and loads it in file order, once, readers of a chunk waiting for whoever reads
it), with headers naming the shard's digest, the body's CRC-32 and the reply's HMAC. A request
without a valid proof gets 403 and no data; a shard we do not have in this version (another
dataset, a changed shard) 404; one we cannot read now 503.

``GET /held/<digest>`` (same range, same proof) is answered only from bytes this node holds in
RAM now, never read for it (else 404): a shard's new owner asks the one before it, after the
owners changed, instead of reading the shard from storage again.

``GET /index/<digest>`` (same proof, no range) gets 200 and the shard's index file, from
``index_file(digest)`` (given by the service: it loads the index, or builds it once while
every request for it waits), signed the same way; 404 when there is none to give. It is
answered from the start, before this node's own view of the dataset is ready: nodes mounting
unindexed shards together ask each shard's owner for its index instead of all reading it.

Bytes read for a peer are never fetched from another peer in turn (``serving_peer``): a node
answers from its caches or shared storage, so requests never travel in circles.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import os
import threading
import zlib
from concurrent.futures import Future

from shardfs.errors import UsageError
from shardfs.storage import deadline
from shardfs.storage.base import ShardIOError
from shardfs.storage.peers import auth
from shardfs.storage.peers.addresses import split
from shardfs.storage.threads import DaemonPool

log = logging.getLogger(__name__)

THREADS = 8  # requests read at once (each waits on the caches or storage)
# Tests only: every reply damaged this way ("corrupt", "truncate", "foreign"), to show no node serves it.
FAULT_ENV = "SHARDFS_TEST_PEER_FAULT"

_local = threading.local()


def serving_peer() -> bool:
    """Whether this thread reads for a peer (then the bytes come from here, never another peer)."""
    return getattr(_local, "serving", False)


def _mark_serving() -> None:
    _local.serving = True


class PeerServer:
    def __init__(self, address: str, key: bytes, find):
        """``find(digest)``: our shard of that identity, or None."""
        self.address, self.key, self.find = address, key, find
        self.read = self.loaded = None  # set by ready(): until then requests get 503
        self.index_file = None  # set by serve_indexes(): until then index requests get 503
        self.fault = os.environ.get(FAULT_ENV)
        self.counts = dict(requests_served=0, bytes_to_peers=0, requests_refused=0, requests_failed=0,
                           indexes_to_peers=0, held_missed=0)
        self._lock = threading.Lock()
        # Daemon threads: a request still reading storage at unmount is abandoned, never waited for.
        self._pool = DaemonPool(THREADS, "shardfs-peer-serve", initializer=_mark_serving)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner = None

    def start(self) -> None:
        """Listen on our peer address (only there); UsageError if the port is taken."""
        started: Future = Future()
        threading.Thread(target=self._run, args=(started,), name="shardfs-peer-server", daemon=True).start()
        started.result()

    def ready(self, read, loaded) -> None:
        """``read(shard, offset, length)``: the bytes (may read storage, wait); ``loaded(...)``:
        the bytes if they are at hand now, else None (answered on the event loop, no thread hop)."""
        self.read, self.loaded = read, loaded

    def serve_indexes(self, index_file) -> None:
        """``index_file(digest)``: a Future of the bytes of that shard's index file, or of None."""
        self.index_file = index_file

    def _run(self, started: Future) -> None:
        from aiohttp import web

        loop = self._loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_get("/shard/{digest}", self._shard)
        app.router.add_get("/held/{digest}", self._held)
        app.router.add_get("/index/{digest}", self._index)
        app.router.add_get("/alive", self._alive)  # no data, no key: a sign of life while a read takes long
        self._runner = web.AppRunner(app, access_log=None)
        host, port = split(self.address)
        try:
            loop.run_until_complete(self._runner.setup())
            # SO_REUSEADDR (aiohttp's default): a remount binds again at once, despite connections
            # of the last mount in TIME_WAIT; a port another process listens on is still refused.
            # At unmount, replies under way get a moment, not aiohttp's default minute.
            loop.run_until_complete(web.TCPSite(self._runner, host, port, shutdown_timeout=2.0).start())
        except OSError as exc:
            why = (f"port {port} is in use on {host} (another job or daemon?): choose another port in --peers"
                   if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc))
            started.set_exception(UsageError(f"peer address {self.address}: cannot listen: {why}"))
            return
        started.set_result(None)
        log.info("serving shards to peers at %s", self.address)
        self._warn_if_unreachable(host)
        loop.run_forever()

    def _warn_if_unreachable(self, host: str) -> None:
        """A node's name that resolves to loopback here (Debian's 127.0.1.1 line in /etc/hosts)
        puts the server where no other machine reaches it. (An address given as such is meant.)"""
        try:
            ipaddress.ip_address(host)
            return
        except ValueError:
            pass
        bound = [ipaddress.ip_address(address[0]) for address in self._runner.addresses]
        if bound and all(address.is_loopback for address in bound):
            log.warning("peer address %s: %s resolves to %s on this node, where no other node can reach it; "
                        "name this node by its cluster address in --peers and --peer-self", self.address, host,
                        ", ".join(map(str, bound)))

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counts[key] += n

    async def _alive(self, request):
        from aiohttp import web

        return web.Response(status=204)

    def _refused(self, request, byte_range: str):
        """None for a request signed with our key, else the 403 to send."""
        from aiohttp import web

        why = auth.check_request(self.key, request.headers.get(auth.HEADER), request.method, request.path, byte_range)
        if why is None:
            return None
        self._count("requests_refused")
        if self.counts["requests_refused"] <= 10:
            log.warning("refused a peer request from %s: %s", request.remote, why)
        return web.Response(status=403, text=why)

    async def _index(self, request):
        from aiohttp import web

        refused = self._refused(request, "")
        if refused is not None:
            return refused
        digest = request.match_info["digest"]
        if self.index_file is None:
            return web.Response(status=503, text="not serving indexes yet")  # (starting: asked again)
        try:  # the index may be under way: the requester waits as long, and builds it itself after
            data = await asyncio.wait_for(asyncio.wrap_future(self.index_file(digest)), deadline.TIMEOUT)
        except asyncio.TimeoutError:
            data = None
        if data is None:
            return web.Response(status=404, text="no index of that shard here")
        crc = zlib.crc32(data)
        self._count("indexes_to_peers")
        return web.Response(status=200, body=data, headers={
            "X-Shardfs-Shard": digest, "X-Shardfs-Crc32": str(crc),
            "X-Shardfs-Proof": auth.sign_reply(self.key, request.headers[auth.HEADER], crc, len(data))})

    async def _held(self, request):
        return await self._shard(request, held=True)

    async def _shard(self, request, held: bool = False):
        from aiohttp import web

        byte_range = request.headers.get("Range", "")
        proof = request.headers.get(auth.HEADER)
        refused = self._refused(request, byte_range)
        if refused is not None:
            return refused
        shard = self.find(request.match_info["digest"])
        if shard is None:
            return web.Response(status=404, text="no such shard here (another dataset or version)")
        if self.read is None:
            return web.Response(status=503, text="not serving yet")
        try:
            wanted = request.http_range
            offset, end = wanted.start, wanted.stop
        except ValueError:
            offset = end = None
        if offset is None or end is None or not 0 <= offset < end <= shard.size or wanted.step not in (None, 1):
            return web.Response(status=416, text=f"expected a range within {shard.size} bytes")
        try:
            data = self.loaded(shard, offset, end - offset)
            if data is not None:
                crc = zlib.crc32(data)
            elif held:
                self._count("held_missed")
                return web.Response(status=404, text="not held here now")
            else:
                data, crc = await asyncio.get_running_loop().run_in_executor(self._pool, self._read, shard, offset,
                                                                             end - offset)
        except ShardIOError as exc:
            self._count("requests_failed")
            return web.Response(status=503, text=str(exc))
        headers = {"Content-Range": f"bytes {offset}-{end - 1}/{shard.size}", "X-Shardfs-Shard": shard.digest,
                   "X-Shardfs-Crc32": str(crc), "X-Shardfs-Proof": auth.sign_reply(self.key, proof, crc, len(data))}
        if self.fault:
            data = self._damage(data, headers)
        self._count("requests_served")
        self._count("bytes_to_peers", len(data))
        return web.Response(status=206, body=data, headers=headers)

    def _read(self, shard, offset: int, length: int):
        """The bytes and their CRC-32 (on a pool thread: the event loop serves others meanwhile)."""
        data = self.read(shard, offset, length)
        return data, zlib.crc32(data)

    def _damage(self, data, headers: dict):
        data = bytearray(data)
        if self.fault == "corrupt":
            data[len(data) // 2] ^= 0xFF
        elif self.fault == "truncate":
            del data[len(data) // 2 :]
        elif self.fault == "foreign":
            headers["X-Shardfs-Proof"] = auth.sign_reply(b"another key", "", 0, 0)
        return data

    def stop(self) -> None:
        if self._loop is None or not self._loop.is_running():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        except Exception as exc:  # stopping must not keep the daemon from the rest of its exit
            log.warning("peer server: %s while stopping", exc or type(exc).__name__)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._pool.shutdown(cancel_futures=True)
