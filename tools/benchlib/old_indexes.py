"""Index files moved out of the way before a timed first mount or build, removed after the timing.

Deleting them just before would slow what is timed: ext4 passes over recently freed inodes (the
last minute, more while their inode table block is dirty) when it allocates one, checking each,
so creating 2,000 index files just after 2,000 were deleted spent ~0.9 s more CPU in ext4_create
(perf: find_inode_bit) than on a dataset never indexed. Moved into a folder on the same
filesystem, their inodes stay allocated until ``clear`` removes them, after the timed runs.
"""

from __future__ import annotations

import os
import shutil

SUFFIX = ".shardfs-idx"


def set_aside(aside: str, *dirs: str) -> int:
    """Move the index files in ``dirs`` into the folder ``aside``; how many there were."""
    os.makedirs(aside, exist_ok=True)
    n = len(os.listdir(aside))
    moved = 0
    for d in dirs:
        for name in os.listdir(d) if os.path.isdir(d) else ():
            if name.endswith(SUFFIX):
                os.rename(os.path.join(d, name), os.path.join(aside, f"{n + moved}-{name}"))
                moved += 1
    return moved


def clear(aside: str) -> None:
    shutil.rmtree(aside, ignore_errors=True)
