"""The peer server takes only what peers send: anything else gets 400 (or, past the head limit,
a closed connection) and never a byte of a shard; kept connections serve request after request.
A real PeerServer on loopback, raw sockets."""

import socket
from types import SimpleNamespace

import pytest
from test_peers import free_port

from shardfs.storage.peers import auth
from shardfs.storage.peers import server as peer_server
from shardfs.storage.peers.server import HEAD_LIMIT, PeerServer

KEY = b"k" * 64


@pytest.fixture
def server():
    address = f"127.0.0.2:{free_port('127.0.0.2')}"
    shard = SimpleNamespace(size=1 << 16, digest="ef" * 16)
    srv = PeerServer(address, KEY, {shard.digest: shard}.get)
    srv.start()
    srv.ready(lambda _s, offset, length: bytes(length), lambda *_: None)
    try:
        yield srv, shard
    finally:
        srv.stop()


def exchange(address: str, data: bytes, replies: int = 1) -> list[bytes]:
    """The raw replies (heads and bodies as they came) to ``data``, until ``replies`` arrived or the server closed."""
    host, port = address.rsplit(":", 1)
    got = b""
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        while got.count(b"HTTP/1.1 ") < replies:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            got += chunk
    return [b"HTTP/1.1 " + part for part in got.split(b"HTTP/1.1 ")[1:]]


@pytest.mark.parametrize("request_bytes", [
    b"NONSENSE\r\n\r\n",
    b"GET /alive\r\n\r\n",  # no version
    b"GET /alive HTTP/1.1\r\nno colon here\r\n\r\n",
    b"POST /shard/x HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",  # a body
])
def test_requests_no_peer_sends_get_400_and_the_connection_closed(server, request_bytes):
    srv, _shard = server
    replies = exchange(srv.address, request_bytes + b"GET /alive HTTP/1.1\r\n\r\n", replies=2)
    assert len(replies) == 1 and replies[0].startswith(b"HTTP/1.1 400 ")


def test_a_head_past_the_limit_is_closed_without_a_reply(server):
    srv, _shard = server
    head = b"GET /alive HTTP/1.1\r\nX-Pad: " + b"a" * HEAD_LIMIT + b"\r\n\r\n"
    assert exchange(srv.address, head) == []


def test_a_kept_connection_serves_requests_in_turn_and_a_signed_range(server):
    srv, shard = server
    target, byte_range = f"/shard/{shard.digest}", "bytes=10-19"
    proof = auth.sign_request(KEY, "GET", target, byte_range)
    signed = f"GET {target} HTTP/1.1\r\nAuthorization: {proof}\r\nRange: {byte_range}\r\n\r\n".encode()
    unsigned = f"GET {target} HTTP/1.1\r\nRange: {byte_range}\r\n\r\n".encode()
    replies = exchange(srv.address, b"GET /alive HTTP/1.1\r\n\r\n" + signed + unsigned, replies=3)
    assert [r.split(b" ", 2)[1] for r in replies] == [b"204", b"206", b"403"]
    head, body = replies[1].split(b"\r\n\r\n", 1)
    assert b"\r\nContent-Range: bytes 10-19/65536\r\n" in head and body == bytes(10)
    assert srv.counts["requests_served"] == 1 and srv.counts["requests_refused"] == 1


def test_a_connection_silent_too_long_is_closed(server, monkeypatch):
    srv, _shard = server
    monkeypatch.setattr(peer_server, "KEEP_S", 0.5)
    host, port = srv.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"GET /alive HTTP/1.1\r\n")  # half a head, then nothing
        assert sock.recv(100) == b""  # closed by the server, no reply
