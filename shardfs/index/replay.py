"""A shard's members replayed in archive order as `tar -x` extracts them: which member each path
ends as.

A later member of a name replaces an earlier one (an updated file, `tar -r`; a file turned into a
link or a folder; an empty folder turned into a file). A member under a link to a folder of the
archive lands in that folder, as tar writes it through the link. What tar -x cannot do is left
out with a warning, as tar leaves it out: a member under a file ("Not a directory") or under a
link that leads nowhere in the archive, and a file or link where a folder with something in it is
("File exists").
"""

from __future__ import annotations

import math
from typing import Callable

from shardfs.formats.base import Kind, MemberRecord
from shardfs.index.names import BadName, normalise, parent_of, resolve_dots, show

MAX_MTIME = 253402300799  # 9999-12-31T23:59:59
_DIR, _HARDLINK, _SYMLINK = Kind.DIR, Kind.HARDLINK, Kind.SYMLINK


def extracted(records: list[MemberRecord], cut: bytes | None, warn: Callable[[str], None]) -> list[MemberRecord]:
    """The members a shard ends as, in archive order, names normalised; ``cut``: the name of a
    member the end of the shard cuts short (formats.base.ScanResult.cut)."""
    state = Replay(warn)
    kept, dirs, full = state.kept, state.dirs, state.full
    dots = Dots()
    for rec in records:
        try:
            path = normalise(rec.path)
        except BadName as why:
            if rec.kind == _DIR and not rec.path.strip(b"./"):
                continue  # "./": the root itself, as `tar -C dir .` writes it
            path = dots.resolved(rec.path, rec.kind == _DIR)
            if path is None:
                warn(f"member {show(rec.path)} refused: name {why}")
                continue
            if not path:
                continue  # not served: named in the line of dots
        kind = rec.kind
        if kind == _HARDLINK:
            target = kept.get(_target_name(rec.link))
            if target is None or target.kind == _DIR:
                warn(f"hard link {show(path)} -> {show(rec.link)}: target missing")
                continue
            rec.kind, rec.offset, rec.size, rec.link, rec.small, rec.sparse = (
                target.kind, target.offset, target.size, target.link, target.small, target.sparse)
            kind = rec.kind
        if not math.isfinite(rec.mtime) or abs(rec.mtime) > MAX_MTIME:
            rec.mtime = 0.0  # "inf", "nan" or past year 9999: not worth refusing the member for
        if kind == _SYMLINK:
            rec.size = len(rec.link)  # what lstat reports for a link, whatever the format stored
        slash = path.rfind(b"/")  # the common case inline: a new file in a folder made already
        parent = path[:slash] if slash > 0 else b""
        if kind != _DIR and parent in dirs and path not in dirs and path not in kept:
            full.add(parent)
            rec.path = path
            kept[path] = rec
        else:
            state.add(path, rec)
    if cut is not None:  # tar -x writes part of it over an earlier file of that name
        cut = _target_name(cut)
        if cut is not None and state.cut(cut):
            warn(f"member {show(cut)}: a later member of this name is cut short; neither is served")
    dots.report(warn)
    return list(kept.values())


def _target_name(raw: bytes) -> bytes | None:
    """A hard link's target (or a cut member's name) as the tree names it, or None if it has none."""
    resolved = resolve_dots(raw)
    try:
        return None if resolved is None else normalise(resolved)
    except BadName:
        return None


