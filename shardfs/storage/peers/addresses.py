"""The peer list: ``HOST:PORT`` entries, checked, and which of them is this node."""

from __future__ import annotations

import socket

from shardfs.errors import UsageError


def split(entry: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port); UsageError naming the entry otherwise."""
    host, sep, port = entry.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"peer {entry!r}: expected HOST:PORT with a port from 1 to 65535")
    if host.startswith("@"):  # a list starting so would be read as "@FILE" once joined for the daemon
        raise UsageError(f"peer {entry!r}: a host does not start with '@' "
                         "(\"@FILE\" names a peers file, in place of a list)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise UsageError(f"peer {entry!r}: write an IPv6 address in brackets, [ADDR]:PORT")
    return host, int(port)


def parse_list(text: str) -> list[str] | None:
    """``a:1,b:2``, ``@FILE`` (one per line, # comments) or ``off``: the entries, [] for off."""
    text = text.strip()
    if text == "off":
        return []
    if text.startswith("@"):
        try:
            with open(text[1:]) as f:
                lines = [line.split("#", 1)[0].strip() for line in f]
        except OSError as exc:
            raise UsageError(f"peers file {text[1:]}: {exc.strerror}") from None
        return check([line for line in lines if line])
    return check([entry.strip() for entry in text.split(",") if entry.strip()])


def check(peers: list[str]) -> list[str]:
    seen = set()
    for entry in peers:
        host, port = split(entry)
        if (host.lower(), port) in seen:
            raise UsageError(f"peer {entry!r} is listed twice")
        seen.add((host.lower(), port))
    return peers


def _is_local(host: str) -> bool:
    """Whether ``host`` resolves to an address of this machine (one we can bind to)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):  # UnicodeError: a label over 63 characters (idna; found by fuzzing)
        return False
    for family, _, _, _, addr in infos:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((addr[0], 0))
                return True
            except OSError:
                continue
    return False


def pick_self(peers: list[str], given: str | None) -> str:
    """This node's entry: ``given`` (which must be listed), else the one whose host is this
    machine's name, else the one whose host is one of its addresses (exactly one)."""
    if given is not None:
        host, port = split(given)
        for entry in peers:
            if split(entry) == (host, port) or entry == given:
                return entry
        raise UsageError(f"peer_self {given!r} is not among the peers ({', '.join(peers)})")
    names = {socket.gethostname().lower(), socket.getfqdn().lower(), socket.gethostname().split(".")[0].lower()}
    found = [entry for entry in peers if split(entry)[0].lower() in names]
    if not found:
        found = [entry for entry in peers if _is_local(split(entry)[0])]
    if len(found) != 1:
        why = "none of the peers is" if not found else f"{len(found)} peers ({', '.join(found)}) are"
        raise UsageError(f"{why} this machine ({socket.gethostname()}): name this node's entry with --peer-self")
    return found[0]
