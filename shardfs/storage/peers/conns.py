"""Keep-alive HTTP/1.1 connections to the peers, used by the reading thread itself.

A member's bytes from a peer cost one request: sent and answered on the thread that needs them
(a FUSE worker, a cache loader), on a connection kept open for the next one. No event loop in
between, no thread hop and no per-request task: with peers, a node's reads are CPU-bound on
Python's per-request cost (one request per member), and this path is most of it.

The pool is bounded: at most ``total`` connections in all and ``per_peer`` to one peer (a burst
of reads waits for a free one rather than opening a socket each; at the total, an idle one to
another peer is closed to make room); idle ones are closed after ``idle_s`` (by a sweeper thread).
Replies are parsed only as far as a peer server's replies go: a status line, headers, a body of
Content-Length bytes; anything else fails the exchange (and its connection is closed). A body is
given room only once the caller's ``admit(status, headers, length)`` has taken the head (for a
shard's bytes: no longer than asked, signed with our key): whatever answers on a peer's address
cannot make a node allocate what it says.

A kept connection that breaks before its reply (the peer closed it, reset it, or the pipe broke:
a restarted daemon, a rebooted node, a firewall that forgot the connection) says nothing of the
peer: the request goes out once more on a new connection before the caller hears of a failure.
"""

from __future__ import annotations

import socket
import threading
import time

from shardfs.errors import ShardfsError
from shardfs.storage.peers.addresses import split

HEAD_LIMIT = 16 << 10  # a reply head longer than this is no peer server's
HEAD_READ = 4096  # the head is read in pieces this large (the body then lands in its buffer at once)


class Timeout(ShardfsError):
    """No reply head, or no body, within the time given (the connection is closed)."""

    def __init__(self, head: bool):
        super().__init__("no reply head in time" if head else "the body did not come in time")
        self.head = head


class Busy(ShardfsError):
    """Every connection to the peer we may open was in use until the time given."""


class Closed(ShardfsError, ConnectionError):
    """The connection ended, was reset or broke before a byte of the reply (on a kept one: the
    peer closed or forgot it; asked again on a new connection)."""


BROKEN = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)  # a connection that broke under us


class Reply:
    __slots__ = ("began", "body", "headers", "status")

    def __init__(self, status: int, headers: dict, body: bytearray, began: float):
        self.status, self.headers, self.body, self.began = status, headers, body, began


