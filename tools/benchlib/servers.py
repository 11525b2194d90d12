"""Real servers on loopback for remote shards: moto's S3 server and nginx, each a child process
stopped by its pid (``mounts.stop_child``). Used by the remote tests' fixtures and bench_remote."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

from .mounts import stop_child

ACCESS_KEY, SECRET_KEY = "AKIDSHARDFSTEST01", "shardfs-test-secret-value-0123456789"

NGINX_CONF = """
worker_processes 1;
{user}
error_log {prefix}/error.log;
pid {prefix}/nginx.pid;
events {{ worker_connections 256; }}
http {{
    access_log {prefix}/access.log;
    client_body_temp_path {prefix}/tmp; proxy_temp_path {prefix}/tmp; fastcgi_temp_path {prefix}/tmp;
    uwsgi_temp_path {prefix}/tmp; scgi_temp_path {prefix}/tmp;
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        autoindex on;
        {extra}
    }}
}}
"""


def read_head(conn: socket.socket, pending: bytes = b"") -> tuple[bytes, bytes] | None:
    """An HTTP message's head from ``conn``, after the ``pending`` bytes already read: (the head
    without its blank line, the bytes after it), or None when the other end closes first."""
    while b"\r\n\r\n" not in pending:
        got = conn.recv(65536)
        if not got:
            return None
        pending += got
    head, _, rest = pending.partition(b"\r\n\r\n")
    return head, rest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 30) -> None:
    """Return once ``port`` accepts connections; when ``proc`` dies or is too slow, stop it and fail."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_child(proc)
                raise RuntimeError(f"{what} did not start (exit status {proc.poll()})") from None
            time.sleep(0.05)


def start_moto(log) -> tuple[subprocess.Popen, str]:
    """moto's standalone S3 server on a free loopback port: (process, endpoint URL), answering."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=log, stderr=subprocess.STDOUT)
    wait_for_port(port, proc, "moto server")
    return proc, f"http://127.0.0.1:{port}"


def nginx_binary() -> str | None:
    return shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)


def start_nginx(prefix: str, root: str, extra: str = "") -> tuple[subprocess.Popen, str]:
    """nginx serving ``root`` (Range, ETag, If-Match), its files under ``prefix``: (process, base URL)."""
    port = free_port()
    os.makedirs(os.path.join(prefix, "tmp"), exist_ok=True)
    conf = os.path.join(prefix, "nginx.conf")
    with open(conf, "w") as f:
        f.write(NGINX_CONF.format(prefix=prefix, root=root, port=port, extra=extra,
                                  user="user root;" if os.getuid() == 0 else ""))
    with open(os.path.join(prefix, "stderr.log"), "wb") as err:
        proc = subprocess.Popen([nginx_binary(), "-p", prefix, "-c", conf, "-g", "daemon off;"],
                                stdout=subprocess.DEVNULL, stderr=err)
    wait_for_port(port, proc, "nginx")
    return proc, f"http://127.0.0.1:{port}"
