"""Only the job's own user gets bytes: a secret in a 0600 file under the user's home, and an
HMAC of every request (method, path, range, time) and of every reply (the request it answers,
its checksum).

The key file is created on first use. Nodes of a job may start at the same moment on a shared
home: each writes a candidate under a private name (O_EXCL, 0600) and links it to the real
name; link fails for all but one, and everybody then reads the winner's key.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import stat
import time

from shardfs.errors import UsageError

KEY_ENV = "SHARDFS_PEER_KEY_FILE"  # another place for the key file (tests, unusual homes)
MAX_SKEW = 30.0  # a request signed longer ago (or ahead) than this is refused: a late replay
HEADER = "Authorization"
SCHEME = "shardfs-hmac"


def key_path() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.environ.get(KEY_ENV) or os.path.join(base, "shardfs", "peer.key")


def load_or_create(path: str | None = None) -> bytes:
    """The user's peer key; made on first use. UsageError if others could read it."""
    path = path or key_path()
    try:
        return _made_or_read(path)
    except OSError as exc:  # a home we cannot write, a file we cannot read
        raise UsageError(f"peer key {path}: {exc.strerror or exc}") from None


def _made_or_read(path: str) -> bytes:
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    candidate = f"{path}.{socket.gethostname()}.{os.getpid()}.new"
    fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, secrets.token_hex(32).encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(candidate, path)  # atomic, also on NFS: one candidate wins
    except FileExistsError:
        pass
    finally:
        os.unlink(candidate)
    return _read(path)


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
            raise UsageError(f"peer key {path}: must belong to you and be readable by you only (chmod 600)")
        text = os.read(fd, 4096).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    if len(text) < 32:
        raise UsageError(f"peer key {path}: too short; remove it to make a new one (on every node sharing it)")
    return text.encode()


def _mac(key: bytes, *parts: object) -> str:
    return hmac.new(key, "\n".join(map(str, parts)).encode(), hashlib.sha256).hexdigest()


def sign_request(key: bytes, method: str, target: str, byte_range: str, now: float | None = None) -> str:
    """The Authorization header of a request."""
    ts = int(now if now is not None else time.time())
    return f"{SCHEME} ts={ts},mac={_mac(key, method, target, byte_range, ts)}"


def check_request(key: bytes, header: str | None, method: str, target: str, byte_range: str) -> str | None:
    """None if the request is signed with our key within MAX_SKEW seconds, else why not."""
    if not header or not header.startswith(SCHEME + " "):
        return "no proof of the key"
    try:
        fields = dict(part.split("=", 1) for part in header[len(SCHEME) + 1 :].split(","))
        ts, mac = int(fields["ts"]), fields["mac"]
    except (ValueError, KeyError):
        return "malformed proof"
    if abs(time.time() - ts) > MAX_SKEW:
        return "signed too long ago (or ahead): a late replay, or clocks too far apart"
    if not _same(mac, _mac(key, method, target, byte_range, ts)):
        return "wrong key"
    return None


def sign_reply(key: bytes, request_auth: str, crc: int, length: int) -> str:
    """Proof that the reply comes from a holder of the key, for this request, with this body."""
    return _mac(key, "reply", request_auth, crc, length)


def check_reply(key: bytes, request_auth: str, crc: int, length: int, proof: str | None) -> bool:
    return proof is not None and _same(proof, sign_reply(key, request_auth, crc, length))


def _same(given: str, mac: str) -> bool:
    """compare_digest on bytes: on str it raises TypeError for a non-ASCII character, which a
    header from anyone may hold (found by fuzzing; headers are read as latin-1)."""
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), mac.encode())
