"""The peer client's connections stay bounded: a burst of requests to one peer shares at most
PER_PEER connections (a real PeerServer on loopback, whose reads wait until released); idle ones
are closed, and a kept connection the peer closed is replaced without a failure."""

import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from conftest import wait_for
from test_peers import free_port

from shardfs.storage.peers import client as peer_client
from shardfs.storage.peers import server as peer_server
from shardfs.storage.peers.client import PeerClient
from shardfs.storage.peers.server import PeerServer

KEY = b"k" * 64


def established_to(port: int) -> int:
    """TCP connections to ``port`` on this machine now (from /proc/net/tcp, state ESTABLISHED)."""
    count = 0
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if int(fields[2].split(":")[1], 16) == port and fields[3] == "01":
                count += 1
    return count


def test_a_burst_of_requests_to_one_peer_uses_at_most_per_peer_connections():
    me, other = f"127.0.0.2:{free_port('127.0.0.2')}", f"127.0.0.3:{free_port('127.0.0.3')}"
    shard = SimpleNamespace(size=1 << 20, digest="ab" * 16)
    release, waiting, lock = threading.Event(), [0], threading.Lock()

    def read(_shard, offset, length):
        with lock:
            waiting[0] += 1
        release.wait(30)
        return bytes(length)

    server = PeerServer(other, KEY, {shard.digest: shard}.get)
    server.start()
    server.ready(read, lambda *_: None)
    client = PeerClient([me, other], me, KEY)
    burst = 40
    try:
        with ThreadPoolExecutor(burst) as pool:
            replies = [pool.submit(client.fetch, other, shard.digest, i * 1024, 1024, 20.0) for i in range(burst)]
            held = min(peer_client.PER_PEER, peer_server.THREADS)
            wait_for(lambda: waiting[0] >= held, "the server holds as many reads as it and the pool let through")
            assert established_to(int(other.rsplit(":", 1)[1])) <= peer_client.PER_PEER
            release.set()
            assert all(r.result(timeout=60) == bytes(1024) for r in replies)
    finally:
        release.set()
        client.close()
        server.stop()


def serving(address: str, shard) -> PeerServer:
    server = PeerServer(address, KEY, {shard.digest: shard}.get)
    server.start()
    server.ready(lambda _shard, offset, length: bytes(length), lambda *_: None)
    return server


def test_idle_connections_are_closed_and_a_restarted_peer_is_asked_on_a_new_one(monkeypatch):
    """A kept connection the peer closed (its daemon restarted) costs no failure: the request goes
    out again on a new connection. Connections idle for IDLE_S are closed."""
    monkeypatch.setattr(peer_client, "IDLE_S", 1.0)
    me, other = f"127.0.0.2:{free_port('127.0.0.2')}", f"127.0.0.3:{free_port('127.0.0.3')}"
    port = int(other.rsplit(":", 1)[1])
    shard = SimpleNamespace(size=1 << 20, digest="cd" * 16)
    server = serving(other, shard)
    client = PeerClient([me, other], me, KEY)
    try:
        assert client.fetch(other, shard.digest, 0, 4096, 10.0) == bytes(4096)
        assert client._pool.connections() == 1
        server.stop()
        server = serving(other, shard)  # the same address: the kept connection is dead now
        assert client.fetch(other, shard.digest, 4096, 4096, 10.0) == bytes(4096)
        assert client.figures()["failures"] == 0 and client.figures()["down"] == []
        wait_for(lambda: client._pool.connections() == 0 and established_to(port) == 0,
                 "the idle connection is still open")
    finally:
        client.close()
        server.stop()
