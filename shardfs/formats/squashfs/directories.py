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
    at = inodes.at.tolist()
    index = dict(zip(at, range(len(at))))  # inode position -> inode number in table order
    basic = np.where(inodes.type > EXTENDED, inodes.type - EXTENDED, inodes.type).tolist()
    file_no = np.full(len(at), -1, np.int64)
    file_no[np.searchsorted(inodes.at, inodes.files["at"])] = np.arange(len(inodes.files))
    file_no = file_no.tolist()
    sizes, offsets = inodes.files["size"].tolist(), file_offsets.tolist()
    mode, mtime = inodes.mode.tolist(), inodes.mtime.astype(np.float64).tolist()
    records: list[MemberRecord] = []
    add = records.append
    bad_names: list[bytes] = []
    specials: list[bytes] = []
    root = index.get(root_at)
    if root is None or basic[root] != DIR:
        raise ShardFormatError("the root inode is not a directory")
    seen = {root}
    stack = [(root, b"")]
    while stack:
        i_dir, path = stack.pop()
        prefix = path + b"/" if path else b""
        for name, i in _entries(at[i_dir], inodes, data, dir_blocks, inode_blocks, index, basic):
            if b"/" in name or b"\0" in name or name == b"." or name == b"..":
                bad_names.append(prefix + name)  # unsquashfs refuses such names too
                continue
            full = prefix + name
            t = basic[i]
            if t == FILE:
                f = file_no[i]
                add(MemberRecord(full, Kind.FILE, offsets[f], sizes[f], mode[i], mtime[i]))
            elif t == DIR:
                if i in seen:
                    raise ShardFormatError(f"directory {full!r} is reached twice (a loop in the directory table)")
                seen.add(i)
                add(MemberRecord(full, Kind.DIR, 0, 0, mode[i], mtime[i]))
                stack.append((i, full))
            elif t == SYMLINK:
                add(MemberRecord(full, Kind.SYMLINK, 0, 0, mode[i], mtime[i], inodes.links[at[i]]))
            else:
                specials.append(full)
    warnings = []
    if bad_names:
        warnings.append(f"{len(bad_names)} entries with a name that is '.', '..' or holds '/' or NUL "
                        f"left out (as unsquashfs does), e.g. {bad_names[0]!r}")
    if specials:
        warnings.append(f"{len(specials)} device nodes, fifos or sockets not served, e.g. "
                        f"{specials[0].decode(errors='replace')}")
    return records, warnings


def _entries(at: int, inodes: Inodes, data: bytes, dir_blocks: dict[int, int], inode_blocks: dict[int, int],
             index: dict[int, int], basic: list[int]):
    """(name, inode number in table order) of each entry of the directory at ``at``."""
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
                name = data[pos + 8 : pos + 9 + name_size]  # never empty: the size is stored less one
                pos += 9 + name_size
                i = index.get(base + off)
                if i is None or basic[i] != t or pos > end:
                    raise ShardFormatError(f"directory at {at}: entry {name!r} names no inode of its type")
                yield name, i
    except struct.error:
        raise ShardFormatError(f"directory at {at}: its listing is cut short") from None
