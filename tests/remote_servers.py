"""Real servers on loopback for the remote-source tests: moto's S3 server, nginx, and a TCP
proxy that injects failures. Each is a subprocess or thread started by a fixture and stopped
by pid (or joined) in its ``finally``."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import uuid

import pytest

from benchlib.mounts import stop_child
from benchlib.sample import digests as tree_digests  # noqa: F401 (the suite's one walk of a tree's sha256s)
from benchlib.servers import ACCESS_KEY, SECRET_KEY, nginx_binary, read_head, start_moto, start_nginx

__all__ = ["ACCESS_KEY", "SECRET_KEY"]  # the tests use the credentials the servers take


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory):
    """moto's standalone S3 server on a free loopback port: its endpoint URL."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    with open(tmp_path_factory.mktemp("moto") / "moto.log", "wb") as log:
        proc, endpoint = start_moto(log)
        try:
            yield endpoint
        finally:
            stop_child(proc)


@pytest.fixture
def aws_env(monkeypatch, tmp_path):
    """Credentials the way AWS tools take them, and a private index cache, for this test's mounts."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))  # not the machine's
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "shardfs"


class Bucket:
    def __init__(self, endpoint: str):
        import boto3

        self.client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=ACCESS_KEY,
                                   aws_secret_access_key=SECRET_KEY, region_name="us-east-1")
        self.name = f"shardfs-{uuid.uuid4().hex[:12]}"
        self.client.create_bucket(Bucket=self.name)

    def upload_dir(self, folder, prefix: str = "ds/") -> str:
        for name in sorted(os.listdir(folder)):
            self.put(prefix + name, (folder / name).read_bytes())
        return f"s3://{self.name}/{prefix}"

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.name, Key=key, Body=data)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.name, Key=key)


@pytest.fixture
def bucket(moto_endpoint, aws_env):
    return Bucket(moto_endpoint)


@pytest.fixture
def nginx(tmp_path):
    """nginx from Debian serving ``tmp_path / "www"`` (Range, ETag, If-Match): (base URL, www dir)."""
    yield from _nginx(tmp_path, "")


@pytest.fixture
def nginx_without_etag(tmp_path):
    """The same, sending no ETag: objects are known by Last-Modified (If-Unmodified-Since)."""
    yield from _nginx(tmp_path, "etag off;")


def _nginx(tmp_path, extra: str):
    if nginx_binary() is None:
        pytest.skip("needs nginx (apt-get install nginx; tools/setup.sh does)")
    www = tmp_path / "www"
    www.mkdir()
    proc, url = start_nginx(str(tmp_path / "nginx"), str(www), extra)
    try:
        yield url, www
    finally:
        stop_child(proc)


class FaultyProxy:
    """A loopback TCP proxy (threads) that can fail the next connections: answer ``503`` to
    the first ``fail`` new connections, cut the next ``cuts`` connections after ``cut_after``
    bytes of response, or (``hang``) take every new connection and never answer, as a store
    that stopped responding. ``arm`` also closes live connections, so faults hit new requests."""

    def __init__(self, target_port: int):
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.fail = self.cuts = self.cut_after = 0
        self.hang = False
        self.failed = self.cut = self.hung = 0
        self._lock = threading.Lock()
        self._live: set[socket.socket] = set()
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def arm(self, fail: int = 0, cuts: int = 0, cut_after: int = 0, hang: bool = False) -> None:
        with self._lock:
            self.fail, self.cuts, self.cut_after, self.hang = fail, cuts, cut_after, hang
            live, self._live = list(self._live), set()
        for s in live:
            _close(s)

    def close(self) -> None:
        self._stop = True
        _close(self.listener)
        self.arm()
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with self._lock:
            hang = self.hang
            if hang:
                self.hung += 1
                self._live.add(client)
        if hang:
            try:  # swallow the request, answer nothing, until arm() closes it
                while client.recv(65536):
                    pass
            except OSError:
                pass
            _close(client)
            return
        with self._lock:
            fail = self.fail > 0
            self.fail -= fail
            cut_after = self.cut_after if self.cuts > 0 and not fail else 0
            self.cuts -= cut_after > 0
        if fail:
            try:
                client.settimeout(5)
                read_head(client)  # (the request, whatever it asks: refused)
                client.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                with self._lock:
                    self.failed += 1
            except OSError:
                pass
            _close(client)
            return
        try:
            upstream = socket.create_connection(self.target)
        except OSError:
            _close(client)
            return
        with self._lock:
            self._live.update((client, upstream))
        threading.Thread(target=self._pump, args=(client, upstream, 0), daemon=True).start()
        self._pump(upstream, client, cut_after)

    def _pump(self, src: socket.socket, dst: socket.socket, cut_after: int) -> None:
        sent = 0
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if cut_after and sent + len(data) > cut_after:
                    dst.sendall(data[: cut_after - sent])
                    with self._lock:
                        self.cut += 1
                    break
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        _close(src)
        _close(dst)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass


@pytest.fixture
def proxy():
    """``proxy(target_port)``: a FaultyProxy in front of a server; all closed at teardown."""
    made: list[FaultyProxy] = []

    def make(target_port: int) -> FaultyProxy:
        made.append(FaultyProxy(target_port))
        return made[-1]

    try:
        yield make
    finally:
        for p in made:
            p.close()


def digest(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()
