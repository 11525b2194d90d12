"""A real FUSE filesystem that serves a directory read-only and fails reads on purpose.

    python faultyfs.py SRC MOUNTPOINT NAME START END [HANG_WHILE]

Reads of file NAME that overlap bytes [START, END) answer EIO; everything else passes
through. Storage that fails like a bad disk or a flaky network filesystem, for tests.
With HANG_WHILE (a file name), those reads instead block for as long as that file exists,
as on a hung network mount, and pass through once it is removed; HANG_WHILE.held then says how
many reads are blocked now, and a read that blocks creates HANG_WHILE.blocked first (tests wait
for those states, not for time to pass).
"""

import errno
import os
import stat
import sys
import threading
import time

os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")
import mfusepy as fuse  # noqa: E402


class FaultyFS(fuse.Operations):
    use_ns = True

    def __init__(self, root: str, name: str, start: int, end: int, hang_while: str | None = None):
        self.root, self.name, self.start, self.end, self.hang_while = root, name, start, end, hang_while
        self.held, self._lock = 0, threading.Lock()

    def _hold(self, n: int) -> None:
        with self._lock:
            self.held += n
            with open(f"{self.hang_while}.held.tmp", "w") as f:
                f.write(str(self.held))
            os.rename(f"{self.hang_while}.held.tmp", f"{self.hang_while}.held")

    def _real(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def getattr(self, path, fh=None):
        try:
            st = os.lstat(self._real(path))
        except FileNotFoundError:
            raise fuse.FuseOSError(errno.ENOENT) from None
        attrs = {key: getattr(st, key) for key in ("st_mode", "st_size", "st_nlink", "st_uid", "st_gid")}
        attrs["st_mtime"] = st.st_mtime_ns
        return attrs

    def readdir(self, path, fh):
        return [".", "..", *os.listdir(self._real(path))]

    def read(self, path, size, offset, fh):
        if path.lstrip("/") == self.name and offset < self.end and offset + size > self.start:
            if self.hang_while is None:
                raise fuse.FuseOSError(errno.EIO)
            if os.path.exists(self.hang_while):
                open(self.hang_while + ".blocked", "a").close()
            self._hold(1)
            try:
                while os.path.exists(self.hang_while):
                    time.sleep(0.05)
            finally:
                self._hold(-1)
        with open(self._real(path), "rb") as f:
            f.seek(offset)
            return f.read(size)


if __name__ == "__main__":
    src, mnt, name, start, end = sys.argv[1:6]
    assert stat.S_ISDIR(os.stat(src).st_mode)
    fs = FaultyFS(src, name, int(start), int(end), sys.argv[6] if len(sys.argv) > 6 else None)
    fuse.FUSE(fs, mnt, foreground=True, ro=True, direct_io=True)
