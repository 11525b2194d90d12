"""The node's libfuse3: found once, checked (3.3 or newer), bound by the compiled loop and loaded
by mfusepy from the same file; and the other prerequisites of a mount. Each missing piece is one
message a user can act on."""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import stat

from shardfs.errors import UsageError
from shardfs.fuse import _lowlevel, devfd

# A libfuse3.so.3 to use in place of the one the loader finds (a path); LD_LIBRARY_PATH works too.
LIBRARY_SETTING = "SHARDFS_LIBFUSE"
MIN_VERSION = (3, 3)  # RHEL/Rocky/Alma 8's fuse3-libs 3.3.0: the oldest a cluster runs
RUNTIME = ("install the fuse3 runtime (Debian/Ubuntu: apt-get install fuse3 libfuse3-3; "
           "RHEL/Rocky/Alma 8 and newer: dnf install fuse3 fuse3-libs)")
TOO_OLD = (f"the oldest that works is {MIN_VERSION[0]}.{MIN_VERSION[1]}.0 (RHEL/Rocky/Alma 8's fuse3-libs; Ubuntu 20.04 "
           f"has 3.9, Debian 11 3.10): install your distribution's fuse3 runtime, or point {LIBRARY_SETTING} at a "
           f"newer libfuse3.so.3")

# What the loop does without on an older library: (the release that brought it, what, its name).
LACKING = (
    ((3, 6), "reads of more than 128 KiB per request", "max_pages"),
    ((3, 10), "symlink targets cached by the kernel", "FUSE_CAP_CACHE_SYMLINKS"),
)


@dataclasses.dataclass(frozen=True)
class Libfuse:
    path: str
    version: str  # the package's, e.g. "3.10.3"
    loop_config: bool  # the thread-pool settings of 3.12 (fuse_loop_cfg_*: max_threads)
    number: tuple[int, int]  # (major, minor) of the release

    def describe(self, max_threads: int, max_idle_threads: int) -> str:
        """The library and what the loop does with it (for the daemon's log, once)."""
        if self.loop_config:
            line = f"libfuse {self.version} ({self.path}): up to {max_threads} threads"
        else:
            line = (f"libfuse {self.version} ({self.path}): without the thread cap of libfuse 3.12 "
                    f"(fuse_loop_cfg_set_max_threads), {max_idle_threads} idle threads are kept and more are "
                    f"started while all are busy")
        return line + "".join(f"; without {what} ({name}, libfuse {since[0]}.{since[1]})"
                              for since, what, name in LACKING if self.number < since)


def _version(number: int) -> tuple[int, int]:
    """The release libfuse_open found, major * 100 + minor (libfuse 2's fuse_version(): major * 10 + minor)."""
    return divmod(number, 100) if number >= 100 else divmod(number, 10)


# The names the loader is asked for: 3.17 changed the soname (its ABI is 3.10's again, after releases
# that had broken it) and keeps the symbol versions, so the loop binds it as it binds the others.
SONAMES = ("libfuse3.so.3", "libfuse3.so.4")


def _open_default() -> tuple[str, int]:
    """The first of SONAMES the loader finds; UsageError naming why the first one cannot be loaded."""
    first = None
    for name in SONAMES:
        try:
            return _lowlevel.libfuse_open(name)
        except OSError as exc:
            first = first or exc
    raise UsageError(f"libfuse3 cannot be loaded ({first}): {RUNTIME}") from None


@functools.cache
def libfuse() -> Libfuse:
    """Open and bind the node's libfuse3, once per process; UsageError when it is missing or too old."""
    chosen = os.environ.get(LIBRARY_SETTING)
    if chosen:
        try:
            path, number = _lowlevel.libfuse_open(chosen)
        except OSError as exc:
            raise UsageError(f"{LIBRARY_SETTING}={chosen} cannot be loaded ({exc}): point it at a libfuse3.so.3 "
                             f"or unset it") from None
    else:
        path, number = _open_default()
    path = os.path.realpath(path)
    if _version(number) < MIN_VERSION:
        found = ".".join(map(str, _version(number)))
        raise UsageError(f"{path} is libfuse {found}, too old for shardfs: {TOO_OLD}") from None
    try:
        version, loop_config = _lowlevel.libfuse_bind()
    except OSError as exc:
        raise UsageError(f"{path} is not a usable libfuse3 ({exc}): {RUNTIME}") from None
    # mfusepy (the operations' API) loads the library named here when imported: the same one
    os.environ["FUSE_LIBRARY_PATH"] = path
    return Libfuse(path, version, loop_config, _version(number))


def load():
    """mfusepy on the node's libfuse3."""
    libfuse()
    try:
        import mfusepy
    except (OSError, ImportError, AttributeError) as exc:
        raise UsageError(f"libfuse3 is not usable ({exc}): {RUNTIME}") from None
    return mfusepy


FUSERMOUNT = ("install the fuse3 package, whose fusermount3 is setuid root (Debian/Ubuntu: apt-get install fuse3; "
              "RHEL/Rocky/Alma: dnf install fuse3)")


def _no_new_privs() -> bool:
    """Set (by a container runtime, or systemd's NoNewPrivileges=): no setuid program gains root."""
    try:
        with open("/proc/self/status") as f:
            return any(line.split() == ["NoNewPrivs:", "1"] for line in f)
    except OSError:
        return False


def fusermount_problem() -> str | None:
    """Why fusermount3 cannot mount for this user, or None. Root needs none of it: libfuse mounts
    with mount(2) itself (only auto_unmount goes through fusermount3)."""
    if os.getuid() == 0:
        return None
    tool = shutil.which("fusermount3")
    if tool is None:
        return "fusermount3 is missing"
    st = os.stat(tool)
    if st.st_uid != 0 or not st.st_mode & stat.S_ISUID:
        return f"{tool} is not setuid root"
    if _no_new_privs():
        return f"{tool} cannot gain root here (no_new_privs is set, as containers often do)"
    return None


def _user_allow_other(conf: str = "/etc/fuse.conf") -> bool:
    try:
        with open(conf) as f:
            return any(line.split("#", 1)[0].strip() == "user_allow_other" for line in f)
    except OSError:
        return False


def check_device() -> None:
    """/dev/fuse, there and open to this user."""
    if not os.path.exists("/dev/fuse"):
        raise UsageError("/dev/fuse does not exist: load the fuse kernel module (modprobe fuse) or ask your admin")
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        raise UsageError("/dev/fuse is not accessible to this user: ask your admin to make it 0666")


def check_can_mount(allow_other: bool = False, mountpoint: str = "") -> None:
    """The prerequisites of a mount, checked before anything is started."""
    if devfd.descriptor(mountpoint) is not None:  # mounted already: nothing to open, nothing for fusermount3
        devfd.check(mountpoint)
        load()
        return
    check_device()
    problem = fusermount_problem()
    if problem:
        raise UsageError(f"{problem}: a mount by a user other than root needs it: {FUSERMOUNT} (`shardfs run` "
                         f"mounts without it where unprivileged user namespaces are allowed)")
    if allow_other and os.getuid() != 0 and not _user_allow_other():
        raise UsageError("-o allow_other needs 'user_allow_other' in /etc/fuse.conf for non-root users: "
                         "ask your admin, or mount without it")
    load()
