"""Load mfusepy on libfuse3, with a message a user can act on when something is missing."""

from __future__ import annotations

import os
import shutil

from shardfs.errors import UsageError

# mfusepy prefers libfuse2 when both are installed; the compiled loop links libfuse3, and one
# process must not load both.
os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")


def load():
    try:
        import mfusepy
    except (OSError, ImportError) as exc:
        raise UsageError(f"libfuse3 is not usable ({exc}); install it: apt-get install fuse3 libfuse3-3") from None
    return mfusepy


def _user_allow_other(conf: str = "/etc/fuse.conf") -> bool:
    try:
        with open(conf) as f:
            return any(line.split("#", 1)[0].strip() == "user_allow_other" for line in f)
    except OSError:
        return False


def check_can_mount(allow_other: bool = False) -> None:
    """The prerequisites of a mount, checked before anything is started."""
    if not os.path.exists("/dev/fuse"):
        raise UsageError("/dev/fuse does not exist: load the fuse kernel module (modprobe fuse) or ask your admin")
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        raise UsageError("/dev/fuse is not accessible to this user: ask your admin to make it 0666")
    if shutil.which("fusermount3") is None:  # non-root mounts and auto_unmount go through it
        raise UsageError("fusermount3 is missing: install it (apt-get install fuse3)")
    if allow_other and os.getuid() != 0 and not _user_allow_other():
        raise UsageError("-o allow_other needs 'user_allow_other' in /etc/fuse.conf for non-root users: "
                         "ask your admin, or mount without it")
    load()
