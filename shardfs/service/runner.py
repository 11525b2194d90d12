"""`shardfs run`: mount, run a command with the mount live, unmount, exit with the command's status.

The one-liner for batch job scripts. The command gets each signal once (signals.py): the
terminal's straight, the batch system's and anyone's sent to us passed on; the mount goes
away when the command ends, whatever the reason. A mountpoint that does not exist is created (with
its missing parents) and removed again afterwards, so a job script can name a fresh
per-job path and leave nothing behind. Where fusermount3 cannot mount for this user, the mount
and the command are in a user and mount namespace of their own (userns.py).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
from collections.abc import Iterator

from shardfs.errors import ShardfsError
from shardfs.service.api import mounted
from shardfs.service.signals import command_with_signals


class CommandNotStarted(ShardfsError):
    """COMMAND could not be started: status 127 when it is not found, 126 when it cannot be run, as
    shells, env, timeout, nohup and srun answer (job scripts test for them)."""

    def __init__(self, name: str, exc: OSError):
        missing = exc.errno == errno.ENOENT
        super().__init__(f"{name}: command not found" if missing else f"{name}: cannot run it: {exc.strerror}"
                         + (" (make it executable: chmod +x)" if exc.errno == errno.EACCES else ""))
        self.exit_code = 127 if missing else 126


@contextlib.contextmanager
def created_mountpoint(mountpoint: str | None) -> Iterator[None]:
    """Create ``mountpoint`` and its missing parents; rmdir the ones we made afterwards."""
    made: list[str] = []
    path = os.path.abspath(mountpoint) if mountpoint else None
    while path and not os.path.lexists(path):
        made.append(path)
        path = os.path.dirname(path)
    for folder in reversed(made):
        os.mkdir(folder)
    try:
        yield
    finally:
        for folder in made:  # deepest first; rmdir, never rmtree: never anything inside a mount
            with contextlib.suppress(OSError):
                os.rmdir(folder)


def _mounting(argv: list[str]):
    """shardfs.mounted, or where fusermount3 cannot mount for this user, its twin in a user namespace
    of our own (userns.py), entered by this command line started again (``argv``)."""
    from shardfs.fuse.lib import check_device, fusermount_problem
    from shardfs.service import userns

    problem = fusermount_problem()
    if problem is None:
        return mounted
    if not userns.entered():
        check_device()
        userns.restart(argv, problem)
    return functools.partial(userns.mounted, problem=problem)


def run(sources: list[str], mountpoint: str | None, command: list[str], options: dict, argv: list[str]) -> int:
    """argv: the ``shardfs`` command line that asked for this, to start again in a user namespace."""
    mounting = _mounting(argv)  # before anything is made: it may start this command line again
    with created_mountpoint(mountpoint), mounting(sources, mountpoint, **options) as root:
        try:
            with command_with_signals(command, {**os.environ, "SHARDFS_MOUNT": root}) as child:
                code = child.wait()
        except OSError as exc:  # it could not be started
            raise CommandNotStarted(command[0], exc) from None
    # Like a shell: a command killed by signal N gives 128 + N.
    return 128 - code if code < 0 else code
