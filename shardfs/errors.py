"""The one base class of every error shardfs raises on purpose, so users and the Python API
catch one thing (``except shardfs.ShardfsError``); subclasses live beside the code that raises them.

Exit statuses of the command line: 2 for what the user named wrong (usage, input, a path that
cannot be used), 1 for a command that ran and failed (a full disk, damaged shards)."""

from __future__ import annotations

import errno
import os


class ShardfsError(Exception):
    """Anything shardfs reports as a problem with its input, its storage or its use."""

    exit_code = 1


class UsageError(ShardfsError):
    """A problem the user can fix: the CLI prints the message (one line) and exits 2."""

    exit_code = 2


# What to do about a path the system refused, by errno; the storage itself failing (full, broken)
# is not the user's naming it wrong: exit status 1.
_ADVICE = {
    errno.EACCES: "ask its owner for access, or name another path",
    errno.EPERM: "ask its owner for access, or name another path",
    errno.ENOENT: "check the path (a folder on the way is missing)",
    errno.ENOTDIR: "check the path",
    errno.EISDIR: "name a file",
    errno.EROFS: "the filesystem is read-only: name a path on a writable one",
    errno.EEXIST: "remove it, or name another path",
    errno.ENAMETOOLONG: "name a shorter path",
    errno.ELOOP: "a symbolic link on the way points back to itself: check the path",
    errno.ENOSPC: "free some space there, or name another place",
    errno.EDQUOT: "free some of your quota there, or name another place",
}
_STORAGE_FAILED = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG)


class PathError(ShardfsError):
    """The system refused a path (permissions, missing, not a directory, read-only, full):
    one line naming the path, the reason and what to do."""

    def __init__(self, exc: OSError):
        path = exc.filename if exc.filename is not None else exc.filename2
        reason = exc.strerror or str(exc)
        advice = _ADVICE.get(exc.errno)
        super().__init__(f"{os.fsdecode(path) + ': ' if path is not None else ''}{reason}"
                         f"{': ' + advice if advice and path is not None else ''}")
        self.errno = exc.errno
        self.exit_code = 1 if exc.errno in _STORAGE_FAILED else 2


def one_line(exc: ShardfsError | OSError) -> ShardfsError:
    """What the command line prints (``shardfs: MESSAGE``) and exits with for an error that ends it."""
    return exc if isinstance(exc, ShardfsError) else PathError(exc)
