"""The peer client: ranged GETs to other nodes (keep-alive HTTP/1.1 on the reading thread,
conns.py), every reply checked end to end before a byte of it is used, and each peer's health.

A reply counts only if it is 206 for exactly the range asked, names the shard asked for, has
as many bytes as asked, their CRC-32 matches the one sent, and its HMAC proves it comes from a
holder of our key for this request and this body. Anything else is a failure of that peer. All
but the CRC is checked on the reply's head, before its body gets room (a reply of another
status: only a short message is taken), so that no answer makes a node allocate what it says.

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

import logging
import socket
import threading
import time
import zlib
from concurrent.futures import Future

from shardfs.errors import ShardfsError
from shardfs.storage.peers import auth, conns
from shardfs.storage.peers.addresses import split

log = logging.getLogger(__name__)

FIRST_BYTE_S = 2.0  # no connection, or no reply nor sign of life, for this long: the peer is down
MIN_RATE = 5e6  # bytes/s: a transfer slower than this is far below any healthy peer here
SLOW_SHARE = 0.1  # ... as is one slower than this share of the running average
RATE_SAMPLE = 1 << 20  # replies this large or larger make the running average (smaller: latency)
BACKOFF_S, MAX_BACKOFF_S = 1.0, 60.0
MESSAGE_LIMIT = 4096  # bytes: the longest body taken from a reply that is not the one asked for (its message)
CONNECTIONS, PER_PEER, IDLE_S = 64, 8, 30.0


class PeerFailure(ShardfsError):
    """A peer gave no usable reply; ``down``: mark it down (else it just lacks the shard, or
    ``busy``: all our connections to it were in use, which says nothing of the shard)."""

    def __init__(self, message: str, down: bool = True, busy: bool = False):
        super().__init__(message)
        self.down, self.busy = down and not busy, busy


class Health:
    def __init__(self):
        self.down_until = 0.0
        self.down_since: float | None = None
        self.backoff = BACKOFF_S
        self.failures = 0


class PeerClient:
    def __init__(self, peers: list[str], me: str, key: bytes):
        self.key = key
        self.health = {peer: Health() for peer in peers if peer != me}
        self.counts = dict(bytes_from_peers=0, bytes_from_previous_owners=0, requests=0, failures=0,
                           waits_for_owner=0)
        self.rate = 0.0  # bytes/s of large replies, a running average over all peers
        self.generation = 0  # counts peers going down and coming back (the owners change then)
        self._down: frozenset[str] = frozenset()  # the peers down now (made anew at each change)
        self._alive_asks: dict[str, Future] = {}  # peer -> its sign-of-life request under way
        self._lock = threading.Lock()
        self._pool = conns.Pool(CONNECTIONS, PER_PEER, IDLE_S, FIRST_BYTE_S)

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
        try:
            body, seconds, crc = self._get(peer, target, byte_range, digest, length, budget, transfer)
            if zlib.crc32(body) != crc:
                raise PeerFailure("reply failed its checksum")
        except PeerFailure as exc:
            if health:
                self._failed(peer, str(exc), exc.down)
            raise
        except (OSError, ValueError) as exc:
            why = str(exc) or type(exc).__name__
            if health:
                self._failed(peer, why, True)
            raise PeerFailure(why) from None
        if health:
            self._ok(peer, len(body), seconds)
        return body

    def _get(self, peer: str, target: str, byte_range: str, digest: str, length: int | None, budget: float,
             transfer: float):
        """(body, seconds its transfer took, the CRC-32 its signed head gives), the head checked.

        An owner may need a while to read a shard from storage before it replies: while no reply
        comes, the peer is asked every FIRST_BYTE_S whether it is alive at all; one that is not
        (frozen, gone) fails at once, one that is gets the whole ``budget`` (then fails without
        being marked down). Once the reply has begun, its body gets ``transfer`` seconds."""
        proof = auth.sign_request(self.key, "GET", target, byte_range)
        headers = {auth.HEADER: proof, **({"Range": byte_range} if byte_range else {})}
        ends = time.monotonic() + budget
        gone: list[bool] = []

        def waiting() -> bool:
            if time.monotonic() >= ends:
                return False
            if not self._alive(peer):
                gone.append(True)
                return False
            with self._lock:
                self.counts["waits_for_owner"] += 1
            return True

        def admit(status: int, h: dict, size: int) -> None:
            if status == (206 if byte_range else 200):
                self._check_head(h, size, digest, byte_range, length, proof)
            elif size > MESSAGE_LIMIT:
                raise PeerFailure(f"HTTP {status} with a body of {size} bytes")

        try:
            reply = self._pool.get(peer, target, headers, FIRST_BYTE_S, ends, transfer, admit, waiting)
        except conns.Timeout as exc:
            if not exc.head:
                raise PeerFailure(f"sent {length} bytes far slower than the peers do") from None
            if gone:
                raise PeerFailure(f"no answer within {FIRST_BYTE_S:.0f} s") from None
            raise PeerFailure(f"alive, but no reply within {budget:.1f} s", down=False) from None
        except conns.Busy:
            raise PeerFailure(f"every connection to it busy for {budget:.1f} s", busy=True) from None
        except TimeoutError:
            raise PeerFailure(f"no connection within {FIRST_BYTE_S:.0f} s") from None
        if reply.status != (206 if byte_range else 200):
            why = bytes(reply.body).decode("utf-8", "replace")[:200]
            raise PeerFailure(f"HTTP {reply.status}: {why}", down=reply.status != 404)
        return reply.body, time.monotonic() - reply.began, int(reply.headers["x-shardfs-crc32"])

    def _alive(self, peer: str) -> bool:
        """Whether the peer answers a sign-of-life request; one request per peer at a time, its
        answer shared by every read waiting on that peer."""
        with self._lock:
            asking = self._alive_asks.get(peer)
            mine = asking is None
            if mine:
                asking = self._alive_asks[peer] = Future()
        if not mine:
            return asking.result()
        alive = False  # (whatever stops the ping: those waiting on it hear "not alive", never nothing)
        try:
            alive = self._ping(peer)
        except Exception:
            log.exception("peer %s: the sign-of-life request failed", peer)
        finally:
            with self._lock:
                self._alive_asks.pop(peer, None)
            asking.set_result(alive)
        return alive

    @staticmethod
    def _ping(peer: str) -> bool:
        """GET /alive on a connection of its own: never queued behind a peer's slow replies."""
        try:
            with socket.create_connection(split(peer), timeout=FIRST_BYTE_S) as sock:
                sock.sendall(f"GET /alive HTTP/1.1\r\nHost: {peer}\r\nConnection: close\r\n\r\n".encode("latin-1"))
                return sock.recv(64).startswith((b"HTTP/1.1 204", b"HTTP/1.0 204"))
        except OSError:
            return False

    def _check_head(self, h: dict, size: int, digest: str, byte_range: str, length: int | None, proof: str) -> None:
        """The head of the reply asked for, before its body: the shard, the range, the length
        and the HMAC over them and the CRC-32 (which the body must then match)."""
        crc = h.get("x-shardfs-crc32", "")
        if not crc.isdigit():
            raise PeerFailure("reply without a checksum")
        if h.get("x-shardfs-shard") != digest:
            raise PeerFailure(f"reply for another shard ({h.get('x-shardfs-shard')})")
        if byte_range and not h.get("content-range", "").startswith(byte_range.replace("=", " ", 1) + "/"):
            raise PeerFailure(f"reply for another range ({h.get('content-range')})")
        if length is not None and size != length:
            raise PeerFailure(f"reply of {size} bytes for {length}")
        if not auth.check_reply(self.key, proof, int(crc), size, h.get("x-shardfs-proof")):
            raise PeerFailure("reply not signed with our key")

    def close(self) -> None:
        self._pool.close()
