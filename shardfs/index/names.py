"""Member names: normalise them and refuse the ones that must never be served."""

from __future__ import annotations

import numpy as np
from xxhash import xxh64_intdigest

from shardfs.errors import ShardfsError

MAX_NAME = 255  # NAME_MAX of Linux: a longer component cannot be looked up anyway
MAX_PATH = 4095
_SLASH, _DOT_SLASH = ord("/"), b"./"


class BadName(ShardfsError, ValueError):
    pass


def normalise(raw: bytes) -> bytes:
    """``./a//b/`` -> ``a/b``, ``/abs/x`` -> ``abs/x`` (GNU tar and bsdtar strip the leading
    slashes too); raises BadName for names that would escape or break the tree.

    Names stay bytes end to end: a non-UTF-8 name is served as the same bytes
    (mfusepy decodes with surrogateescape), never mangled.
    """
    if (raw and len(raw) <= MAX_NAME and raw[0] not in _DOT_SLASH and raw[-1] != _SLASH and b"//" not in raw
            and b"/." not in raw and b"\0" not in raw):
        return raw  # normal already (most names): the checks below would find nothing
    if b"\0" in raw:
        raise BadName("contains a NUL byte")
    parts = [p for p in raw.split(b"/") if p not in (b"", b".")]
    if any(p == b".." for p in parts):
        raise BadName("climbs out of the tree (..)")
    if not parts:
        raise BadName("is empty")
    if any(len(p) > MAX_NAME for p in parts):
        raise BadName(f"has a component longer than {MAX_NAME} bytes")
    path = b"/".join(parts)
    if len(path) > MAX_PATH:
        raise BadName(f"is longer than {MAX_PATH} bytes")
    return path


def resolve_dots(raw: bytes) -> bytes | None:
    """A name with ``..`` components resolved as the path they lead to (``folder/../ufo`` ->
    ``ufo``, ``a/b/../c`` -> ``a/c``), as Python's tarfile ``data`` filter places them; None for a
    name that resolves outside the tree (``../x``, ``a/../../x``, ``/../x``), which is never served.
    Leading slashes are stripped first, as for every name (normalise). Resolved by the name alone:
    a link of the archive on its way does not change where it leads (replay.py places a member
    under a link to a folder of the archive, never outside)."""
    parts: list[bytes] = []
    for part in raw.split(b"/"):
        if part == b"..":
            if not parts:
                return None
            parts.pop()
        elif part not in (b"", b"."):
            parts.append(part)
    return b"/".join(parts)


def path_hash(path: bytes) -> int:
    """Stable 64-bit hash of a member path (persisted, so not Python's ``hash``): XXH64, which
    _tarscan.c computes too, for each name it scans."""
    return xxh64_intdigest(path)


def path_hashes(paths: list[bytes]) -> np.ndarray:
    """path_hash of each, at once."""
    return np.fromiter(map(xxh64_intdigest, paths), np.uint64, len(paths))


def show(name: bytes) -> str:
    """A name for a log line: printable, never raises."""
    return name.decode("utf-8", "backslashreplace")


def parent_of(path: bytes) -> bytes:
    cut = path.rfind(b"/")
    return b"" if cut < 0 else path[:cut]


def basename_of(path: bytes) -> bytes:
    return path[path.rfind(b"/") + 1 :]
