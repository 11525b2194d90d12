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

HTTP/1.1 on asyncio's streams, kept connections, one request at a time on each: no framework
between a request and its reply (a node with peers is CPU-bound on this per-member cost). Only
what peers send is taken (GET, no body, a head under HEAD_LIMIT); anything else gets 400 and
the connection is closed.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import os
import re
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
HEAD_LIMIT = 16 << 10  # a request head longer than this is no peer's: the connection is closed
KEEP_S = 75.0  # a connection that sends no request for this long is closed (clients close theirs after 30 s)
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
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

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
        loop = self._loop = asyncio.new_event_loop()
        host, port = split(self.address)
        try:
            # SO_REUSEADDR (asyncio's default here): a remount binds again at once, despite
            # connections of the last mount in TIME_WAIT; a port another process listens on is still refused.
            self._server = loop.run_until_complete(asyncio.start_server(self._connection, host, port,
                                                                        limit=HEAD_LIMIT))
        except OSError as exc:
            why = (f"port {port} is in use on {host} (another job or daemon?): choose another port in --peers"
                   if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc))
            started.set_exception(UsageError(f"peer address {self.address}: cannot listen: {why}"))
            return
        started.set_result(None)
        log.info("serving shards to peers at %s", self.address)
        self._warn_if_unreachable(host)
        loop.run_forever()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One peer's connection: its requests in turn (keep-alive), until it closes or we stop."""
        self._writers.add(writer)
        loop = asyncio.get_running_loop()
        try:
            while True:
                idle = loop.call_later(KEEP_S, writer.close)  # silent this long (or a head this slow): closed
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                finally:
                    idle.cancel()
                request = _Request.parse(head, writer)
                if request is None:
                    status, headers, body = 400, {}, b"a malformed request"
                else:
                    try:
                        status, headers, body = await self._answer(request)
                    except Exception:  # a request must never take the server down; the peer tries the next
                        log.exception("peer server: a request from %s failed", request.remote)
                        status, headers, body = 500, {}, b"internal error"
                writer.write(_head(status, headers, len(body)))
                if body:
                    writer.write(body)  # (sent at once where the socket takes it, else copied into the buffer)
                if request is None or request.close:
                    return
                await writer.drain()
        except ConnectionError:
            return
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _answer(self, request: _Request) -> tuple[int, dict, bytes | memoryview]:
        kind, _, digest = request.path.lstrip("/").partition("/")
        if request.method != "GET":
            return 405, {}, b"GET only"
        if request.path == "/alive":  # no data, no key: a sign of life while a read takes long
            return 204, {}, b""
        if kind == "shard" or kind == "held":
            return await self._shard(request, digest, held=kind == "held")
        if kind == "index":
            return await self._index(request, digest)
        return 404, {}, b"no such resource"

    def _warn_if_unreachable(self, host: str) -> None:
        """A node's name that resolves to loopback here (Debian's 127.0.1.1 line in /etc/hosts)
        puts the server where no other machine reaches it. (An address given as such is meant.)"""
        try:
            ipaddress.ip_address(host)
            return
        except ValueError:
            pass
        bound = [ipaddress.ip_address(sock.getsockname()[0]) for sock in self._server.sockets]
        if bound and all(address.is_loopback for address in bound):
            log.warning("peer address %s: %s resolves to %s on this node, where no other node can reach it; "
                        "name this node by its cluster address in --peers and --peer-self", self.address, host,
                        ", ".join(map(str, bound)))

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counts[key] += n

    def _refused(self, request: _Request, byte_range: str):
        """None for a request signed with our key, else the 403 to send."""
        why = auth.check_request(self.key, request.headers.get("authorization"), "GET", request.path, byte_range)
        if why is None:
            return None
        self._count("requests_refused")
        if self.counts["requests_refused"] <= 10:
            log.warning("refused a peer request from %s: %s", request.remote, why)
        return 403, {}, why.encode()

    async def _index(self, request: _Request, digest: str):
        refused = self._refused(request, "")
        if refused is not None:
            return refused
        if self.index_file is None:
            return 503, {}, b"not serving indexes yet"  # (starting: asked again)
        try:  # the index may be under way: the requester waits as long, and builds it itself after
            data = await asyncio.wait_for(asyncio.wrap_future(self.index_file(digest)), deadline.TIMEOUT)
        except asyncio.TimeoutError:
            data = None
        if data is None:
            return 404, {}, b"no index of that shard here"
        crc = zlib.crc32(data)
        self._count("indexes_to_peers")
        return 200, {"X-Shardfs-Shard": digest, "X-Shardfs-Crc32": crc,
                     "X-Shardfs-Proof": auth.sign_reply(self.key, request.headers["authorization"], crc,
                                                        len(data))}, data

    async def _shard(self, request: _Request, digest: str, held: bool = False):
        byte_range = request.headers.get("range", "")
        refused = self._refused(request, byte_range)
        if refused is not None:
            return refused
        shard = self.find(digest)
        if shard is None:
            return 404, {}, b"no such shard here (another dataset or version)"
        if self.read is None:
            return 503, {}, b"not serving yet"
        wanted = _RANGE.fullmatch(byte_range)
        offset, end = (int(wanted[1]), int(wanted[2]) + 1) if wanted else (None, None)
        if offset is None or not 0 <= offset < end <= shard.size:
            return 416, {}, f"expected a range within {shard.size} bytes".encode()
        try:
            data = self.loaded(shard, offset, end - offset)
            if data is not None:
                crc = zlib.crc32(data)
            elif held:
                self._count("held_missed")
                return 404, {}, b"not held here now"
            else:
                data, crc = await asyncio.get_running_loop().run_in_executor(self._pool, self._read, shard, offset,
                                                                             end - offset)
        except ShardIOError as exc:
            self._count("requests_failed")
            return 503, {}, str(exc).encode()
        headers = {"Content-Range": f"bytes {offset}-{end - 1}/{shard.size}", "X-Shardfs-Shard": shard.digest,
                   "X-Shardfs-Crc32": crc,
                   "X-Shardfs-Proof": auth.sign_reply(self.key, request.headers["authorization"], crc, len(data))}
        if self.fault:
            data = self._damage(data, headers)
        with self._lock:
            self.counts["requests_served"] += 1
            self.counts["bytes_to_peers"] += len(data)
        return 206, headers, memoryview(data)

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
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=10)
        except Exception as exc:  # stopping must not keep the daemon from the rest of its exit
            log.warning("peer server: %s while stopping", exc or type(exc).__name__)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._pool.shutdown(cancel_futures=True)

    async def _close(self) -> None:
        """No new connections; the open ones closed (a reply under way is abandoned)."""
        self._server.close()
        for writer in list(self._writers):
            writer.close()


