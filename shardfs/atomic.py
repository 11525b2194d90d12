"""Write a file under its final name only once it is complete (temp file + rename)."""

from __future__ import annotations

import contextlib
import os
import tempfile


@contextlib.contextmanager
def atomic_file(path: str, mode: str = "wb"):
    """Yield a file in ``path``'s directory; it replaces ``path`` (mode 0644) when the block ends
    cleanly, and is removed otherwise. A reader never sees half a file."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, mode) as out:
            yield out
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
