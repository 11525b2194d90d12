"""`shardfs run`: mount, run a command with the mount live, unmount, exit with the command's status.

The one-liner for batch job scripts. Signals sent to us (the batch system's SIGTERM
before a kill, a user's Ctrl-C) are passed on to the command; the mount goes away when
the command ends, whatever the reason.
"""

from __future__ import annotations

import os
import signal
import subprocess

from shardfs.service.api import mounted

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def run(sources: list[str], mountpoint: str | None, command: list[str], options: dict) -> int:
    with mounted(sources, mountpoint, **options) as root:
        env = {**os.environ, "SHARDFS_MOUNT": root}
        child = subprocess.Popen(command, env=env)
        previous = {sig: signal.signal(sig, lambda signum, _frame: child.send_signal(signum)) for sig in FORWARDED}
        try:
            code = child.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    # Like a shell: a command killed by signal N gives 128 + N.
    return 128 - code if code < 0 else code