_RANGE = re.compile(r"bytes=(\d{1,19})-(\d{1,19})")
_REASONS = {200: "OK", 204: "No Content", 206: "Partial Content", 400: "Bad Request", 403: "Forbidden",
            404: "Not Found", 405: "Method Not Allowed", 416: "Range Not Satisfiable", 500: "Internal Server Error",
            503: "Service Unavailable"}


def _head(status: int, headers: dict, length: int) -> bytes:
    """A reply's head: with Content-Length always (but for 204), so the connection is kept."""
    return (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            + ("" if status == 204 else f"Content-Length: {length}\r\n") + "\r\n").encode("latin-1")


class _Request:
    __slots__ = ("close", "headers", "method", "path", "remote")

    def __init__(self, method: str, path: str, headers: dict, close: bool, remote):
        self.method, self.path, self.headers, self.close, self.remote = method, path, headers, close, remote

    @classmethod
    def parse(cls, head: bytes, writer) -> _Request | None:
        """A request's line and headers (names in lower case), or None if it is none we take."""
        try:
            lines = head[:-4].decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ")
        except ValueError:
            return None
        if not version.startswith("HTTP/1.") or not target.startswith("/"):
            return None
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                return None
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers or "transfer-encoding" in headers:
            return None  # a request with a body: none of ours
        close = headers.get("connection", "").lower() == "close" or version == "HTTP/1.0"
        return cls(method, target.partition("?")[0], headers, close, (writer.get_extra_info("peername") or ("?",))[0])
