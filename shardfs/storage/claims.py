"""Chunk states the RAM cache and the disk tier share, and the claim of a run of missing chunks
that their background loads (RAM) and fills (disk) both make before one storage request."""

from __future__ import annotations

MISSING, CLAIMED = 0, 1  # not there and nobody reading it; being read by whoever claimed it


def claim_run(state: bytearray, start: int, most: int) -> tuple[int, int] | None:
    """The first MISSING chunk at or after ``start`` and up to ``most - 1`` MISSING ones right after
    it, marked CLAIMED: (first, count); None when no chunk from ``start`` on is missing. The caller
    holds the lock that guards ``state``."""
    first = state.find(MISSING, start)
    if first < 0:
        return None
    count = 1
    while count < most and first + count < len(state) and state[first + count] == MISSING:
        count += 1
    state[first : first + count] = bytes([CLAIMED]) * count
    return first, count
