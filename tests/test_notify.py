"""sd_notify over a real unix datagram socket, path and abstract namespace."""

import os
import socket

import pytest

from shardfs.service.notify import Notifier


@pytest.mark.parametrize("abstract", [False, True])
def test_messages_arrive(tmp_path, abstract):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"\0shardfs-test-{os.getpid()}" if abstract else str(tmp_path / "notify.sock")
    sock.bind(name)
    sock.settimeout(5)
    try:
        env = {"NOTIFY_SOCKET": "@" + name[1:] if abstract else name}
        n = Notifier(env)
        assert n.enabled
        n.send(ready="1", status="serving 3 shards")
        assert sock.recv(4096) == b"READY=1\nSTATUS=serving 3 shards"
    finally:
        sock.close()


def test_watchdog_interval_and_disabled_without_socket():
    assert Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "2000000"}).watchdog_s == 2.0
    assert Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}).watchdog_s is None
    quiet = Notifier({})
    assert not quiet.enabled
    quiet.send(ready="1")  # a no-op, not an error
