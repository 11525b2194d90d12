"""Memory that storage reads land in: anonymous mappings on huge pages, so that direct reads
reach the storage as few large requests.

A direct (O_DIRECT) read is sent to the device as requests of at most ``max_segments`` pieces of
physically contiguous memory each. Into ordinary 4 KiB pages that is 128 x 4 KiB = 512 KiB per
request on a loop device or a virtio disk, whatever the size of the read; into a huge page
(2 MiB, contiguous) a request reaches the device's size limit (1.25 MiB here). Storage that
counts requests (an IOPS cap: 200 IOPS x 512 KiB = 105 MB/s under a 150 MB/s cap, measured with
tools/bench_tier.py) then gives its full bandwidth. Huge pages also mean one page fault per
2 MiB instead of 512. Where the kernel gives none (``transparent_hugepage`` set to never, or
memory too fragmented) the mapping is made of ordinary pages: slower requests, same bytes.
"""

from __future__ import annotations

import contextlib
import mmap
import threading

HUGE = 2 << 20  # x86-64 and arm64 (4 KiB base pages): the size the kernel aligns large mappings to


def footprint(size: int) -> int:
    """The bytes ``anonymous(size)`` maps: whole huge pages from half a huge page up (a smaller
    mapping gets none, and a 1 MiB read into it reaches storage as two requests), else whole pages."""
    unit = HUGE if size >= HUGE // 2 else mmap.PAGESIZE
    return max(-(-size // unit) * unit, mmap.PAGESIZE)


def anonymous(size: int) -> mmap.mmap:
    """A private anonymous mapping of ``footprint(size)`` bytes, asking for huge pages (the kernel
    aligns mappings of whole huge pages to them)."""
    buf = mmap.mmap(-1, footprint(size),
                    flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError, AttributeError):  # no THP in this kernel: ordinary pages
        buf.madvise(mmap.MADV_HUGEPAGE)
    return buf


class BufferPool:
    """Reusable buffers of one size for reads that pass through memory on their way elsewhere
    (storage to the disk tier). Reused, so their pages are faulted in (and zeroed, and on a VM
    with free page reporting fetched from the host) once, not at every read; at most ``keep``
    are kept between reads."""

    def __init__(self, size: int, keep: int):
        self.size = -(-size // HUGE) * HUGE  # whole huge pages
        self.keep = keep
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def buffer(self):
        with self._lock:
            buf = self._free.pop() if self._free else None
        if buf is None:
            buf = anonymous(self.size)
        view = memoryview(buf)
        try:
            yield view
        finally:
            try:
                view.release()
            except BufferError:  # a slice outlived the block (held by a traceback): let it go with it
                return
            with self._lock:
                if len(self._free) < self.keep:
                    self._free.append(buf)
                    buf = None
            if buf is not None:
                buf.close()

    def close(self) -> None:
        with self._lock:
            free, self._free = self._free, []
        for buf in free:
            buf.close()
