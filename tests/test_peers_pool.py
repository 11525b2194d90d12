"""The peer client's connections stay bounded: a burst of requests to one peer shares at most
PER_PEER connections (a real PeerServer on loopback, whose reads wait until released)."""

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
