"""What `shardfs pack` packs: member lists from an ImageFolder-style directory or a mapping file.

A :class:`Member` names its path inside the shards and where its bytes are (a whole
source file, or a byte range of a spool file). Member paths follow two rules:

* a directory ``SRC``: every regular file below it keeps its path relative to ``SRC``
  (packing ``/data/imagenet`` that holds ``train/<class>/x.JPEG`` gives ``train/<class>/x.JPEG``);
* a mapping file (``path label`` lines, or JSON ``{"path": label}``): ``<class>/<basename>``,
  where ``<class>`` is line ``label`` of the class list, or else the label itself (integer
  labels zero-padded to the widest one, so that ImageFolder's sorted class order is the
  label order).

``under`` puts every member below a directory (``--under train``).
"""

from __future__ import annotations

import json
import os
import re
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from shardfs.index import names
from shardfs.errors import UsageError
from shardfs.view.layouts import check_component


@dataclass(slots=True)
class Member:
    name: str  # path inside the shards, already valid (see check_name)
    size: int
    source: str  # file holding the bytes
    offset: int = -1  # -1: the whole file; otherwise the bytes [offset, offset + size) of it
    mode: int = 0o644
    mtime: int = 0

    @property
    def key(self) -> bytes:
        return self.name.encode("utf-8", "surrogateescape")


def check_name(name: str) -> str:
    """A member path exactly as the mount will serve it, or UsageError."""
    raw = name.encode("utf-8", "surrogateescape")
    try:
        if names.normalise(raw) != raw:
            raise names.BadName("is not in normal form (a/b/c)")
    except names.BadName as why:
        raise UsageError(f"member path {names.show(raw)!r} {why}") from None
    return name


def join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p.strip("/"))


def file_mode(st_mode: int) -> int:
    """0755 for anything executable, 0644 otherwise: no umask or owner quirks leak into shards."""
    return 0o755 if st_mode & 0o111 else 0o644


def _stat_all(paths: list[str]) -> list[os.stat_result]:
    """stat() every path, with threads when there are many (a shared filesystem answers slowly)."""
    def one(path):
        try:
            return os.stat(path)
        except OSError as exc:
            raise UsageError(f"{path}: cannot stat: {exc.strerror}") from None

    if len(paths) < 2000:
        return [one(p) for p in paths]
    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(one, paths, chunksize=256))


def _members(pairs: list[tuple[str, str]], mtime: int | None) -> list[Member]:
    """Members for (member path, source file) pairs, with sizes, modes and mtimes from stat."""
    out = []
    for (name, path), st in zip(pairs, _stat_all([p for _, p in pairs])):
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{path}: not a regular file")
        out.append(Member(check_name(name), st.st_size, path, -1, file_mode(st.st_mode),
                          int(st.st_mtime) if mtime is None else mtime))
    return out


def _unlistable(exc: OSError) -> None:
    raise exc  # a folder of the source that cannot be listed: one line (errors.PathError), not a smaller pack


def from_directory(root: str, under: str = "", mtime: int | None = None, exclude: str | None = None) -> list[Member]:
    """Every regular file below ``root`` (symlinks followed, loops skipped), in no set order.

    ``exclude`` is a directory not to descend into (the output directory, when it is inside root).
    """
    if not os.path.isdir(root):
        raise UsageError(f"{root}: not a directory")
    pairs, seen = [], set()
    skip = os.path.realpath(exclude) if exclude else None
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True, onerror=_unlistable):
        real = os.path.realpath(dirpath)
        if real in seen or real == skip:
            dirnames[:] = []
            continue
        seen.add(real)
        rel = os.path.relpath(dirpath, root)
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                st = os.stat(path)
            except OSError:
                continue  # a dangling symlink: nothing to pack
            if stat.S_ISREG(st.st_mode):
                pairs.append((join(under, "" if rel == "." else rel, name), path))
    return _members(pairs, mtime)


# ---- mapping files ---------------------------------------------------------

_INT = re.compile(r"[+-]?\d+")


def _label(value, where: str) -> int | str:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise UsageError(f"{where}: label {value!r} is neither an integer nor a name")
    if isinstance(value, str) and _INT.fullmatch(value.strip()):
        value = int(value)
    if isinstance(value, int) and value < 0:
        raise UsageError(f"{where}: negative label {value}")
    return value


def read_mapping(path: str) -> list[tuple[str, int | str]]:
    """(path, label) pairs of a JSON object / list of pairs, or of ``path label`` text lines."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
    if path.endswith(".json") or text.lstrip()[:1] in ("{", "["):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"{path}: not valid JSON: {exc}") from None
        items = data.items() if isinstance(data, dict) else data
        pairs = []
        for i, item in enumerate(items):
            if not (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str)):
                raise UsageError(f"{path}: entry {i} is not a path and a label")
            pairs.append((item[0], _label(item[1], f"{path}: {item[0]}")))
        return pairs
    pairs = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.rsplit(None, 1)  # the path may hold spaces; the label cannot
        if len(parts) != 2:
            raise UsageError(f"{path}:{n}: expected 'path label', got {line!r}")
        pairs.append((parts[0], _label(parts[1], f"{path}:{n}")))
    return pairs


def class_folders(labels: list[int | str], classes: list[str] | None, where: str = "") -> list[str]:
    """The folder of each label: its class name, or the label itself (integers zero-padded)."""
    if classes is not None:
        out = []
        for label in labels:
            if not isinstance(label, int) or label >= len(classes):
                raise UsageError(f"{where}label {label!r} is not a line of the class list ({len(classes)} classes)")
            out.append(classes[label])
        return out
    ints = [x for x in labels if isinstance(x, int)]
    width = len(str(max(ints))) if ints else 1
    return [f"{x:0{width}d}" if isinstance(x, int) else check_component(x, f"{where}label") for x in labels]


def from_mapping(path: str, root: str | None = None, classes: list[str] | None = None, under: str = "",
                 mtime: int | None = None) -> list[Member]:
    pairs = read_mapping(path)
    if not pairs:
        raise UsageError(f"{path}: no entries")
    root = os.path.dirname(os.path.abspath(path)) if root is None else root
    folders = class_folders([label for _, label in pairs], classes, f"{path}: ")
    named = [(join(under, folder, os.path.basename(p)), os.path.join(root, p))
             for (p, _label), folder in zip(pairs, folders)]
    return _members(named, mtime)