class Dots:
    """Names with a ``..`` component: served at the path they resolve to inside the tree
    (``folder/../ufo`` as ``ufo``), as Python's tarfile ``data`` filter extracts them; never a
    name that resolves outside it (``../x``, ``a/../../x``), nor a file that resolves to the top
    (``q/..``). (GNU tar >= 1.29 extracts none of them, CVE-2016-6321.) One log line per shard,
    not one per member."""

    SHOWN = 3

    def __init__(self):
        self.served: list[tuple[bytes, bytes]] = []  # (name in the archive, name served)
        self.outside: list[bytes] = []
        self.top: list[bytes] = []

    def resolved(self, raw: bytes, is_dir: bool) -> bytes | None:
        """The name to serve ``raw`` under; b"" if it is not served (counted here); None if it has
        no ``..`` (refused for another reason)."""
        if b".." not in raw.split(b"/"):
            return None
        path = resolve_dots(raw)
        if path is None:
            self.outside.append(raw)
            return b""
        try:
            path = normalise(path)
        except BadName:  # the top itself ("q/.."), or too long, or a NUL byte
            if not is_dir:  # a folder resolving to the top is the top: nothing to say
                self.top.append(raw)
            return b""
        self.served.append((raw, path))
        return path

    def report(self, warn: Callable[[str], None]) -> None:
        def some(items) -> str:
            return ", ".join(items[: self.SHOWN]) + (" ..." if len(items) > self.SHOWN else "")

        parts = []
        if self.served:
            parts.append(f"{len(self.served)} served at the path they resolve to "
                         f"({some([f'{show(raw)} as {show(path)}' for raw, path in self.served])})")
        if self.outside:
            parts.append(f"{len(self.outside)} refused: they resolve outside the tree "
                         f"({some([show(raw) for raw in self.outside])})")
        if self.top:
            parts.append(f"{len(self.top)} files left out: they resolve to the top of the tree "
                         f"({some([show(raw) for raw in self.top])})")
        if parts:
            warn("member names with '..': " + "; ".join(parts))


class Replay:
    """What extraction has made so far; ``add`` takes the next member (any case)."""

    def __init__(self, warn: Callable[[str], None]):
        self.kept: dict[bytes, MemberRecord] = {}  # path -> the member it ends as, in archive order
        self.dirs: set[bytes] = {b""}  # folders: explicit members, and those made for a member under them
        self.full: set[bytes] = set()  # folders with something in them
        self.warn = warn

    def add(self, path: bytes, rec: MemberRecord, links: int = 0) -> None:
        parent = parent_of(path)
        dirs, kept = self.dirs, self.kept
        if parent not in dirs:
            through = self._make_folders(path, parent)
            if through is None:
                return
            if through != path:  # under a link to a folder: written there
                if links >= MAX_LINKS:
                    self.warn(f"member {show(path)}: too many links on its way: not served")
                    return
                self.add(through, rec, links + 1)
                return
        if rec.kind == Kind.DIR:
            dirs.add(path)
        elif path in dirs:
            if path in self.full:
                self.warn(f"member {show(path)}: a folder with files is there, which tar -x does not replace: "
                          "not served")
                return
            dirs.discard(path)
        if path in kept:
            self.warn(f"member {show(path)} appears twice; the later one is served")
            del kept[path]  # keep insertion order = position of the later member
        self.full.add(parent)
        rec.path = path
        kept[path] = rec

    def cut(self, path: bytes) -> bool:
        """The member of ``path`` that a cut-short one would overwrite leaves; True if there was one."""
        found = self.kept.get(path)
        if found is None or found.kind == Kind.DIR:
            return False
        del self.kept[path]
        return True

    def _make_folders(self, path: bytes, parent: bytes) -> bytes | None:
        """Make the folders above ``path`` as tar -x does (top down): ``path``, or where it goes
        through a link to a folder, or None if tar cannot put it anywhere (said why)."""
        missing = []
        while parent not in self.dirs:
            missing.append(parent)
            parent = parent_of(parent)
        for folder in reversed(missing):
            there = self.kept.get(folder)  # not a folder (those are in self.dirs): a file or a link
            if there is not None and there.kind == Kind.SYMLINK:
                target = _link_target(folder, there.link)
                if target is not None and (target in self.dirs or target in self.kept):
                    return target + path[len(folder) :]
                why = "a link to no folder of the archive (or one tar -x makes only at its end)"
            elif there is not None:
                why = "a file (tar -x cannot make a folder of it)"
            else:
                self.full.add(parent_of(folder))
                self.dirs.add(folder)
                continue
            self.warn(f"member {show(path)}: {show(folder)} is {why}: not served")
            return None
        return path


MAX_LINKS = 40  # links followed on one member's way, as the kernel's ELOOP bound


def _link_target(link: bytes, target: bytes) -> bytes | None:
    """The folder of the tree a link at path ``link`` stands for while tar -x extracts, or None:
    GNU tar makes a link whose target is absolute or climbs with ``..`` only at the end (a
    placeholder file until then), so nothing is written through it."""
    parts = target.split(b"/")
    if target.startswith(b"/") or b".." in parts:
        return None
    within = [p for p in parent_of(link).split(b"/") + parts if p not in (b"", b".")]
    return b"/".join(within) or None
