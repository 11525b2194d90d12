"""The directory table: every listing read from the root down, into member records.

A listing is runs of entries, each run after a header naming the inode table's metadata block of
its entries' inodes; an entry is that block's offset, its type, and its name. The walk goes from
the root inode down, each directory once: a directory reached a second time (a loop, or a
directory listed under two names) refuses the image, so the walk ends whatever the bytes say.
"""

from __future__ import annotations

import struct

import numpy as np

from shardfs.formats.base import Kind, MemberRecord, ShardFormatError
from shardfs.formats.squashfs.inodes import DIR, EXTENDED, FILE, SYMLINK, Inodes

_HEAD = struct.Struct("<IIi")  # entries - 1, inode table block, base inode number
_ENTRY = struct.Struct("<HhHH")  # offset in that block, inode number - base, basic type, name size - 1
MAX_RUN = 256


def last_listing_block(inodes: Inodes) -> int:
    """The last directory table block a listing starts in."""
    return max((block for block, _, size in inodes.dirs.values() if size >= 4), default=0)


def listings_end(inodes: Inodes, dir_blocks: dict[int, int]) -> int:
    """Where the last listing ends in the directory table's bytes, its blocks up to the last
    listing's known (block position -> where its bytes begin)."""
    ends = [dir_blocks.get(block, -1 << 62) + offset + size - 3 for block, offset, size in inodes.dirs.values()
            if size >= 4]
    return max(ends, default=0)


def members(root_at: int, inodes: Inodes, data: bytes, dir_blocks: dict[int, int],
            inode_blocks: dict[int, int], file_offsets: np.ndarray) -> tuple[list[MemberRecord], list[str]]:
    """The records of every entry under the root (directories before what they hold), and the
    warnings for entries left out. ``data``: the directory table's bytes; ``*_blocks``: block
    position -> where its bytes begin; ``file_offsets``: each regular file's logical offset."""
    index = {int(at): i for i, at in enumerate(inodes.at.tolist())}
    file_index = {int(at): i for i, at in enumerate(inodes.files["at"].tolist())}
    sizes = inodes.files["size"].tolist()
    offsets = file_offsets.tolist()
    mode, mtime, types = inodes.mode.tolist(), inodes.mtime.tolist(), inodes.type.tolist()
    records: list[MemberRecord] = []
    bad_names: list[bytes] = []
    specials: list[bytes] = []
    if index.get(root_at) is None or types[index[root_at]] not in (DIR, DIR + EXTENDED):
        raise ShardFormatError("the root inode is not a directory")
    seen = {root_at}
    stack = [(root_at, b"")]
    while stack:
        at, path = stack.pop()
        for name, child in _entries(at, inodes, data, dir_blocks, inode_blocks, index, types):
            if not name or b"/" in name or b"\0" in name or name in (b".", b".."):
                bad_names.append(path + b"/" + name)  # unsquashfs refuses such names too
                continue
            full = path + b"/" + name if path else name
            i = index[child]
            t = types[i]
            t = t - EXTENDED if t > EXTENDED else t
            if t == FILE:
                f = file_index[child]
                records.append(MemberRecord(full, Kind.FILE, offsets[f], sizes[f], mode[i], float(mtime[i])))
            elif t == DIR:
                if child in seen:
                    raise ShardFormatError(f"directory {full!r} is reached twice (a loop in the directory table)")
                seen.add(child)
                records.append(MemberRecord(full, Kind.DIR, 0, 0, mode[i], float(mtime[i])))
                stack.append((child, full))
            elif t == SYMLINK:
                records.append(MemberRecord(full, Kind.SYMLINK, 0, 0, mode[i], float(mtime[i]), inodes.links[child]))
            else:
                specials.append(full)
    warnings = []
    if bad_names:
        warnings.append(f"{len(bad_names)} entries with a name that is empty, '.', '..' or holds '/' or NUL "
                        f"left out (as unsquashfs does), e.g. {bad_names[0]!r}")
    if specials:
        warnings.append(f"{len(specials)} device nodes, fifos or sockets not served, e.g. {specials[0].decode(errors='replace')}")
    return records, warnings


def _entries(at: int, inodes: Inodes, data: bytes, dir_blocks: dict[int, int], inode_blocks: dict[int, int],
             index: dict[int, int], types: list[int]):
    """(name, inode position) of each entry of the directory at ``at``."""
    block, offset, size = inodes.dirs[at]
    if size < 4:
        return  # empty: no listing
    begin = dir_blocks.get(block)
    if begin is None:
        raise ShardFormatError(f"directory inode at {at}: its listing block {block} is no block start")
    pos, end = begin + offset, begin + offset + size - 3
    if end > len(data):
        raise ShardFormatError(f"directory inode at {at}: its listing passes the directory table's end")
    head, entry = _HEAD.unpack_from, _ENTRY.unpack_from
    try:
        while pos < end:
            count, start, _base = head(data, pos)
            pos += 12
            base = inode_blocks.get(start)
            if count >= MAX_RUN or base is None:
                raise ShardFormatError(f"directory at {at}: a bad listing header")
            for _ in range(count + 1):
                off, _delta, t, name_size = entry(data, pos)
                name = data[pos + 8 : pos + 9 + name_size]
                pos += 9 + name_size
                child = base + off
                i = index.get(child)
                if i is None or (types[i] - EXTENDED if types[i] > EXTENDED else types[i]) != t or pos > end:
                    raise ShardFormatError(f"directory at {at}: entry {name!r} names no inode of its type")
                yield name, child
    except struct.error:
        raise ShardFormatError(f"directory at {at}: its listing is cut short") from None
