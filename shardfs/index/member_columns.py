"""The member tables of many shards' indexes in one set of arrays, filled as the index files are
read: what a remount loads goes where the merged tree keeps it, read once.

On this machine kind the first touch of memory the process never had costs more than the work
done in it (measured: 0.4 s to fill 256 MB the first time, 0.015 s again): a remount that read
each index into a buffer of its own and then concatenated them into the tree's arrays touched
each member's bytes twice. Here each index's body is read into one reused buffer and its member
columns copied into place; the tree takes these arrays over when they hold exactly its shards,
in its order (``MemberColumns.covers``), else it concatenates as before.

The arrays are reserved for an upper bound of the members (an index file holds at least
``MIN_BYTES_PER_MEMBER`` bytes per member): pages never written cost nothing.
"""

from __future__ import annotations

import numpy as np

# The per-member columns of an index (index_file.ARRAYS[:8]) and their types.
COLUMNS = (("name_end", np.int64), ("kind", np.uint8), ("offset", np.int64), ("size", np.int64),
           ("mode", np.uint16), ("mtime", np.float64), ("hash", np.uint64), ("parent", np.uint32))
MIN_BYTES_PER_MEMBER = sum(np.dtype(t).itemsize for _, t in COLUMNS)


class MemberColumns:
    def __init__(self, index_bytes: int):
        """``index_bytes``: the total size of the index files to be read (a bound of their members)."""
        self.capacity = index_bytes // MIN_BYTES_PER_MEMBER + 1
        self.arrays = {name: np.empty(self.capacity, dtype) for name, dtype in COLUMNS}
        self.used = 0
        self._scratch = np.empty(0, np.uint8)

    def scratch(self, size: int) -> np.ndarray:
        """A buffer for one index file's body, reused from one file to the next."""
        if len(self._scratch) < size:
            self._scratch = np.empty(max(size, 2 * len(self._scratch)), np.uint8)
        return self._scratch[:size]

    def take(self, arrays: dict[str, np.ndarray]) -> bool:
        """Copy one index's member columns in after the last ones and point ``arrays`` at the copies;
        False (``arrays`` untouched) if they do not fit or do not have the columns' types."""
        n = len(arrays["kind"])
        if self.used + n > self.capacity or any(arrays[name].dtype != dtype for name, dtype in COLUMNS):
            return False
        start, self.used = self.used, self.used + n
        for name, _ in COLUMNS:
            place = self.arrays[name][start:self.used]
            place[:] = arrays[name]
            arrays[name] = place
        return True

    def covers(self, indexes) -> bool:
        """Whether the indexes' member columns are these arrays' rows, one after another from the
        first, and all of them (then the tree can take the arrays as they are)."""
        at = 0
        for ix in indexes:
            for name, _ in COLUMNS:
                column = getattr(ix, name)
                if column.base is not self.arrays[name] or self._row(name, column) != at:
                    return False
            at += len(ix)
        return at == self.used

    def _row(self, name: str, view: np.ndarray) -> int:
        whole = self.arrays[name]
        return (view.ctypes.data - whole.ctypes.data) // whole.itemsize

    def column(self, name: str) -> np.ndarray:
        return self.arrays[name][:self.used]
