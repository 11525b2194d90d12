"""`shardfs ls`: the merged tree of a set of shards, listed without mounting.

Short form: one name per line, sorted by bytes, like ``ls -1``. Long form (``-l``):
``mode  size  mtime  shard  name`` (directories show the size a mount shows, 4096, and
``-`` for the shard; symlinks ``name -> target``). ``-R`` lists every directory below
PATH, each under a ``path:`` header, as ``ls -R`` does.
"""

from __future__ import annotations

import os
import stat
import time

from shardfs.index import names
from shardfs.errors import UsageError
from shardfs.formats.base import Kind
from shardfs.view.tree import Tree

DIR_SIZE = 4096  # what the mount reports for a directory


def _resolve(tree: Tree, path: str) -> tuple[int, bytes]:
    raw = os.fsencode(path).strip(b"/")
    if raw in (b"", b"."):
        return 1, b""
    try:
        raw = names.normalise(raw)
    except names.BadName as why:
        raise UsageError(f"{path}: not a path in the dataset ({why})") from None
    ino = tree.lookup(raw)
    if not ino:
        raise UsageError(f"{path}: no such file or directory in the dataset")
    return ino, raw


def _entries(tree: Tree, ino: int) -> list[tuple[bytes, int]]:
    """(name, inode) of the entries of directory ino, sorted by name."""
    subdirs, files = tree.children(ino)
    out = [(names.basename_of(tree.dirs[d].path), d + 1) for d in subdirs]
    out += [(names.basename_of(tree.name(m)), tree.ndirs + 1 + m) for m in files.tolist()]
    return sorted(out)


def _row(tree: Tree, ino: int, shown: bytes) -> tuple[str, str, str, str, str]:
    if tree.is_dir(ino):
        d = tree.dirs[ino - 1]
        return (stat.filemode(stat.S_IFDIR | d.mode), str(DIR_SIZE), _when(d.mtime), "-", names.show(shown))
    m = tree.member(ino)
    name = names.show(shown)
    if tree.kind[m] == Kind.SYMLINK:
        kind = stat.S_IFLNK
        name += " -> " + names.show(tree.symlinks.get(m, b""))
    else:
        kind = stat.S_IFREG
    return (stat.filemode(kind | int(tree.mode[m])), str(int(tree.size[m])), _when(float(tree.mtime[m])),
            tree.shard_names[int(tree.shard[m])], name)


def _when(mtime: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(mtime))


def _print_rows(rows, long: bool, out) -> None:
    if not long:
        for row in rows:
            out(row[-1])
        return
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(4)]
    for r in rows:
        out(f"{r[0]}  {r[1]:>{widths[1]}}  {r[2]}  {r[3]:<{widths[3]}}  {r[4]}")


def list_path(tree: Tree, path: str = "", long: bool = False, recursive: bool = False, out=print) -> None:
    ino, raw = _resolve(tree, path)
    if not tree.is_dir(ino):
        _print_rows([_row(tree, ino, raw)], long, out)
        return
    if not recursive:
        _print_rows([_row(tree, i, n) for n, i in _entries(tree, ino)], long, out)
        return
    todo = [(ino, path.strip("/") or ".")]
    first = True
    while todo:
        ino, shown = todo.pop()
        entries = _entries(tree, ino)
        if not first:
            out("")
        first = False
        out(f"{shown}:")
        _print_rows([_row(tree, i, n) for n, i in entries], long, out)
        below = [(i, f"{shown}/{names.show(n)}" if shown != "." else names.show(n)) for n, i in entries
                 if tree.is_dir(i)]
        todo.extend(reversed(below))  # depth first, in name order
