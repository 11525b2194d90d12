"""A peer's reply as the peer client reads it (storage/peers/client.py ``PeerClient.fetch`` over
conns.py's kept connections): status line, headers, Content-Length, checksum, signature, body, from
a real server on loopback that answers the client's real request with the input's bytes and then
closes the connection (bodies cut short, heads without an end, replies longer than they say).

The input is the reply; ``{crc}`` and ``{proof}`` in it become the body's CRC-32 and the HMAC a
holder of the key would send for this very request (the fuzzer cannot forge one; a peer with the
key can send anything it signs). Beyond "no crash": every failure is a PeerFailure; bytes are
returned only for a reply signed through ``{proof}``, and then they are exactly the length asked
and the bytes signed; what a fetch allocates stays within the length asked plus a head's bound,
whatever Content-Length the reply claims (before its signature is checked).
"""

from __future__ import annotations

import re
import socket
import threading
import zlib

from benchlib.servers import read_head
from fuzzlib import bounded

from shardfs.storage.peers import auth, client, conns

KEY = b"k" * 32
DIGEST = "0123456789abcdef0123456789abcdef"
OFFSET, LENGTH = 100, 64
ALLOCATION_BOUND = 4 * LENGTH + 8 * conns.HEAD_LIMIT + (1 << 20)


class _Peer:
    """A loopback server: each connection gets ``reply`` (placeholders filled in) and is closed."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.reply = b""
        self.signed: bytes | None = None  # the body of the last reply signed through {proof}
        threading.Thread(target=self._serve, name="fuzz-peer", daemon=True).start()

    def _serve(self) -> None:
        while True:
            conn, _ = self.listener.accept()
            with conn:
                conn.settimeout(5)
                try:
                    self._answer(conn)
                except OSError:
                    pass

    def _answer(self, conn: socket.socket) -> None:
        got = read_head(conn)
        if got is None:
            return
        proof = re.search(rb"\r\n%s: ([^\r]*)" % auth.HEADER.encode(), got[0])
        head, sep, body = self.reply.partition(b"\r\n\r\n")
        declared = re.search(rb"(?i)\r\ncontent-length:[ \t]*(\d{1,12})[ \t]*\r", head + b"\r\n")
        signed = body[: int(declared.group(1))] if declared else body
        crc = zlib.crc32(signed)
        if b"{proof}" in head and proof:
            self.signed = signed
            head = head.replace(b"{proof}", auth.sign_reply(KEY, proof.group(1).decode("latin-1"), crc,
                                                            len(signed)).encode())
        conn.sendall(head.replace(b"{crc}", b"%d" % crc) + sep + body)
        conn.shutdown(socket.SHUT_WR)


_PEER: _Peer | None = None
_CLIENT: client.PeerClient | None = None


def one_input(data: bytes) -> None:
    global _PEER, _CLIENT
    if _PEER is None:
        _PEER = _Peer()
        _CLIENT = client.PeerClient([_PEER.address, "127.0.0.1:1"], "127.0.0.1:1", KEY)
    _PEER.reply, _PEER.signed = data, None
    with bounded(ALLOCATION_BOUND, "a peer fetch"):
        try:
            got = _CLIENT.fetch(_PEER.address, DIGEST, OFFSET, LENGTH, budget=3.0)
        except client.PeerFailure:
            return
    assert _PEER.signed is not None, "bytes accepted from a reply not signed with the key"
    assert len(got) == LENGTH and bytes(got) == _PEER.signed, "bytes other than those signed"


def _reply(status: bytes = b"206 Partial Content", body: bytes = bytes(range(LENGTH)), extra: bytes = b"",
           length: int | None = None) -> bytes:
    head = (b"HTTP/1.1 " + status + b"\r\nContent-Length: %d\r\n" % (len(body) if length is None else length)
            + b"Content-Range: bytes %d-%d/100000\r\n" % (OFFSET, OFFSET + LENGTH - 1)
            + b"X-Shardfs-Shard: " + DIGEST.encode() + b"\r\nX-Shardfs-Crc32: {crc}\r\nX-Shardfs-Proof: {proof}\r\n")
    return head + extra + b"\r\n" + body


def seeds() -> list[bytes]:
    return [
        _reply(),
        _reply(extra=b"Connection: close\r\n"),
        _reply(body=bytes(LENGTH - 1)),  # one byte short of the length asked
        _reply(length=LENGTH + 10),  # a body cut short
        _reply(status=b"404 Not Found", body=b"not held"),
        _reply(status=b"200 OK"),
        _reply().replace(b"{proof}", b"0" * 64),  # a signature without the key
        _reply().replace(b"{crc}", b"12345"),  # a checksum that does not match
        _reply(extra=b"Transfer-Encoding: chunked\r\n"),
        b"HTTP/1.1 206 Partial Content\r\nContent-Len",  # a head cut short
        b"SSH-2.0-OpenSSH_9.2\r\n",  # something else on the port
    ]
