"""What the compiled tar scanner (``_tarscan.c``) gives: plain members as columns, not a record
each. The scan turns them into records where a shard needs the general path (index/replay.py);
a shard whose members are all plain is indexed from the columns as they are (index/plain.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from shardfs.formats.base import Kind, MemberRecord

# One row of int64 per member, as _tarscan.c lays it out: where its name, link target and kept
# data end in the blobs; where its normal form (names.normalise) lies in its name, and that
# form's shard_index.path_hash (its bits: view as uint64); the rest; where its parent folder ends
# in the name (NOT_NORMAL: the root) and that folder's path_hash (of b"" for the root).
(NAME_END, NORM_START, NORM_END, KIND, OFFSET, SIZE, MODE, MTIME, LINK_END, SMALL_END, HASH, PARENT_END,
 PARENT_HASH) = range(13)
NFIELDS = 13
NOT_NORMAL, ROOT = -1, -2  # NORM_START of a name to normalise in Python; of "./" and its kin
_KINDS = tuple(Kind)


@dataclass
class MemberColumns:
    names: bytes  # every name, back to back (a ustar prefix joined)
    rows: np.ndarray  # (members, NFIELDS) int64
    links: bytes  # link targets, back to back
    smalls: bytes  # the data of files of at most formats.base.SMALL_DATA bytes (SMALL_END: -1 for others)
    above: bytes  # path hashes (uint64) of the folders above the parents, each at least once

    @classmethod
    def of(cls, names: bytes, numbers: bytes, links: bytes, smalls: bytes, above: bytes) -> MemberColumns:
        return cls(names, np.frombuffer(numbers, np.int64).reshape(-1, NFIELDS), links, smalls, above)

    @classmethod
    def join(cls, parts: list[MemberColumns]) -> MemberColumns:
        """One batch of several, in order (each batch's ends count from its own blobs)."""
        if len(parts) == 1:
            return parts[0]
        rows = []
        names = links = smalls = 0
        for part in parts:
            shifted = part.rows.copy()
            shifted[:, NAME_END] += names
            shifted[:, LINK_END] += links
            shifted[:, SMALL_END] += np.where(shifted[:, SMALL_END] >= 0, smalls, 0)
            rows.append(shifted)
            names, links, smalls = names + len(part.names), links + len(part.links), smalls + len(part.smalls)
        return cls(b"".join(p.names for p in parts), np.concatenate(rows), b"".join(p.links for p in parts),
                   b"".join(p.smalls for p in parts), b"".join(p.above for p in parts))

    def __len__(self) -> int:
        return len(self.rows)

    def records(self) -> Iterator[MemberRecord]:
        names, links, smalls = self.names, self.links, self.smalls
        name_at = link_at = small_at = 0
        for name_end, _, _, kind, offset, size, mode, mtime, link_end, small_end, *_ in self.rows.tolist():
            small = None
            if small_end >= 0:
                small, small_at = smalls[small_at:small_end], small_end
            yield MemberRecord(names[name_at:name_end], _KINDS[kind], offset, size, mode, float(mtime),
                               links[link_at:link_end], small)
            name_at, link_at = name_end, link_end
