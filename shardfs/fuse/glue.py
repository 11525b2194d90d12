"""mfusepy, adapted where its generic path costs the hot path: not a translation layer but
overrides of mfusepy's own ``FUSE`` methods (``_wrapper``, ``read``, ``readdir_fuse_3``), so
the mfusepy version is pinned to the one tested (pyproject.toml)."""

from __future__ import annotations

import ctypes
import threading

from shardfs.fuse.lib import load as load_fuse

fuse = load_fuse()

FILL_DIR_PLUS = 2  # libfuse3's FUSE_FILL_DIR_PLUS
READDIR_PLUS = 1  # libfuse3's FUSE_READDIR_PLUS


_thread_state = threading.local()


def _keep_thread_state() -> None:
    """Keep this libfuse worker thread's Python thread state between requests.

    ctypes enters a callback from a foreign thread with PyGILState_Ensure and leaves with
    PyGILState_Release, which creates and destroys a thread state every time (an mmap and
    munmap plus setup, measured as ~7% of the daemon's CPU in a cold epoch). One extra
    Ensure, never released, keeps the count above zero, so the state lives as long as the
    thread; libfuse keeps its workers, so only a handful are ever made."""
    ctypes.pythonapi.PyGILState_Ensure()
    _thread_state.kept = True


class PlusFUSE(fuse.FUSE):
    """mfusepy's FUSE, with readdirplus. mfusepy hands libfuse only each entry's mode and
    inode, without offsets, and libfuse then sends the kernel no attributes. Here every entry
    goes with its full attributes, its offset and FUSE_FILL_DIR_PLUS, so a listing (ImageFolder's
    scan) also fills the kernel's entry and attribute caches: opening a file later costs no
    LOOKUP, one FUSE request per file instead of two."""

    def _wrapper(self, func, *args, **kwargs):
        if not getattr(_thread_state, "kept", False):
            _keep_thread_state()
        return super()._wrapper(func, *args, **kwargs)

    def read(self, path, buf, size, offset, fip) -> int:
        # As mfusepy's, but a memoryview of the RAM cache is copied straight into libfuse's
        # buffer: no bytes object in between (one copy of every byte served saved).
        data = self.operations.read(path, size, offset, None)
        n = len(data)
        if n > size:
            raise RuntimeError(f"read returned {n} bytes, more than the {size} asked for")
        if n:
            src = ctypes.addressof(ctypes.c_char.from_buffer(data)) if isinstance(data, memoryview) else data
            ctypes.memmove(buf, src, n)
        return n

    def getattr_fuse_3(self, path, buf, fip) -> int:
        self.operations.stat_into(path, buf.contents)
        return 0

    def readdir_fuse_3(self, path, buf, filler, offset, fip, flags) -> int:
        plus = FILL_DIR_PLUS if flags & READDIR_PLUS else 0
        st = fuse.c_stat()
        entries = self.operations.listing(path.decode(self.encoding, self.errors))
        for index in range(offset, len(entries)):
            name = entries.entry_into(index, st)
            if filler(buf, name, st, index + 1, plus) != 0:
                break  # the kernel's buffer is full: it asks again from this offset
        return 0
