"""The peer client: ranged GETs to other nodes (aiohttp, keep-alive), every reply checked end to
end before a byte of it is used, and each peer's health.

A reply counts only if it is 206 for exactly the range asked, names the shard asked for, has
as many bytes as asked, their CRC-32 matches the one sent, and its HMAC proves it comes from a
holder of our key for this request and this body. Anything else is a failure of that peer.

A peer that refuses, resets, does not answer within FIRST_BYTE_S (a reply, or else a sign of
life: an owner may be reading the shard from storage first), or sends far slower than the peers
do (a tenth of the running average of replies, at least MIN_RATE) is *down*: skipped for a
backoff (1 s, doubling to 60 s), after which a request tries it again; it is *up* again as soon
as a reply passes. Host names are resolved at connect time (getaddrinfo: /etc/hosts and DNS),
as a node's name may resolve only on the nodes themselves.

Many peers: one pool of keep-alive connections, at most CONNECTIONS in all and PER_PEER to one
peer (a burst of reads waits for a free one rather than opening a socket each), idle ones
closed after IDLE_S; one sign-of-life request per peer at a time, whoever waits on it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import zlib

from shardfs.errors import ShardfsError
from shardfs.storage.peers import auth

log = logging.getLogger(__name__)

FIRST_BYTE_S = 2.0  # no connection, or no reply nor sign of life, for this long: the peer is down
MIN_RATE = 5e6  # bytes/s: a transfer slower than this is far below any healthy peer here
SLOW_SHARE = 0.1  # ... as is one slower than this share of the running average
RATE_SAMPLE = 1 << 20  # replies this large or larger make the running average (smaller: latency)
BACKOFF_S, MAX_BACKOFF_S = 1.0, 60.0
CONNECTIONS, PER_PEER, IDLE_S = 64, 8, 30.0


class PeerFailure(ShardfsError):
    """A peer gave no usable reply; ``down``: mark it down (else it just lacks the shard)."""

    def __init__(self, message: str, down: bool = True):
        super().__init__(message)
        self.down = down


class Health:
    def __init__(self):
        self.down_until = 0.0
        self.down_since: float | None = None
        self.backoff = BACKOFF_S
        self.failures = 0


class PeerClient:
    def __init__(self, peers: list[str], me: str, key: bytes):
        import aiohttp

        self._aiohttp = aiohttp
        self.key = key
        self.health = {peer: Health() for peer in peers if peer != me}
        self.counts = dict(bytes_from_peers=0, bytes_from_previous_owners=0, requests=0, failures=0,
                           waits_for_owner=0)
        self.rate = 0.0  # bytes/s of large replies, a running average over all peers
        self.generation = 0  # counts peers going down and coming back (the owners change then)
        self._down: frozenset[str] = frozenset()  # the peers down now (made anew at each change)
        self._alive_asks: dict[str, asyncio.Future] = {}  # peer -> its sign-of-life request under way
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="shardfs-peer-client", daemon=True).start()
        self._session = self._call(self._open_session(), 10)

    async def _open_session(self):
        aiohttp = self._aiohttp
        connector = aiohttp.TCPConnector(limit=CONNECTIONS, limit_per_host=PER_PEER, keepalive_timeout=IDLE_S,
                                         resolver=aiohttp.ThreadedResolver())
        self._pings = aiohttp.ClientSession(  # own connections: never queued behind a peer's slow replies
            connector=aiohttp.TCPConnector(limit=PER_PEER, limit_per_host=1, force_close=True,
                                           resolver=aiohttp.ThreadedResolver()))
        return aiohttp.ClientSession(connector=connector, auto_decompress=False)

    def _call(self, coro, timeout: float):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # ---- health ---------------------------------------------------------------------

    def usable(self, peer: str) -> bool:
        """Not down, or down and due for another try."""
        return time.monotonic() >= self.health[peer].down_until

    def is_down(self, peer: str) -> bool:
        return self.health[peer].down_since is not None

    def down(self) -> tuple[int, frozenset[str]]:
        """(generation, the peers down now): the owners follow the second, recomputed when the first moves."""
        with self._lock:
            return self.generation, self._down

    def _failed(self, peer: str, why: str, down: bool) -> None:
        with self._lock:
            h = self.health[peer]
            h.failures += 1
            self.counts["failures"] += 1
            if not down:
                return
            now = time.monotonic()
            h.down_until = now + h.backoff
            h.backoff = min(h.backoff * 2, MAX_BACKOFF_S)
            first = h.down_since is None
            if first:
                h.down_since = now
                self.generation += 1
                self._down = self._down | {peer}
        if first:
            log.warning("peer %s is down (%s): its shards go to other peers", peer, why)

    def _ok(self, peer: str, nbytes: int, seconds: float) -> None:
        with self._lock:
            self.counts["bytes_from_peers"] += nbytes
            if nbytes >= RATE_SAMPLE and seconds > 0:
                self.rate = nbytes / seconds if not self.rate else 0.9 * self.rate + 0.1 * nbytes / seconds
            h = self.health[peer]
            h.backoff = BACKOFF_S
            if h.down_since is None:
                return
            gone, h.down_since, h.down_until = time.monotonic() - h.down_since, None, 0.0
            self.generation += 1
            self._down = self._down - {peer}
        log.warning("peer %s answers again after %.0f s", peer, gone)

    def figures(self) -> dict:
        with self._lock:
            down = [peer for peer, h in self.health.items() if h.down_since is not None]
            return {**self.counts, "peers_up": len(self.health) + 1 - len(down), "peers_down": len(down),
                    "down": down, "failures_by_peer": {peer: h.failures for peer, h in self.health.items()}}

    # ---- fetching -------------------------------------------------------------------

    def fetch(self, peer: str, digest: str, offset: int, length: int, budget: float, held: bool = False) -> bytes:
        """The checked bytes within ``budget`` seconds, or PeerFailure (the peer's health updated).
        ``held``: only if the peer holds them in RAM now (it reads nothing for us; else 404)."""
        with self._lock:
            self.counts["requests"] += 1
            slowest = max(MIN_RATE, SLOW_SHARE * self.rate)
        data = self._checked(peer, f"/{'held' if held else 'shard'}/{digest}", f"bytes={offset}-{offset + length - 1}",
                             digest, length, budget, FIRST_BYTE_S + length / slowest)
        if held:
            with self._lock:
                self.counts["bytes_from_previous_owners"] += len(data)
        return data

    def fetch_index(self, peer: str, digest: str, budget: float) -> bytes:
        """The owner's index file of the shard, checked as shard bytes are (HMAC, CRC-32), within
        ``budget`` seconds (the owner may be building it), or PeerFailure. Neither counted as shard
        bytes nor taken as a sign of the peer's health: at a job's start, peers still starting
        refuse connections, and are not down for the reads that follow."""
        return self._checked(peer, f"/index/{digest}", "", digest, None, budget, budget, health=False)

    def _checked(self, peer: str, target: str, byte_range: str, digest: str, length: int | None, budget: float,
                 transfer: float, health: bool = True) -> bytes:
        work = self._get(peer, target, byte_range, length, budget, transfer)
        future = asyncio.run_coroutine_threadsafe(work, self._loop)
        try:
            data, seconds, headers, proof = future.result(budget + transfer + FIRST_BYTE_S + 1)
            self._check(headers, data, digest, byte_range, length, proof)  # here: the event loop goes on
        except PeerFailure as exc:
            if health:
                self._failed(peer, str(exc), exc.down)
            raise
        except (self._aiohttp.ClientError, asyncio.TimeoutError, TimeoutError, OSError) as exc:
            future.cancel()
            why = str(exc) or type(exc).__name__
            if health:
                self._failed(peer, why, True)
            raise PeerFailure(why) from None
        if health:
            self._ok(peer, len(data), seconds)
        return data

    async def _get(self, peer: str, target: str, byte_range: str, length: int | None, budget: float,
                   transfer: float):
        """(body, seconds its transfer took, headers, the request's proof), unchecked.

        An owner may need a while to read a shard from storage before it replies: while no reply
        comes, the peer is asked every FIRST_BYTE_S whether it is alive at all; one that is not
        (frozen, gone) fails at once, one that is gets the whole ``budget`` (then fails without
        being marked down). Once the reply has begun, its body gets ``transfer`` seconds."""
        proof = auth.sign_request(self.key, "GET", target, byte_range)
        began: list[float] = []  # when the reply's head arrived
        loop = asyncio.get_running_loop()
        ends = loop.time() + budget
        asking = asyncio.ensure_future(self._exchange(f"http://{peer}{target}", byte_range, proof, length, began))
        try:
            while True:
                now = loop.time()
                if began:
                    wait = began[0] + transfer - now
                    if wait <= 0:
                        raise PeerFailure(f"sent {length} bytes far slower than the peers do")
                elif now >= ends:
                    raise PeerFailure(f"alive, but no reply within {budget:.1f} s", down=False)
                else:
                    wait = min(FIRST_BYTE_S, ends - now)
                done, _ = await asyncio.wait({asking}, timeout=wait)
                if done:
                    body, headers = asking.result()
                    return body, loop.time() - began[0], headers, proof
                if not began and loop.time() < ends:
                    if not await self._alive(peer):
                        raise PeerFailure(f"no answer within {FIRST_BYTE_S:.0f} s")
                    with self._lock:
                        self.counts["waits_for_owner"] += 1
        finally:
            asking.cancel()  # nothing when it is done

    async def _alive(self, peer: str) -> bool:
        """Whether the peer answers a sign-of-life request; one request per peer at a time, its
        answer shared by every read waiting on that peer."""
        asking = self._alive_asks.get(peer)
        if asking is None:
            asking = self._alive_asks[peer] = asyncio.ensure_future(self._ping(peer))
            asking.add_done_callback(lambda _: self._alive_asks.pop(peer, None))
        return await asyncio.shield(asking)

    async def _ping(self, peer: str) -> bool:
        try:
            async with self._pings.get(f"http://{peer}/alive",
                                       timeout=self._aiohttp.ClientTimeout(total=FIRST_BYTE_S)) as reply:
                return reply.status == 204
        except (self._aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False

    async def _exchange(self, url: str, byte_range: str, proof: str, length: int | None, began: list):
        limits = self._aiohttp.ClientTimeout(total=None, sock_connect=FIRST_BYTE_S)
        headers = {auth.HEADER: proof, **({"Range": byte_range} if byte_range else {})}
        async with self._session.get(url, headers=headers, timeout=limits) as reply:
            if reply.status != (206 if byte_range else 200):
                why = (await reply.content.read(200)).decode("utf-8", "replace")
                raise PeerFailure(f"HTTP {reply.status}: {why}", down=reply.status != 404)
            if length is not None and reply.content_length != length:  # before reading a body we would not use
                raise PeerFailure(f"reply of {reply.content_length} bytes for {length}")
            began.append(asyncio.get_running_loop().time())  # the owner sends a reply whole, once it has the bytes
            return await reply.read(), reply.headers

    def _check(self, h, body: bytes, digest: str, byte_range: str, length: int | None, proof: str) -> None:
        try:
            crc = int(h.get("X-Shardfs-Crc32", ""))
        except ValueError:
            raise PeerFailure("reply without a checksum") from None
        if h.get("X-Shardfs-Shard") != digest:
            raise PeerFailure(f"reply for another shard ({h.get('X-Shardfs-Shard')})")
        if byte_range and not h.get("Content-Range", "").startswith(byte_range.replace("=", " ", 1) + "/"):
            raise PeerFailure(f"reply for another range ({h.get('Content-Range')})")
        if length is not None and len(body) != length:
            raise PeerFailure(f"truncated reply: {len(body)} of {length} bytes")
        if not auth.check_reply(self.key, proof, crc, len(body), h.get("X-Shardfs-Proof")):
            raise PeerFailure("reply not signed with our key")
        if zlib.crc32(body) != crc:
            raise PeerFailure("reply failed its checksum")

    def close(self) -> None:
        try:
            self._call(self._session.close(), 5)
            self._call(self._pings.close(), 5)
        except (TimeoutError, RuntimeError):
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