class Pool:
    def __init__(self, total: int, per_peer: int, idle_s: float, connect_s: float):
        self.total, self.per_peer, self.idle_s, self.connect_s = total, per_peer, idle_s, connect_s
        self._idle: dict[str, list[tuple[socket.socket, float]]] = {}  # peer -> (socket, idle since), newest last
        self._open: dict[str, int] = {}
        self._count = 0
        self._cond = threading.Condition()
        self._closed = threading.Event()
        threading.Thread(target=self._sweep, name="shardfs-peer-conns", daemon=True).start()

    # ---- connections ---------------------------------------------------------------------

    def _take(self, peer: str, ends: float) -> socket.socket | None:
        """An idle connection, or None: a slot reserved for a new one; waits for a free one
        until ``ends`` (then Busy)."""
        with self._cond:
            while True:
                idle = self._idle.get(peer)
                if idle:
                    return idle.pop()[0]
                if self._open.get(peer, 0) < self.per_peer:
                    if self._count >= self.total:
                        self._close_one_idle()
                    if self._count < self.total:
                        self._open[peer] = self._open.get(peer, 0) + 1
                        self._count += 1
                        return None
                left = ends - time.monotonic()
                if left <= 0:
                    raise Busy(f"no free connection to {peer}")
                self._cond.wait(min(left, 1.0))

    def _close_one_idle(self) -> None:
        oldest = min(((since, peer) for peer, idle in self._idle.items() for _s, since in idle[:1]), default=None)
        if oldest is not None:
            sock, _ = self._idle[oldest[1]].pop(0)
            self._forget(oldest[1], sock)

    def _forget(self, peer: str, sock: socket.socket) -> None:
        """Lock held."""
        sock.close()
        self._open[peer] -= 1
        self._count -= 1
        self._cond.notify()

    def _give(self, peer: str, sock: socket.socket) -> None:
        with self._cond:
            if self._closed.is_set():
                self._forget(peer, sock)
                return
            self._idle.setdefault(peer, []).append((sock, time.monotonic()))
            self._cond.notify()

    def _drop(self, peer: str, sock: socket.socket | None) -> None:
        with self._cond:
            if sock is None:  # a reserved slot never connected
                self._open[peer] -= 1
                self._count -= 1
                self._cond.notify()
            else:
                self._forget(peer, sock)

    def _sweep(self) -> None:
        while not self._closed.wait(min(5.0, self.idle_s / 2)):
            cutoff = time.monotonic() - self.idle_s
            with self._cond:
                for peer, idle in self._idle.items():
                    while idle and idle[0][1] < cutoff:
                        self._forget(peer, idle.pop(0)[0])

    def connections(self) -> int:
        with self._cond:
            return self._count

    def close(self) -> None:
        self._closed.set()
        with self._cond:
            for peer, idle in self._idle.items():
                while idle:
                    self._forget(peer, idle.pop()[0])

    # ---- one exchange ----------------------------------------------------------------------

    def get(self, peer: str, target: str, headers: dict, head_s: float, ends: float, body_s: float, admit,
            waiting=None) -> Reply:
        """GET ``target`` from ``peer``: the reply, its body whole. The head may take until
        ``ends``; every ``head_s`` without it, ``waiting()`` is asked whether to go on (False:
        Timeout). ``admit(status, headers, length)`` sees the head before the body is given room
        (it raises to refuse it). The body gets ``body_s`` from the head's arrival. OSError,
        Timeout, Busy, ValueError (a reply no peer server sends), or what ``admit`` raises."""
        request = (f"GET {target} HTTP/1.1\r\nHost: {peer}\r\n"
                   + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode("latin-1")
        for attempt in range(2):
            sock = self._take(peer, ends)
            reused = sock is not None
            try:
                if sock is None:
                    sock = socket.create_connection(split(peer), timeout=self.connect_s)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(self.connect_s)  # (a kept one has the last exchange's timeout)
                try:
                    sock.sendall(request)
                except BROKEN as exc:
                    raise Closed(f"the connection broke before the request went out ({exc.strerror})") from None
                reply, keep = self._reply(sock, head_s, ends, body_s, waiting, admit)
            except Closed:
                self._drop(peer, sock)
                if reused and attempt == 0:
                    continue  # a kept connection the peer closed or forgot (restarted, rebooted): a new one
                raise
            except BaseException:
                self._drop(peer, sock)
                raise
            if keep:
                self._give(peer, sock)
            else:
                self._drop(peer, sock)
            return reply
        raise AssertionError("unreachable")

    @staticmethod
    def _reply(sock: socket.socket, head_s: float, ends: float, body_s: float, waiting, admit) -> tuple[Reply, bool]:
        data = bytearray()
        while (end := data.find(b"\r\n\r\n")) < 0:
            if len(data) > HEAD_LIMIT:
                raise ValueError("a reply head far too long")
            left = ends - time.monotonic()
            if left <= 0:
                raise Timeout(head=True)
            sock.settimeout(min(head_s, left))
            try:
                got = sock.recv(HEAD_READ)
            except TimeoutError:
                if data or waiting is None or not waiting():
                    raise Timeout(head=True) from None
                continue
            except BROKEN as exc:
                if data:
                    raise
                raise Closed(f"the connection broke before a reply ({exc.strerror})") from None
            if not got:
                if data:
                    raise ValueError("the reply ended within its head")
                raise Closed("connection closed before a reply")
            data += got
        began = time.monotonic()
        lines = bytes(data[:end]).decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ValueError(f"not an HTTP reply: {lines[0][:80]!r}")
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise ValueError("a malformed reply header")
            headers[name.strip().lower()] = value.strip()
        if "transfer-encoding" in headers or not headers.get("content-length", "").isdigit():
            raise ValueError("a reply without a plain Content-Length")
        status, length = int(parts[1]), int(headers["content-length"])
        admit(status, headers, length)  # (before the body has room: only a head the caller takes gets it)
        body = bytearray(length)
        have = min(len(data) - end - 4, length)
        body[:have] = data[end + 4 : end + 4 + have]
        view, deadline = memoryview(body), began + body_s
        while have < length:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(head=False)
            sock.settimeout(left)
            try:
                got = sock.recv_into(view[have:])
            except TimeoutError:
                raise Timeout(head=False) from None
            if not got:
                raise ConnectionError(f"the reply ended after {have} of {length} bytes")
            have += got
        keep = headers.get("connection", "").lower() != "close" and len(data) - end - 4 <= length
        return Reply(status, headers, body, began), keep
